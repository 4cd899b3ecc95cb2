"""An operator's stop on disk (stopped.json beside the database): what of `lynxtop stop` outlives the agent.

Two ways a model that takes 20 minutes to load came back without anyone asking rest on it:
- a stop under way: the note (the run, since when, its grace) is written before the SIGTERM, so an agent that dies
  while vLLM drains (the OOM killer, kill -9, a watchdog abort) is followed by one that finishes the stop (the rest
  of the grace, then SIGKILL, the GPUs' release, the run closed as stopped) instead of adopting the draining
  server, seeing its exit as a crash nobody asked for and loading the model again;
- a stop done: the note stays once the run has ended, with the boot id, so a restarted agent (an upgrade, the
  watchdog, the OOM killer) holds its autostart. An operator's start, restart or switch removes it; a reboot
  (another boot id) ends it too, and the node's config (`autostart`) applies again.

`StopNote` owns stopped.json (through statefiles.Marker); `StopKeeper` does, for the supervisor, what the note
asks at agent start. A note that is not as an agent writes it is reported, removed and ignored, never fatal.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lynxtop.agent.serving.actions import ActionSlot, clock
from lynxtop.agent.serving.run import now_ms
from lynxtop.agent.serving.statefiles import Marker
from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.contract.status import ServingState as S  # noqa: N817 - read as a state name: S.STOPPED

if TYPE_CHECKING:
    from lynxtop.agent.events import EventSink
    from lynxtop.agent.serving.adoption import Adopted
    from lynxtop.agent.serving.lifecycle import RunLifecycle

log = logging.getLogger(__name__)

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")  # new at every boot of the kernel
LAST_MS = 253_402_300_799_999  # 9999-12-31
STOPPED_BY_OPERATOR = "stopped_by_operator"  # agent.autostart_held's details.reason
# A stop finished for a previous agent: what its orphans (the engine a drained API server left) or a server still
# there after the stop's whole grace get after their SIGTERM, before SIGKILL.
FINISH_GRACE_S = 5.0


def boot_ms() -> int:
    """Milliseconds since this boot (CLOCK_BOOTTIME): never stepped by a wall-clock change, counts a suspend, and
    is the same clock for every agent of the boot, so a drain's grace survives the agent that began it."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 1_000_000


def boot_id() -> str | None:
    """This boot's id, or None when the kernel does not say (then a stop is held as if of this boot)."""
    try:
        text = BOOT_ID.read_text().strip()
    except OSError:
        return None
    return text or None


@dataclass(frozen=True)
class OperatorStop:
    """A stop an operator asked for. `stopping`: under way, `run` not yet ended; else done."""

    by: str
    since_ms: int
    boot: str | None
    run: int | None = None
    grace_s: float | None = None
    stopping: bool = False
    boot_ms: int | None = None  # boot_ms() when asked: the grace's count (since_ms is for people)

    @classmethod
    def from_note(cls, data: dict[str, Any]) -> OperatorStop:
        """The note as `StopNote` writes it, else ValueError naming the field."""
        by, since, boot = data.get("by"), data.get("since_ms"), data.get("boot_id")
        run, grace, stopping = data.get("run"), data.get("grace_s"), data.get("stopping", False)
        at_boot_ms = data.get("boot_ms")
        if not isinstance(by, str) or not by:
            raise ValueError('"by" is missing or not a string')
        if type(since) is not int or not 0 <= since <= LAST_MS:
            raise ValueError('"since_ms" is not a time (an integer of milliseconds)')
        if boot is not None and not isinstance(boot, str):
            raise ValueError('"boot_id" is not a string')
        if run is not None and (type(run) is not int or run < 0):
            raise ValueError('"run" is not a run id')
        if grace is not None and (type(grace) not in (int, float) or not math.isfinite(grace) or grace < 0):
            raise ValueError('"grace_s" is not a number of seconds')
        if type(stopping) is not bool:
            raise ValueError('"stopping" is not true or false')
        if at_boot_ms is not None and (type(at_boot_ms) is not int or not 0 <= at_boot_ms <= LAST_MS):
            raise ValueError('"boot_ms" is not a time since boot (an integer of milliseconds)')
        return cls(by[:200], since, boot, run, float(grace) if grace is not None else None, stopping, at_boot_ms)

    def this_boot(self) -> bool:
        """Whether the stop was asked during this boot (either id unknown: held, the side that loads nothing)."""
        now = boot_id()
        return self.boot is None or now is None or self.boot == now

    def grace_left_s(self) -> float:
        """What is left of the stop's grace (vLLM's drain), counted from when it was asked: by the boot clock, which
        a wall-clock step cannot move (a clock stepped forward cut the drain short); by the wall clock only for a
        note without it (an older agent's) or of another boot."""
        if self.grace_s is None:
            return 0.0
        if self.boot_ms is not None and self.boot is not None and self.boot == boot_id():
            elapsed_ms = boot_ms() - self.boot_ms
        else:
            elapsed_ms = now_ms() - self.since_ms
        return max(0.0, self.grace_s - max(0, elapsed_ms) / 1000)


