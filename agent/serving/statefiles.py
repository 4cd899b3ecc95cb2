"""The supervisor's files beside the database, each owned by one class here.

- `ServerState` (serving.json): the running server's record, written before anything awaits so a killed agent's
  successor finds the server (adoption, agent/serving/adoption.py). A failed write is one event per episode and
  is retried while the run lives.
- `Marker` (crash-loop.json, readiness-timeouts.json, switch.json): a small JSON note that outlives the agent: a
  crash loop not to be autostarted again, a switch's target to finish after the agent died mid-switch. Read
  through agent/serving/safefile.py: never through a symlink, never blocking on a FIFO, numbers finite.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lynxtop.agent.serving import launcher, safefile
from lynxtop.contract.events import EventKind, Severity
from lynxtop.contract.files import atomic_write

log = logging.getLogger(__name__)

Emit = Callable[..., Any]  # the run lifecycle's event(kind, severity, message, **details): state and run added


class ServerState:
    def __init__(self, path: Path, emit: Emit):
        self.path = path
        self._emit = emit
        self._unsaved = False  # the last write failed: retried by `resave` while the run lives

    def save(self, record: launcher.ServerRecord) -> None:
        try:
            launcher.write_record(self.path, record)
        except OSError as exc:
            if not self._unsaved:  # retried until written (a full disk): one event per episode
                self._emit(EventKind.AGENT_STATE_FILE, Severity.WARNING, f"cannot write {self.path}: {exc}; a "
                           "restarted agent will not be able to adopt this run; retrying until it is written")
            self._unsaved = True
            return
        if self._unsaved:
            self._unsaved = False
            self._emit(EventKind.AGENT_STATE_FILE, Severity.INFO, f"{self.path} written again: a restarted agent "
                       "can adopt this run")

    def resave(self, record: launcher.ServerRecord) -> None:
        """The state file a failed write left stale or missing, written again once the disk takes it."""
        if self._unsaved:
            self.save(record)

    def read(self) -> tuple[launcher.ServerRecord | None, str | None]:
        return launcher.read_record(self.path)

    def remove(self) -> None:
        launcher.remove_record(self.path)


class Marker:
    """A JSON note at `path`: written atomically, read back as a dict, removed when its episode ends."""

    def __init__(self, path: Path):
        self.path = path

    def save(self, data: dict[str, Any]) -> OSError | None:
        try:
            atomic_write(self.path, json.dumps(data))
        except OSError as exc:
            return exc
        return None

    def read(self) -> tuple[dict[str, Any] | None, str | None]:
        """(the note, None), (None, None) when there is none, (None, why) when it cannot be read or is not JSON
        as an agent writes it. At agent start this runs on the event loop: it never blocks (safefile)."""
        try:
            data = safefile.read_json(self.path)
        except FileNotFoundError:
            return None, None
        except safefile.StateFileError as exc:
            return None, f"it {exc.reason}"  # the caller names the path
        except (OSError, ValueError) as exc:
            return None, str(exc)
        if not isinstance(data, dict):
            return None, "not a JSON object"
        return data, None

    def clear(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()
