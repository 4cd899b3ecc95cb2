"""The operator action slot: one action at a time (start, stop, restart, switch, or the agent's own retry).

Owns the action in progress, its task, and whether it may be preempted: a stop may preempt an action that is only
waiting (for readiness, or for a Ray cluster), everything else makes a second action fail with a 409 "busy" that
says what runs, since when, and by when it ends at the latest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Iterator
from datetime import UTC, datetime
from typing import Any

from lynxtop.agent.api.control import ActionError
from lynxtop.agent.serving.run import now_ms
from lynxtop.contract.status import ActionInfo

log = logging.getLogger(__name__)

Expected = Callable[[str, str | None], tuple[float, str]]  # (action, profile) -> (longest seconds, in words)


def clock(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M:%S UTC")


class ActionSlot:
    def __init__(self, expected: Expected, on_failed: Callable[[str | None, Exception], None],
                 on_change: Callable[[], None] | None = None):
        self._expected = expected
        self._on_failed = on_failed
        self._on_change = on_change
        self._current: dict[str, Any] | None = None
        self._preemptible = False
        self._task: asyncio.Task | None = None

    @property
    def current(self) -> dict[str, Any] | None:
        """The action in progress ({action, profile, since_ms, by, deadline_ms, deadline_from}), or None."""
        return self._current

    def name(self) -> str | None:
        return self._current.get("action") if self._current else None

    def stop_may_preempt(self) -> bool:
        """A stop may go ahead: nothing runs, or what runs only waits (and is not itself a stop)."""
        return self._current is None or (self.name() != "stop" and self._preemptible)

    def busy(self) -> ActionError:
        """The 409 for a second action: what runs, since when, and when it ends at the latest."""
        a = self._current or {}
        what = a.get("action", "?") + (f" to {a['profile']!r}" if a.get("profile") else "")
        now = now_ms()
        since = a.get("since_ms", now)
        if a.get("deadline_ms") is None:  # an action the agent began itself (a retry): bounded the same way
            expected_s, why = self._expected(a.get("action", "?"), a.get("profile"))
            deadline = since + int(expected_s * 1000)
        else:
            deadline, why = a["deadline_ms"], a.get("deadline_from", "")
        elapsed_s = max(0.0, (now - since) / 1000)
        left_s = max(0.0, (deadline - now) / 1000)
        return ActionError("busy", f"busy: {what} in progress since {clock(since)} (by {a.get('by', '?')}), "
                                   f"{elapsed_s:.0f} s so far; it ends by {clock(deadline)} at the latest "
                                   f"({left_s:.0f} s from now: {why}); try again then or watch `lynxtop status`",
                           409, details={"action": a, "elapsed_s": round(elapsed_s, 1), "deadline_ms": deadline,
                                         "retry_after_s": round(left_s, 1)})

    def begin(self, name: str, by: str, profile: str | None) -> None:
        if self._current is not None:
            raise self.busy()
        since = now_ms()
        expected_s, why = self._expected(name, profile)
        self._current = {"action": name, "profile": profile, "since_ms": since, "by": by,
                         "deadline_ms": since + int(expected_s * 1000), "deadline_from": why}
        self._preemptible = False

    def run(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Carry the begun action out in its own task; a failure is reported, never kills the agent."""
        async def wrapper() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - report, never kill the agent
                log.exception("action failed")
                self._on_failed(self.name(), exc)
            finally:
                if asyncio.current_task() is self._task:
                    self._current = None
                    self._preemptible = False
                    self._task = None
                    self._changed()

        self._task = asyncio.get_running_loop().create_task(wrapper(), name="supervisor-action")

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """While the action only waits (readiness, the cluster): a stop may preempt it."""
        before, self._preemptible = self._preemptible, True
        try:
            yield
        finally:
            self._preemptible = before if self._current is not None else False

    def release_waiting(self) -> None:
        """The run's outcome is known: an action that was only waiting for it frees the slot now, so a status that
        says "ready" never comes with "busy" for the next request (its task finishes its bookkeeping on its own)."""
        if self._preemptible:
            self._current = None
            self._preemptible = False
            self._changed()

    async def cancel(self) -> None:
        """Cancel the action's task and wait until it is gone (a stop preempting it, the agent's end)."""
        task = self._task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def finish_stop(self) -> None:
        """At the agent's end: an operator's stop in progress is finished, not left half-done."""
        if self.name() == "stop" and self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.shield(self._task)

    def info(self) -> ActionInfo | None:
        a = self._current
        return ActionInfo(a["action"], a.get("profile"), a.get("since_ms"), a.get("by")) if a else None

    def _changed(self) -> None:
        if self._on_change:
            self._on_change()