class StopNote:
    def __init__(self, path: Path, event: Callable[..., Any]):
        self._marker = Marker(path)
        self._event = event  # the lifecycle's event call
        self._unsaved = False  # the last write failed: one event per episode
        self._current: OperatorStop | None = None  # the stop this agent wrote last

    @property
    def path(self) -> Path:
        return self._marker.path

    def stopping(self, by: str, run: int | None, grace_s: float | None) -> None:
        """Before the SIGTERM: a stop of `run` (None: no run to stop) is under way."""
        self._save(OperatorStop(by, now_ms(), boot_id(), run, grace_s, stopping=run is not None,
                                boot_ms=boot_ms()))

    def stopped(self, stop: OperatorStop | None = None) -> None:
        """The stop is done (its run ended): kept to hold autostart at the next agent start of this boot."""
        stop = stop or self._current
        if stop is None:
            return
        self._save(dataclasses.replace(stop, stopping=False))

    def clear(self) -> None:
        """An operator started, restarted or switched: serving is wanted again."""
        self._current = None
        self._marker.clear()

    def read(self) -> OperatorStop | None:
        """The stop the previous agent recorded; an unreadable note is said, removed and ignored."""
        data, err = self._marker.read()
        if data is not None and err is None:
            try:
                return OperatorStop.from_note(data)
            except ValueError as exc:
                err = str(exc)
        if err is not None:
            self._event(EventKind.AGENT_STATE_FILE, Severity.WARNING, f"ignoring unreadable {self.path}: {err}; an "
                        "operator's stop (if any) is not known: autostart is not held by it")
            self._marker.clear()
        return None

    def _save(self, stop: OperatorStop) -> None:
        self._current = stop
        err = self._marker.save({"by": stop.by, "since_ms": stop.since_ms, "boot_id": stop.boot, "run": stop.run,
                                 "grace_s": stop.grace_s, "stopping": stop.stopping, "boot_ms": stop.boot_ms})
        if err is None:
            self._unsaved = False
            return
        if not self._unsaved:
            self._event(EventKind.AGENT_STATE_FILE, Severity.WARNING, f"cannot write {self.path}: {err}; if the "
                        "agent restarts now, it does not know serving was stopped by an operator (a stop under way "
                        "is not finished, autostart is not held)")
        self._unsaved = True


class StopKeeper:
    """The operator's stop across agent restarts, for the supervisor: the note (`note`) written when a stop begins
    and ends and removed when serving is wanted again; at agent start, the stop the previous agent did not finish
    (finished here, as an action "stop" of the agent's own) or the stop that holds autostart (held, and said)."""

    def __init__(self, path: Path, runs: RunLifecycle, slot: ActionSlot, sink: EventSink):
        self.note = StopNote(path, runs.event)
        self._runs = runs
        self._slot = slot
        self._sink = sink
        self.autostart: str | None = None  # the profile the agent was to autostart (said in the reason)

    def at_start(self) -> OperatorStop | None:
        """The stop recorded by the previous agent; one of an earlier boot is removed (returned all the same: its
        run, if recorded, ended as stopped)."""
        stop = self.note.read()
        if stop is not None and not stop.this_boot():
            log.info("%s: the stop by %s was before the last reboot; autostart applies again", self.note.path,
                     stop.by)
            self.note.clear()
        return stop

    def take_over(self, found: Adopted, stop: OperatorStop) -> None:
        """The server of `stop`, found alive: made current, not watched, and stopped by an action of its own."""
        record = found.record
        by, asked = f"agent (finishing the stop asked by {stop.by})", f"asked by {stop.by} at {clock(stop.since_ms)}"
        self._runs.adopt(found, stopping=f"finishing the stop of run {record.run_id} {asked} (the previous agent "
                                         "ended during it)")
        self._slot.begin("stop", by, record.profile)
        self._runs.event(EventKind.ACTION_STOP, Severity.WARNING, f"run {record.run_id} (pid {record.pid}): the stop "
                         f"{asked} was under way when the previous agent ended; finishing it ({stop.grace_left_s():.0f}"
                         " s of its grace left, then SIGKILL) rather than adopting the server", by=by, resumed=True,
                         pid=record.pid)
        self._slot.run(self._finish(stop))

    async def _finish(self, stop: OperatorStop) -> None:
        """vLLM, SIGTERMed by the previous agent, drains for the rest of the grace; then the stop as any (SIGTERM to
        what is left, FINISH_GRACE_S, SIGKILL, the GPUs' release), and the run ends as the operator's stop."""
        runs, left_s = self._runs, stop.grace_left_s()
        run = runs.run
        if run is not None and not run.proc.exited and left_s > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(run.proc.wait(), left_s)
        await runs.stop_current(f"finishing the stop asked by {stop.by} at {clock(stop.since_ms)} (the previous "
                                "agent ended during it)", "stopped by operator", grace_s=FINISH_GRACE_S)
        self.note.stopped(stop)
        runs.set_state(S.STOPPED, self.reason(stop))
        runs.event(EventKind.SERVING_STOPPED, Severity.INFO, f"serving stopped (stopped by {stop.by}; the stop was "
                   "finished by this agent after the previous one ended during it)", with_log=True)

    def reason(self, stop: OperatorStop) -> str:
        held = (f"; autostart of {self.autostart} held until an operator starts serving (lynxtop start / restart / "
                "switch) or the node reboots") if self.autostart else ""
        return f"stopped by {stop.by} at {clock(stop.since_ms)}{held}"

    def hold(self, stop: OperatorStop) -> None:
        """At agent start: serving an operator stopped during this boot stays stopped, and says why."""
        runs = self._runs
        if runs.state == S.STOPPED:
            if stop.stopping:
                self.note.stopped(stop)  # its run ended while no agent ran (found gone, closed as stopped)
            runs.set_state(S.STOPPED, self.reason(stop))
        if self.autostart:
            self._sink.put(Event(EventKind.AGENT_AUTOSTART_HELD, Severity.WARNING,
                                 f"autostart of {self.autostart} held: serving was stopped by {stop.by} at "
                                 f"{clock(stop.since_ms)} and stays stopped across agent restarts until an operator "
                                 "starts it (lynxtop start / restart / switch) or the node reboots",
                                 details={"reason": STOPPED_BY_OPERATOR, "by": stop.by, "since_ms": stop.since_ms}))
