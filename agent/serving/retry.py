"""Retries after a failure: the failure history, the pending retry, and the crash-loop marker.

Owns what spans runs of the restart policy (agent/serving/policy.py decides): the failure window, the retry task
and when it is due, and crash-loop.json, so a crash loop outlives an agent restart (a new agent must not
autostart the same failure again). readiness-timeouts.json beside it keeps the readiness timeouts in a row, so an
agent restarted while a retry loads (and adopts it) still gives up at the second timeout rather than count from
zero. backoff.json beside them keeps a pending retry (the failures in the window, on the boot clock, and when the
retry is due), so an agent killed during the backoff (the OOM killer, the watchdog) is followed by one that carries
the retry out and counts those failures toward the crash-loop limit, rather than show "stopped" for good or
autostart with the count at zero. Like the stop note it holds for this boot only. The run lifecycle asks `fail` and
schedules; an operator's action resets.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lynxtop.agent.serving.backoff import FailureWindow
from lynxtop.agent.serving.run import now_ms
from lynxtop.agent.serving.statefiles import Emit, Marker
from lynxtop.agent.serving.stopnote import boot_id, boot_ms
from lynxtop.contract.config import AgentConfig

log = logging.getLogger(__name__)


BACKOFF_FILE = "backoff.json"


@dataclass(frozen=True)
class PendingRetry:
    """A retry the previous agent scheduled and did not carry out (backoff.json)."""

    profile: str
    run_id: int | None
    reason: str  # the backoff's reason as the state said it
    readiness_timeout: bool  # the failure was a readiness timeout (the retry's cause)
    failures_boot_ms: tuple[int, ...]  # the failures in the crash-loop window, on the boot clock
    consecutive: int
    timeouts_in_a_row: int
    due_boot_ms: int

    @classmethod
    def of(cls, data: dict[str, Any]) -> PendingRetry:
        """The note as an agent writes it; ValueError (saying what) for anything else."""
        def integer(key: str, null: bool = False) -> Any:
            v = data.get(key)
            if v is None and null:
                return None
            if type(v) is not int or v < 0:
                raise ValueError(f'"{key}" is not a non-negative integer')
            return v

        profile, reason, times = data.get("profile"), data.get("reason", ""), data.get("failures_boot_ms")
        if not isinstance(profile, str) or not profile or not isinstance(reason, str):
            raise ValueError('"profile" or "reason" is not a string')
        if not isinstance(times, list) or len(times) > 1000 or any(type(t) is not int or t < 0 for t in times):
            raise ValueError('"failures_boot_ms" is not a list of times since boot')
        return cls(profile[:200], integer("run_id", null=True), reason[:2000], data.get("readiness_timeout") is True,
                   tuple(times), integer("consecutive"), integer("timeouts_in_a_row"), integer("due_boot_ms"))

    def delay_s(self) -> float:
        """Seconds until the retry is due (0: overdue, the agent was down longer than the backoff)."""
        return max(0.0, (self.due_boot_ms - boot_ms()) / 1000)


class Retry:
    def __init__(self, agent: AgentConfig, crash_loop_path: Path, rng: random.Random | None = None,
                 event: Emit | None = None):
        """`event`: the run lifecycle's; a marker that cannot be written is then an event once per episode (the
        operator must know the protection will not outlive an agent restart), else a log line each time."""
        self.failures = FailureWindow(agent, rng)
        self.next_retry_ms: int | None = None
        self._task: asyncio.Task | None = None
        self._told = event is not None
        self._marker = Marker(crash_loop_path, event)
        self._timeouts = Marker(crash_loop_path.with_name("readiness-timeouts.json"), event)
        self._timeouts_profile: str | None = None  # whose readiness timeouts `failures.timeouts_in_a_row` counts
        self._pending = Marker(crash_loop_path.with_name(BACKOFF_FILE), event)  # the retry scheduled (backoff.json)
        self._failed: tuple[str | None, bool] = (None, False)  # the latest failure's profile, and if a timeout
        # (run id, the state's reason) as the run lifecycle says them now: the supervisor wires it
        self.describe: Callable[[], tuple[int | None, str]] = lambda: (None, "")
        self._restore_timeouts()

    def fail(self, profile: str | None = None, readiness_timeout: bool = False) -> float | None:
        """Count a failure of `profile` (`readiness_timeout`: not ready in time): the delay before the retry, or None
        for a crash loop."""
        if readiness_timeout and self._timeouts_profile not in (None, profile):
            self.failures.timeouts_in_a_row = 0  # another profile's timeouts say nothing about this one's load
        delay = self.failures.fail(readiness_timeout=readiness_timeout)
        self._failed = (profile, readiness_timeout)
        if readiness_timeout:
            self._timeouts_profile = profile
            err = self._timeouts.save({"profile": profile, "in_a_row": self.failures.timeouts_in_a_row,
                                       "since_ms": now_ms()},
                                      lost=f"a restarted agent will count the readiness timeouts of profile "
                                      f"{profile} from zero (one more load before it gives up)")
            if err is not None and not self._told:
                log.warning("cannot record the readiness timeouts in %s: %s", self._timeouts.path, err)
        self.next_retry_ms = None if delay is None else now_ms() + int(delay * 1000)
        return delay

    @property
    def gave_up_on_timeouts(self) -> bool:
        """The latest failure gave up because of readiness timeouts in a row (not the crash-loop window)."""
        last = self.failures.last
        return last is not None and last.readiness_timeouts

    def ready(self) -> None:
        """A run became ready: its profile loads within its timeout, earlier timeouts are no longer in a row."""
        if self.failures.timeouts_in_a_row or self._timeouts_profile is not None:
            self.failures.ready()
            self._timeouts_profile = None
            self._timeouts.clear()

    def _restore_timeouts(self) -> None:
        """At agent start: the readiness timeouts in a row the previous agent counted (an adopted load goes on)."""
        data, err = self._timeouts.read()
        if err is not None:
            log.warning("ignoring unreadable %s: %s", self._timeouts.path, err)
        if data is None:
            return
        count, profile = data.get("in_a_row"), data.get("profile")
        if isinstance(count, int) and not isinstance(count, bool) and count > 0 and isinstance(profile, str):
            self.failures.timeouts_in_a_row = count
            self._timeouts_profile = profile

    def schedule(self, delay: float, due: Callable[[], Coroutine[Any, Any, None]]) -> None:
        async def later() -> None:
            await asyncio.sleep(delay)
            await due()

        self._task = asyncio.get_running_loop().create_task(later(), name="retry")
        self._save_pending(delay)

    def _save_pending(self, delay: float) -> None:
        """backoff.json for the retry just scheduled (not for a profile-less failure: nothing to start again)."""
        profile, timeout = self._failed
        if profile is None:
            return
        run_id, reason = self.describe()
        now_boot, now_mono = boot_ms(), time.monotonic()
        err = self._pending.save({
            "profile": profile, "run_id": run_id, "reason": reason, "readiness_timeout": timeout,
            "failures_boot_ms": [max(0, now_boot - int((now_mono - t) * 1000)) for t in self.failures.times],
            "consecutive": self.failures.consecutive, "timeouts_in_a_row": self.failures.timeouts_in_a_row,
            "due_boot_ms": now_boot + int(delay * 1000), "boot_id": boot_id(), "since_ms": now_ms()},
            lost=f"a restarted agent will not retry profile {profile} and will count its failures from zero")
        if err is not None and not self._told:
            log.warning("cannot record the pending retry in %s: %s", self._pending.path, err)

    def recorded_retry(self) -> PendingRetry | None:
        """The retry the previous agent scheduled in this boot and did not carry out (the note is removed here:
        the caller schedules it again, which writes it anew). Another boot's, or an unreadable one: None."""
        data, err = self._pending.read()
        self._pending.clear()
        if err is not None:
            log.warning("ignoring unreadable %s: %s", self._pending.path, err)
        if data is None:
            return None
        boot, mine = data.get("boot_id"), boot_id()
        if boot is not None and mine is not None and boot != mine:
            log.info("%s: the retry was scheduled before the last reboot; not carried out", self._pending.path)
            return None
        try:
            return PendingRetry.of(data)
        except ValueError as exc:
            log.warning("ignoring unreadable %s: %s", self._pending.path, exc)
            return None

    def resume(self, pending: PendingRetry) -> None:
        """Count the previous agent's failures as this agent's (the crash-loop limit holds across the restart)."""
        now_boot, now_mono = boot_ms(), time.monotonic()
        self.failures.times = deque(now_mono - (now_boot - t) / 1000 for t in sorted(pending.failures_boot_ms))
        self.failures.consecutive = pending.consecutive
        self.failures.timeouts_in_a_row = max(self.failures.timeouts_in_a_row, pending.timeouts_in_a_row)
        self._failed = (pending.profile, pending.readiness_timeout)
        self.next_retry_ms = now_ms() + int(pending.delay_s() * 1000)

    def task_done(self) -> None:
        """The retry's wait is over: it is being carried out (its note stays until it launches or is dropped: an
        agent killed while it waits for the GPUs or the disk leaves it to the next one)."""
        self._task = None

    def started(self) -> None:
        """A run started (or none will): no retry is pending any more."""
        self._task = None
        self.next_retry_ms = None
        self._pending.clear()

    def cancel(self, keep_note: bool = False) -> None:
        """No retry from now on; `keep_note`: the agent exits with the retry pending, for the next agent to resume."""
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
        if keep_note:
            self._task, self.next_retry_ms = None, None
        else:
            self.started()

    def save_crash_loop(self, profile: str, reason: str) -> None:
        self._pending.clear()  # no retry follows a crash loop
        err = self._marker.save({"profile": profile, "reason": reason, "since_ms": now_ms()},
                                lost=f"a restarted agent will not know of this crash loop of profile {profile} "
                                "and may start it again (autostart) instead of holding it")
        if err is not None and not self._told:
            log.warning("cannot record the crash loop in %s: %s", self._marker.path, err)

    def clear_crash_loop(self) -> None:
        """An operator acted: the crash loop, and the readiness timeouts counted toward one, are acknowledged."""
        self._marker.clear()
        self._pending.clear()
        self._timeouts.clear()
        self._timeouts_profile = None
        self.failures.timeouts_in_a_row = 0

    def recorded_crash_loop(self) -> tuple[str, str] | None:
        """(profile, reason) of the crash loop the previous agent recorded, if any."""
        data, err = self._marker.read()
        if err is not None:
            log.warning("ignoring unreadable %s: %s", self._marker.path, err)
            return None
        if data is None:
            return None
        try:
            return str(data["profile"]), str(data["reason"])
        except KeyError as exc:
            log.warning("ignoring unreadable %s: %s", self._marker.path, exc)
            return None
