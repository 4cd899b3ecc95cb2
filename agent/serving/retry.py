"""Retries after a failure: the failure history, the pending retry, and the crash-loop marker.

Owns what spans runs of the restart policy (agent/serving/policy.py decides): the failure window, the retry task
and when it is due, and crash-loop.json, so a crash loop outlives an agent restart (a new agent must not
autostart the same failure again). The run lifecycle asks `fail` and schedules; an operator's action resets.
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
from lynxtop.agent.serving.statefiles import Marker
from lynxtop.contract.config import AgentConfig

log = logging.getLogger(__name__)


class Retry:
    def __init__(self, agent: AgentConfig, crash_loop_path: Path, rng: random.Random | None = None):
        self.failures = FailureWindow(agent, rng)
        self.next_retry_ms: int | None = None
        self._task: asyncio.Task | None = None
        self._marker = Marker(crash_loop_path)

    def fail(self) -> float | None:
        """Count a failure: the delay before the retry, or None for a crash loop."""
        delay = self.failures.fail()
        self.next_retry_ms = None if delay is None else now_ms() + int(delay * 1000)
        return delay

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
        err = self._marker.save({"profile": profile, "reason": reason, "since_ms": now_ms()})
        if err is not None:
            log.warning("cannot record the crash loop in %s: %s", self._marker.path, err)

    def clear_crash_loop(self) -> None:
        self._marker.clear()

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
