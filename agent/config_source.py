"""The agent's config, re-read in one place.

Owns the current `Config`. The [agent] settings (socket, database, policy) take effect on an agent restart; the
profiles and models are re-read from the file: for an action (`reload`, where a file with errors refuses the
action) and for the profile list (`poll`, when the file's mtime changed; errors keep the previous profiles).
Everyone else asks `current` and never assigns a config of their own.
"""

from __future__ import annotations

import dataclasses
import logging

from lynxtop.contract.config import Config, load_config

log = logging.getLogger(__name__)


class ConfigSource:
    def __init__(self, cfg: Config):
        self._cfg = cfg
        self._mtime: float | None = None

    @property
    def current(self) -> Config:
        return self._cfg

    def reload(self) -> Config:
        """The profiles and models as the file says now (raises `ConfigError`: the caller refuses its action)."""
        if self._cfg.path is not None:
            fresh = load_config(str(self._cfg.path), secrets=True)  # the env_file and credentials as now
            # and the file's secret-exposure warnings as they are now (a SIGHUP reload says them: agent/reload.py)
            self._cfg = dataclasses.replace(self._cfg, profiles=fresh.profiles, models=fresh.models,
                                            warnings=fresh.warnings)
        return self._cfg

    def poll(self) -> Config:
        """The profiles re-read when the file changed since the last poll, so a new one shows without a restart;
        a file with errors keeps the previous profiles (said in the log)."""
        from lynxtop.contract.config import ConfigError

        path = self._cfg.path
        if path is None:
            return self._cfg
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return self._cfg
        if self._mtime is None:
            self._mtime = mtime
        elif mtime != self._mtime:
            self._mtime = mtime
            try:
                self._cfg = dataclasses.replace(self._cfg, profiles=load_config(str(path), secrets=True).profiles)
            except ConfigError as exc:
                log.warning("config %s changed but has errors; keeping the previous profiles: %s", path,
                            "; ".join(exc.problems))
        return self._cfg
