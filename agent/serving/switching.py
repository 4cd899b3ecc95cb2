"""The action intent: a switch's or a restart's target on disk (switch.json) from before the old run is stopped
until the action ends, so an agent killed or restarted mid-action is followed by one that finishes it instead of
adopting nothing and leaving the node stopped or autostarting the default (it once lost switches, then restarts,
that way).

Owns switch.json only; the supervisor carries the action out (stop, launch, readiness) and says when it ended.
A note without "action" (an older agent's) is a switch. Every field of a note is checked before it is used (a
`"since_ms": 1e999` once made every agent start exit with a traceback, leaving the model unsupervised): a note
that is not as an agent writes it is reported, removed and ignored, never fatal.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lynxtop.agent.serving.actions import clock
from lynxtop.agent.serving.run import now_ms
from lynxtop.agent.serving.statefiles import Marker
from lynxtop.contract.events import EventKind, Severity

log = logging.getLogger(__name__)

ACTIONS = ("switch", "restart")
LAST_MS = 253_402_300_799_999  # 9999-12-31: a later time has no date to print (clock() raises)


def _show(value: Any) -> str:
    """A field's value for a message: a hand-edited note may hold a megabyte in one field."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _str(data: dict[str, Any], key: str, default: str | None) -> str | None:
    """data[key], a string; `default` when it is absent or null; anything else is refused."""
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise ValueError(f'"{key}" is {_show(value)}, not a string')
    return value


def _int(data: dict[str, Any], key: str, high: int) -> int | None:
    """data[key] as an int in [0, high], None when absent or null; a bool, float or string is refused."""
    value = data.get(key)
    if value is None:
        return None
    if type(value) is not int or not 0 <= value <= high:
        raise ValueError(f'"{key}" is {_show(value)}, not an integer from 0 to {high}')
    return value


@dataclass(frozen=True)
class Interrupted:
    """A switch or restart the previous agent began and did not end. `run`: the run it was replacing."""

    target: str
    old: str | None
    by: str
    since_ms: int
    action: str = "switch"
    run: int | None = None

    @classmethod
    def from_note(cls, data: dict[str, Any]) -> Interrupted:
        """The note as an agent writes it (ActionIntent.save), else ValueError saying which field is wrong."""
        action = _str(data, "action", "switch") or "switch"
        if action not in ACTIONS:
            raise ValueError(f'"action" is {_show(action)}, not one of {", ".join(ACTIONS)}')
        target = _str(data, "profile", None)
        if not target:
            raise ValueError('"profile" (the profile to finish it with) is missing or empty')
        since = _int(data, "since_ms", LAST_MS)
        return cls(target=target, old=_str(data, "from", None), by=_str(data, "by", "?") or "?",
                   since_ms=since or now_ms(), action=action, run=_int(data, "run", 2**63 - 1))

    def describe(self) -> str:
        what = (f"the restart of {self.target}" if self.action == "restart"
                else f"the switch from {self.old or '(nothing)'} to {self.target}")
        return f"{what} asked by {self.by} at {clock(self.since_ms)}"

    def new_run_started(self, profile: str | None, run_id: int | None, alive: bool) -> bool:
        """The run now current (adopted) is the action's new run: the action got that far, only readiness is left.
        A switch to another profile: its profile says so. A restart (or a switch to the same profile): its old run
        has the target profile too, so only a run id other than the replaced run's does."""
        if not alive or profile != self.target:
            return False
        if self.old != self.target or self.run is None:
            return True
        return run_id is not None and run_id != self.run


class ActionIntent:
    def __init__(self, path: Path, event: Callable[..., Any]):
        self._marker = Marker(path)
        self._event = event  # the lifecycle's event call

    def save(self, action: str, profile: str, old: str | None, by: str, run: int | None) -> None:
        """Before anything is stopped: `profile` is what the action starts, `run` the run it replaces."""
        err = self._marker.save({"action": action, "profile": profile, "from": old, "run": run, "by": by,
                                 "since_ms": now_ms()})
        if err is not None:
            self._event(EventKind.AGENT_STATE_FILE, Severity.WARNING, f"cannot write {self._marker.path}: {err}; "
                        f"if the agent dies during this {action}, a restarted agent will not finish it")

    def clear(self) -> None:
        self._marker.clear()

    async def carried(self, steps: Coroutine[Any, Any, Any]) -> None:
        """The switch or restart `steps` awaited; the intent ends with them whatever the outcome, except when they
        are cancelled: a stop preempting the action drops the intent itself, the agent's end leaves it for the
        next agent to finish."""
        try:
            await steps
        except asyncio.CancelledError:
            raise
        except BaseException:
            self.clear()
            raise
        self.clear()

    def interrupted(self) -> Interrupted | None:
        """The action left by the previous agent; a note that cannot be read or is not as an agent writes it is
        said, removed and ignored: at agent start, where an exception would end the agent at every start."""
        data, err = self._marker.read()
        if data is not None and err is None:
            try:
                left = Interrupted.from_note(data)
                left.describe()  # what the take-over prints: it must not fail there
                return left
            except ValueError as exc:
                err = str(exc)
            except Exception as exc:  # noqa: BLE001 - a bug here must not stop every agent start
                log.exception("reading %s", self._marker.path)
                err = f"{type(exc).__name__}: {exc}"
        if err is not None:
            self._event(EventKind.AGENT_STATE_FILE, Severity.WARNING, f"ignoring unreadable {self._marker.path}: "
                        f"{err}; an interrupted switch or restart (if any) is not finished")
            self.clear()
        return None
