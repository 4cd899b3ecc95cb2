"""Retries after a failure: the failure history, the pending retry, and the crash-loop marker.

Owns what spans runs of the restart policy (agent/serving/policy.py decides): the failure window, the retry task
and when it is due, and crash-loop.json, so a crash loop outlives an agent restart (a new agent must not
autostart the same failure again). readiness-timeouts.json beside it keeps the readiness timeouts in a row, so an
agent restarted while a retry loads (and adopts it) still gives up at the second timeout rather than count from
zero. The run lifecycle asks `fail` and schedules; an operator's action resets.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from lynxtop.agent.serving.backoff import FailureWindow
from lynxtop.agent.serving.run import now_ms
from lynxtop.agent.serving.statefiles import Emit, Marker
from lynxtop.contract.config import AgentConfig

log = logging.getLogger(__name__)


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
        self._restore_timeouts()

    def fail(self, profile: str | None = None, readiness_timeout: bool = False) -> float | None:
        """Count a failure of `profile` (`readiness_timeout`: not ready in time): the delay before the retry, or None
        for a crash loop."""
        if readiness_timeout and self._timeouts_profile not in (None, profile):
            self.failures.timeouts_in_a_row = 0  # another profile's timeouts say nothing about this one's load
        delay = self.failures.fail(readiness_timeout=readiness_timeout)
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

    def task_done(self) -> None:
        """The retry's wait is over: it is being carried out."""
        self._task = None

    def started(self) -> None:
        """A run started (or none will): no retry is pending any more."""
        self._task = None
        self.next_retry_ms = None

    def cancel(self) -> None:
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
        self.started()

    def save_crash_loop(self, profile: str, reason: str) -> None:
        err = self._marker.save({"profile": profile, "reason": reason, "since_ms": now_ms()},
                                lost=f"a restarted agent will not know of this crash loop of profile {profile} "
                                "and may start it again (autostart) instead of holding it")
        if err is not None and not self._told:
            log.warning("cannot record the crash loop in %s: %s", self._marker.path, err)

    def clear_crash_loop(self) -> None:
        """An operator acted: the crash loop, and the readiness timeouts counted toward one, are acknowledged."""
        self._marker.clear()
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
