"""The switch intent: a switch's target on disk (switch.json) from before the old run is stopped until the switch
ends, so an agent killed mid-switch is followed by one that finishes it instead of adopting nothing and
autostarting the default (it once lost the switch that way).

Owns switch.json only; the supervisor carries the switch out (stop, launch, readiness) and says when it ended.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lynxtop.agent.serving.run import now_ms
from lynxtop.agent.serving.statefiles import Marker
from lynxtop.contract.events import EventKind, Severity


@dataclass(frozen=True)
class Interrupted:
    """A switch the previous agent began and did not end."""

    target: str
    old: str | None
    by: str
    since_ms: int


class SwitchIntent:
    def __init__(self, path: Path, event: Callable[..., Any]):
        self._marker = Marker(path)
        self._event = event  # the lifecycle's event call

    def save(self, profile: str, old: str | None, by: str) -> None:
        err = self._marker.save({"profile": profile, "from": old, "by": by, "since_ms": now_ms()})
        if err is not None:
            self._event(EventKind.AGENT_STATE_FILE, Severity.WARNING, f"cannot write {self._marker.path}: {err}; "
                        "if the agent dies during this switch, a restarted agent will not finish it")

    def clear(self) -> None:
        self._marker.clear()

    def interrupted(self) -> Interrupted | None:
        """The switch left by the previous agent; an unreadable note is said, removed and ignored."""
        data, err = self._marker.read()
        if data is not None and err is None:
            try:
                return Interrupted(str(data["profile"]), data.get("from"), str(data.get("by", "?")),
                                   int(data.get("since_ms") or now_ms()))
            except (KeyError, TypeError, ValueError) as exc:
                err = str(exc)
        if err is not None:
            self._event(EventKind.AGENT_STATE_FILE, Severity.WARNING, f"ignoring unreadable {self._marker.path}: "
                        f"{err}; an interrupted switch (if any) is not finished")
            self.clear()
        return None
