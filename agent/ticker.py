"""The agent's clock: one sampling tick per interval, and whether the agent is healthy.

Owns the tick counters (ticks, missed, failed), the latest rows the status shows, and the health verdict the
watchdog pings on. A tick that is still running when the next is due makes the next one be skipped and counted,
never queued; a tick that raises is a missed tick too, logged once per episode. Each tick runs the samplers'
stages (agent/sampling.py), sends their events down the one event path and queues their rows to the store.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

from lynxtop.agent.api.connguard import Episodes, is_resource_error
from lynxtop.agent.clock import Timeline, describe, span
from lynxtop.agent.sampling import Sampler, Tick, sample_stages
from lynxtop.contract.events import Event, EventKind, Severity

log = logging.getLogger("lynxtop.agent")
STATUS_LINE_S = 1.0  # the status line (systemd's STATUS=) is built at most about this often, not every 10 Hz tick


class Ticker:
    def __init__(self, interval: float, timeline: Timeline, episodes: Episodes, *, writer: Callable[[], Any],
                 record: Callable[[Iterable[Event]], None], context: Callable[[], tuple[int | None, int | None]],
                 on_beat: Callable[[float], None], on_done: Callable[[], None]):
        self.interval = interval
        self._timeline = timeline
        self._episodes = episodes
        self._writer = writer  # the store writer (opened after the ticker is made)
        self._record = record  # the node's one event path
        self._context = context  # (vLLM's root pid, run id) for the next tick
        self._on_beat = on_beat  # every interval, ticking or not (episodes, the socket's path)
        self._on_done = on_done  # after a tick was written, at most every STATUS_LINE_S (the status line)
        self._done_due = -math.inf  # tick start (monotonic) from which the next tick calls on_done
        self._stages: list[list[Sampler]] = []
        self.started_mono = time.monotonic()
        self.missed_ticks = 0  # ticks skipped (one ran late) plus ticks that failed
        self.failed_ticks = 0  # ticks that raised: counted in missed_ticks too, never silently dropped
        self.last_tick_error: str | None = None
        self.ticks = 0
        self.last_tick_done: float | None = None
        self._resumed_mono: float | None = None  # when the watchdog found the process had been stopped
        self.latest_gpu_rows: list[dict] = []
        self.latest_host: dict[str, Any] = {}
        self.latest_serving: dict[str, Any] | None = None

    def use(self, stages: list[list[Sampler]]) -> None:
        """The samplers of each tick, in stages (node.py wires them once the store and GPUs are open)."""
        self._stages = stages

    async def run(self) -> None:
        """One tick per interval; a tick still running when the next is due skips that one (counted)."""
        next_t = time.monotonic()
        running: asyncio.Task | None = None
        while True:
            delay = next_t - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            now = time.monotonic()
            behind = int((now - next_t) // self.interval)
            if behind > 0:  # the loop itself was late (suspended, overloaded): skip, don't catch up
                self.missed_ticks += behind
                next_t += behind * self.interval
            next_t += self.interval
            self._on_beat(now)
            if running is not None and not running.done():
                self.missed_ticks += 1
                continue
            running = asyncio.get_running_loop().create_task(self._tick(next_t - self.interval))

    async def _tick(self, due: float | None = None) -> None:
        """One tick, due at `due` (monotonic; now if None)."""
        t0 = time.monotonic()
        self._check_clock()
        root, run_id = self._context()
        # NVML gets the rest of the interval; a GPU that answers slowly makes this tick carry no GPU rows
        # (counted) rather than holding host, serving and the store back. The rest of the interval it was due
        # in: a tick started late (a busy loop, e.g. a connection flood's accepts) that waited 0.9 interval
        # from its start still ran when the next was due, and that one was missed (benchmarks/slowloris.py)
        start = t0 if due is None else min(due, t0)
        tick = Tick(ts_ms=self._timeline.now_ms(), t0=t0, deadline=start + self.interval * 0.9, root=root,
                    run_id=run_id)
        try:
            error = await sample_stages(self._stages, tick)
            self._record(tick.events)
            if error is None:
                self._finish(tick)  # the store part failing is the same: counted
        except Exception as exc:  # noqa: BLE001 - one bad tick must not stop the clock
            error = exc
        if error is not None:
            self._failed(error)

    def _check_clock(self) -> None:
        """A stepped wall clock becomes an event and a status field; the samples' timeline goes on unmoved."""
        step = self._timeline.check()
        if step is None:
            return
        off = self._timeline.offset_ms
        msg = (f"{describe(step)}; sample timestamps go on from the agent's own timeline (the wall clock is now "
               f"{span(off)} {'ahead of' if off >= 0 else 'behind'} it), so no history is mislabeled or expired; "
               "a restart of the agent adopts the wall clock")
        self._record([Event(EventKind.AGENT_CLOCK_STEP, Severity.WARNING, msg, ts_ms=step.ts_ms,
                            details={"step_ms": step.step_ms, "wall_ms": step.wall_ms, "ts_ms": step.ts_ms,
                                     "offset_ms": self._timeline.offset_ms})])

    def _failed(self, exc: Exception) -> None:
        """A tick that raised is a missed tick (status and /metrics show it); the log says so once per episode."""
        self.failed_ticks += 1
        self.missed_ticks += 1
        self.last_tick_error = f"{type(exc).__name__}: {exc}"
        if is_resource_error(exc):
            self._episodes.hit("tick", f"sampling ticks fail: out of descriptors or memory ({exc})")
        elif self._episodes.hit("tick", f"sampling ticks fail: {type(exc).__name__}: {exc}"):
            log.warning("first failed tick of this episode", exc_info=exc)  # one traceback, for the bug report

    def _finish(self, tick: Tick) -> None:
        rows = tick.rows
        self._writer().submit_tick(tick.ts_ms, gpu_rows=rows.get("gpu_rows", []), host_row=rows.get("host_row"),
                                   serving_row=rows.get("serving_row"), nvlink_rows=rows.get("nvlink_rows", []),
                                   process_rows=rows.get("process_rows", []))
        if "gpu_rows" in rows:
            self.latest_gpu_rows = rows["gpu_rows"] or self.latest_gpu_rows
        self.latest_host = rows.get("host_row") or {}
        if "serving_row" in rows:  # a tick without a scrape (scraping slower than sampling) keeps the last page
            self.latest_serving = rows["serving_row"]
        self.ticks += 1
        self.last_tick_done = time.monotonic()
        if "tick" in self._episodes.open:
            self._episodes.end("tick", f"sampling ticks failed ({self.failed_ticks} failed in all); sampling again")
        if tick.t0 >= self._done_due:  # building the line was a tenth of the main thread at 10 Hz (issue 29.3)
            self._done_due = tick.t0 + STATUS_LINE_S - self.interval / 2  # half an interval of slack: 1 Hz ticks
            self._on_done()  # each call it; serving's own changes call it at once (node.py)

    # ------------------------------------------------------------------------------------------ health

    def resumed(self, now: float) -> None:
        """The process was stopped (SIGSTOP, a VM pause) and runs again: its ticks get a fresh grace."""
        self._resumed_mono = now
        log.warning("the agent was not running for a while (stopped or paused); ticks resume now")

    def log_unhealthy(self) -> None:
        log.error("health check failed (last tick %s s ago, writer alive %s): not pinging the watchdog",
                  self._tick_age(), self._writer().alive())

    def _tick_age(self) -> float | None:
        return None if self.last_tick_done is None else round(time.monotonic() - self.last_tick_done, 1)

    def healthy(self) -> bool:
        limit = max(5 * self.interval, 10.0)
        age = self._tick_age()
        if age is None:  # not ticked yet: healthy during the first `limit` seconds only
            age = time.monotonic() - self.started_mono
        if self._resumed_mono is not None:  # stopped and continued: judged from the resume, not the pause
            age = min(age, time.monotonic() - self._resumed_mono)
        if not (age < limit and self._writer().alive()):
            return False
        ws = self._writer().stats()
        if ws.get("wal_unlinked") and not ws.get("wal_recovered"):  # the WAL unlinked under the agent, not recovered
            return False
        rejected_age = ws.get("rejected_age_s")  # the store refused a tick lately: those samples are lost
        return not (rejected_age is not None and rejected_age < limit)
