"""The agent's clock: one sampling tick per interval, and whether the agent is healthy.

Owns the tick counters (ticks, missed, failed), the latest rows the status shows, and the health verdict the
watchdog pings on. A tick that is still running when the next is due makes the next one be skipped and counted,
never queued; a tick that raises is a missed tick too, logged once per episode. Each tick runs the samplers'
stages (agent/sampling.py), sends their events down the one event path and queues their rows to the store.

With a clock part (the node's host and GPU sources) the schedule is kept by a long-lived clock thread, not the
loop: it wakes once a tick on the monotonic clock, reads the host row and the GPU sample (NVML in that thread too;
a sample stuck past the tick's deadline is the watchdog's) and hands the tick to the loop once (`call_soon_threadsafe`);
the loop runs the rest (scrape, SLA, events, the store) in that call unless a scrape is to be waited for. At 10
Hz the loop's timer, the executor hand-off and the loop wake-ups on its completion cost more than the host and
GPU sampling themselves (issue 29.3).

A quiet tick never wakes the loop: one on time, with no event, no scrape due or running, no failure episode to
end, and less than LOOP_S after the last tick the loop had, is written by the clock thread itself (its rows to
the store writer, which is thread-safe; the latest rows the status reads swapped by reference; the supervisor's
GPU view updated). At 10 Hz that is 9 ticks in 10: each loop wake-up cost ~0.2 ms of CPU on a small VM.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from lynxtop.agent.api.connguard import Episodes, is_resource_error
from lynxtop.agent.clock import Timeline, describe, span
from lynxtop.agent.coalesce import Closed, Recurring
from lynxtop.agent.sampling import ClockPart, Rows, Sampler, Tick, sample_stages, stages_now
from lynxtop.contract.events import Event, EventKind, Severity

log = logging.getLogger("lynxtop.agent")
STATUS_LINE_S = 1.0  # the status line (systemd's STATUS=) is built at most about this often, not every 10 Hz tick
JOIN_S = 2.0  # how long stopping the clock waits for its threads (one stuck in NVML is left: a daemon)
LOOP_S = 1.0  # the loop gets a tick at least this often (episodes, the socket's path, the status line, serving)
# Wall-clock steps are one episode while they keep coming (two time sources fighting step it every minute): the
# first is told at once, the rest counted; the count and the net offset are told once the clock has been still
# for CLOCK_QUIET_S, and every CLOCK_SUMMARY_S while it is not.
CLOCK_QUIET_S = 600.0
CLOCK_SUMMARY_S = 3600.0
# GPU rows not renewed for this long (late ticks: NVML hung) are no longer served as current (kept_gpu_rows)
GPU_ROWS_STALE_S = 2.0
_NO_GPU_ROWS: list[dict] = []  # the rows of a tick that read no GPU: shared, never changed


def start_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """A daemon thread, started: the one place the clock's threads start (a test makes it fail, as when the process
    is out of threads; the tick fails and is counted, the clock goes on)."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


def kept_gpu_rows(rows: Rows, t0: float, ticker: Ticker) -> tuple[list[dict], float]:
    """The GPU rows the status serves as current after a tick starting at `t0`, and when they were read. A sample
    that read no GPU (an empty list: NVML down or re-initialising, or a sampling bug) leaves none: the readings are
    absent, so /metrics drops the GPU series and the status carries none, never the last readings frozen for the
    whole outage. A late tick (NVML slower than the tick's deadline) carries no `gpu_rows`: the last rows stay, so
    one slow call at 10 Hz does not blank the GPUs, but only for GPU_ROWS_STALE_S (at least 3 intervals): NVML hung
    longer is not read either."""
    last, last_t0 = ticker.latest_gpu_rows, ticker.gpu_t0
    if "gpu_rows" in rows:
        return rows["gpu_rows"] or _NO_GPU_ROWS, t0
    if last and t0 - last_t0 > max(GPU_ROWS_STALE_S, 3 * ticker.interval):
        return _NO_GPU_ROWS, last_t0
    return last, last_t0


def tell_resumed(stages: Iterable[Iterable[object]], now: float) -> None:
    """Every sampler that keeps time between its readings (`resumed`: the scrape's hang detector) hears of a
    resume, so the paused time is never counted as the engine standing still; one's failure is logged, the
    others still hear it."""
    for stage in list(stages):
        for sampler in list(stage):
            told = getattr(sampler, "resumed", None)
            if told is None:
                continue
            try:
                told(now)
            except Exception:  # noqa: BLE001 - one sampler's failure must not keep the others from hearing it
                log.exception("telling %s of the resume failed", type(sampler).__name__)

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
        self._loop_due = -math.inf  # tick start (monotonic) from which a tick must reach the loop (quiet before)
        self._on_time = False  # whether the clock thread's last tick was read within its deadline
        self._stages: list[list[Sampler]] = []
        self._part: ClockPart | None = None  # read by the clock thread each tick, before the stages
        self._on_loop = False  # a tick handed to the loop by the clock thread and not finished there
        self._last_context: tuple[int | None, int | None] = (None, None)
        self._next_t = 0.0  # the clock thread's next due time (monotonic): a new clock thread goes on from it
        self._gen = 0  # the clock thread's generation: one whose tick the watchdog took ends
        self._reading: tuple[int, Tick] | None = None  # (generation, tick) being read by the clock thread
        self._claim = threading.Lock()  # who hands that tick to the loop: its thread or the watchdog
        self._thread: threading.Thread | None = None
        self._watch: asyncio.TimerHandle | None = None
        self._clock_args: tuple[Any, ...] = ()
        self.started_mono = time.monotonic()
        self.skipped_ticks = 0  # ticks skipped (one ran late): counted by whichever thread keeps the clock
        self.failed_ticks = 0  # ticks that raised: counted in missed_ticks too, never silently dropped
        self.last_tick_error: str | None = None
        self.ticks = 0
        self.quiet_ticks = 0  # of those, written by the clock thread without waking the loop
        self.last_tick_done: float | None = None
        self._resumed_mono: float | None = None  # when the watchdog found the process had been stopped
        self._steps = Recurring(CLOCK_QUIET_S)  # the wall clock's steps, on the timeline's seconds
        self._steps_before = 0  # the wall clock's offset before the episode's first step (ms)
        self._steps_told = (0.0, 0)  # (when, steps counted) of the episode's last report
        self.latest_gpu_rows, self.gpu_t0 = _NO_GPU_ROWS, -math.inf  # the status's GPU rows, read at (monotonic)
        self.last_tick_unix: float | None = None  # wall time the last tick was written (Unix seconds)
        self.latest_host: dict[str, Any] = {}
        self.latest_serving: dict[str, Any] | None = None

    @property
    def missed_ticks(self) -> int:
        """Ticks skipped (one ran late) plus ticks that failed (two counters: each written by one thread)."""
        return self.skipped_ticks + self.failed_ticks

    def use(self, stages: list[list[Sampler]], part: ClockPart | None = None) -> None:
        """The samplers of each tick, in stages (node.py wires them once the store and GPUs are open); `part`, when
        given, is read by the clock thread before the stages run on the loop."""
        self._stages = stages
        self._part = part

    async def run(self) -> None:
        """One tick per interval; a tick still running when the next is due skips that one (counted)."""
        if self._part is not None:
            await self._run_clock_thread(self._part)
            return
        next_t = time.monotonic()
        running: asyncio.Task | None = None
        while True:
            delay = next_t - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            now = time.monotonic()
            behind = int((now - next_t) // self.interval)
            if behind > 0:  # the loop itself was late (suspended, overloaded): skip, don't catch up
                self.skipped_ticks += behind
                next_t += behind * self.interval
            next_t += self.interval
            self._on_beat(now)
            if running is not None and not running.done():
                self.skipped_ticks += 1
                continue
            running = asyncio.get_running_loop().create_task(self._tick(next_t - self.interval))

    async def _tick(self, due: float | None = None) -> None:
        """One tick, due at `due` (monotonic; now if None)."""
        tick = self._new_tick(due, self._context())
        self._record(tick.events)  # a clock step's
        tick.events = []
        try:
            error = await sample_stages(self._stages, tick)
        except Exception as exc:  # noqa: BLE001 - one bad tick must not stop the clock
            error = exc
        self._end(tick, error)

    def _new_tick(self, due: float | None, context: tuple[int | None, int | None]) -> Tick:
        t0 = time.monotonic()
        step = self._clock_step()
        root, run_id = context
        # NVML gets the rest of the interval it was due in: a GPU that answers slowly makes this tick carry no GPU
        # rows (counted) rather than holding host, serving and the store back; a tick started late (a busy loop)
        # that waited 0.9 interval from its start ran when the next was due (missed: benchmarks/slowloris.py)
        start = t0 if due is None else min(due, t0)
        return Tick(ts_ms=self._timeline.now_ms(), t0=t0, deadline=start + self.interval * 0.9, root=root,
                    run_id=run_id, events=[step] if step is not None else [])

    def _end(self, tick: Tick, error: Exception | None) -> None:
        """The tick's events down the one path, its rows to the store, or its failure counted."""
        try:
            self._record(tick.events)
            if error is None:
                self._finish(tick)  # the store part failing is the same: counted
        except Exception as exc:  # noqa: BLE001 - one bad tick must not stop the clock
            error = exc
        if error is not None:
            self._failed(error)
        self._loop_due = self._next_loop(tick)

    def _next_loop(self, tick: Tick) -> float:
        """On the loop, a tick done: from when the clock thread's ticks must reach the loop again. Within LOOP_S
        (half an interval of slack: at 1 Hz every tick does), at once while a failure episode is open (the next
        good tick ends it), and when a sampler asks (`loop_due`: the scrape's schedule)."""
        if "tick" in self._episodes.open:
            return -math.inf
        due = tick.t0 + LOOP_S - self.interval / 2
        for stage in self._stages:
            for sampler in stage:
                asks = getattr(sampler, "loop_due", None)
                if asks is not None:
                    due = min(due, asks())
        return due

    def _quiet(self, tick: Tick, part: ClockPart) -> bool:
        """In the clock thread: whether the tick just read needs nothing of the loop (see the module's docstring);
        the part's GPU rows are then in it (`part.finish`, last: it has effects)."""
        return (not tick.events and tick.t0 < self._loop_due and tick.t0 < self._done_due and self._on_time
                and part.finish(tick))

    def _clock_step(self) -> Event | None:
        """A stepped wall clock becomes an event and a status field; the samples' timeline goes on unmoved. Steps
        that keep coming are one episode: the first told at once, the others in one count (`_steps_count`)."""
        step = self._timeline.check()
        if step is None:
            return self._steps_count(False) if self._steps.times else None  # a tick without a step: one int read
        now = self._timeline.now_ms() / 1000
        if not self._steps.hit(now):  # a further step: counted, and the count told if an hour has passed
            return self._steps_count(True) if now - self._steps_told[0] >= CLOCK_SUMMARY_S else None
        self._steps_before, self._steps_told = self._timeline.offset_ms - step.step_ms, (now, 1)
        off = self._timeline.offset_ms
        msg = (f"{describe(step)}; sample timestamps go on from the agent's own timeline (the wall clock is now "
               f"{span(off)} {'ahead of' if off >= 0 else 'behind'} it), so no history is mislabeled or expired; "
               "a restart of the agent adopts the wall clock")
        return Event(EventKind.AGENT_CLOCK_STEP, Severity.WARNING, msg, ts_ms=step.ts_ms,
                     details={"step_ms": step.step_ms, "wall_ms": step.wall_ms, "ts_ms": step.ts_ms,
                              "offset_ms": self._timeline.offset_ms})

    def _steps_count(self, at_step: bool) -> Event | None:
        """The open episode's count: at its end (no step for CLOCK_QUIET_S), or at a step CLOCK_SUMMARY_S after
        the last report; None when the episode goes on quietly or ended after its one step (already told)."""
        now = self._timeline.now_ms() / 1000
        closed: Closed | None = self._steps.close(now)
        ended = not self._steps.open
        if ended and closed is None:
            return None
        if not ended and not at_step:
            return None  # a tick without a step in an episode still open
        times = closed.times if closed is not None else self._steps.times
        new = times - self._steps_told[1]
        self._steps_told = (now, times)
        off = self._timeline.offset_ms
        net = off - self._steps_before
        how = (f"no step for {CLOCK_QUIET_S / 60:g} min: the episode is over" if ended
               else f"still stepping: counted quietly, the count told every {CLOCK_SUMMARY_S / 60:g} min")
        msg = (f"the wall clock stepped {times} times since the first step was told ({new} since the last report); "
               f"net {span(net)} {'forward' if net >= 0 else 'back'} over the episode, the wall clock is now "
               f"{span(off)} {'ahead of' if off >= 0 else 'behind'} the samples' timeline; {how}. Two time sources "
               "setting the clock (NTP, chrony, a hypervisor's sync, a manual date) may be fighting")
        return Event(EventKind.AGENT_CLOCK_STEP, Severity.WARNING, msg, ts_ms=self._timeline.now_ms(),
                     details={"steps": times, "steps_since_told": new, "net_step_ms": net, "offset_ms": off,
                              "ended": ended})

    # ------------------------------------------------------------------------------------------ clock thread

    async def _run_clock_thread(self, part: ClockPart) -> None:
        """The clock thread runs until this is cancelled (the agent stopping), then it is stopped and joined within
        JOIN_S (one inside NVML is left: a daemon, it ends when the call returns). A clock thread that cannot start
        fails a tick (counted) and is tried again every interval."""
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        self._on_loop = False
        self._next_t = time.monotonic()
        self._clock_args = (loop, part, stop)
        try:
            self._watchdog()  # starts the clock thread
            await loop.create_future()  # until cancelled
        finally:
            stop.set()
            part.wake()  # a clock thread waiting for a stuck thread's GPU sample
            if self._watch is not None:
                self._watch.cancel()
            thread, self._thread = self._thread, None
            reading, since = self._reading, part.in_gpu_since()
            if thread is not None and not (reading is not None and since is not None and since >= reading[1].t0):
                thread.join(JOIN_S)  # at once unless a host read hangs: it waits on `stop` otherwise

    def _start_clock(self) -> None:
        """A clock thread for the current generation (the schedule goes on from `_next_t`)."""
        loop, part, stop = self._clock_args
        gen = self._gen
        try:
            self._thread = start_thread(lambda: self._clock(loop, part, stop, gen), "lynxtop-clock")
        except RuntimeError as exc:  # out of threads: a failed tick, as any other; the watchdog tries again
            self._thread = None
            self._failed(exc)

    def _arm(self, delay: float) -> None:
        if self._watch is not None:
            self._watch.cancel()
        self._watch = asyncio.get_running_loop().call_later(delay, self._watchdog)

    def _watchdog(self) -> None:
        """On the loop, when no tick has landed for two intervals (re-armed by every tick that lands: it never fires
        while the clock keeps time). A clock thread inside its own GPU sample past the tick's deadline (NVML hung)
        gives that tick to the loop, without GPU rows (counted late), and the clock to a new thread: the host row
        of every tick still comes, as when NVML ran beside the tick; the new thread waits for the stuck sample
        (never two at once). A clock thread that is gone (or never started) is started again."""
        self._watch = None
        now = time.monotonic()
        part = self._clock_args[1]
        with self._claim:
            reading = self._reading
            since = part.in_gpu_since()
            stuck = (reading is not None and reading[0] == self._gen and now >= reading[1].deadline
                     and since is not None and since >= reading[1].t0)
            if stuck:
                self._reading = None
                self._gen += 1
        if stuck:
            assert reading is not None
            old = reading[1]  # its thread may still write into it: the loop takes a copy
            tick = dataclasses.replace(old, rows=dict(old.rows), events=list(old.events), gpu=None)
            part.late()
            self._on_loop = True
            self._landed(tick, None, now)  # first: a new thread that saw it on the loop would skip its next tick
            self._start_clock()
        elif self._thread is None or not self._thread.is_alive():
            if reading is not None and reading[0] == self._gen:
                self.skipped_ticks += 1  # the tick its thread was reading when it ended: never written
            self._reading = None
            self._gen += 1
            self._start_clock()
        self._arm(self.interval if not stuck else 2 * self.interval)

    def _clock(self, loop: asyncio.AbstractEventLoop, part: ClockPart, stop: threading.Event, gen: int) -> None:
        """The clock thread: one wake-up a tick on the monotonic clock, the part read (host, then NVML in this
        thread), the tick handed to the loop once.

        A tick the loop has not finished when the next is due skips that one (counted, as a tick still running);
        a clock thread late by whole intervals (a host read that hung) skips those, never catches up. A thread
        whose tick the watchdog took (stuck in NVML) ends when the call returns."""
        while True:
            delay = self._next_t - time.monotonic()
            if (delay > 0 and stop.wait(delay)) or stop.is_set() or gen != self._gen:
                return
            now = time.monotonic()
            behind = int((now - self._next_t) // self.interval)
            if behind > 0:
                self.skipped_ticks += behind
                self._next_t += behind * self.interval
            due = self._next_t
            self._next_t = due + self.interval
            if self._on_loop:
                self.skipped_ticks += 1
                post: Callable[..., None] = self._on_beat
                args: tuple[Any, ...] = (now,)
            else:
                error: Exception | None = None
                try:
                    tick = self._new_tick(due, self._context_now())
                except Exception as exc:  # noqa: BLE001 - no tick to hand on: its failure, counted on the loop
                    post, args = self._failed, (exc,)
                else:
                    self._reading = (gen, tick)
                    try:
                        part.read(tick)
                    except Exception as exc:  # noqa: BLE001 - the tick's failure, counted on the loop
                        error = exc
                    with self._claim:
                        mine = self._reading is not None and self._reading[1] is tick
                        if mine:
                            self._reading = None
                    if not mine or stop.is_set():
                        return  # the watchdog gave this tick to the loop and the clock to a new thread
                    self._on_time = time.monotonic() <= tick.deadline
                    try:
                        if error is None and self._quiet(tick, part):
                            self._finish(tick)  # no loop wake-up: its rows to the store from here
                            self.quiet_ticks += 1
                            continue
                    except Exception as exc:  # noqa: BLE001 - the tick's failure, counted on the loop as any
                        error = exc
                    self._on_loop = True
                    post, args = self._landed, (tick, error, now)
            try:
                loop.call_soon_threadsafe(post, *args)
            except RuntimeError:  # the loop is closed: the agent is gone
                return

    def _context_now(self) -> tuple[int | None, int | None]:
        """The context read from the clock thread; the last one read if the supervisor was changing it."""
        try:
            self._last_context = self._context()
        except Exception:  # noqa: BLE001, S110 - a run starting or ending between two attribute reads
            pass
        return self._last_context

    def _landed(self, tick: Tick, error: Exception | None, now: float) -> None:
        """On the loop, once a tick: the stages that need not wait run here; the rest, if any, in a task."""
        handed = False
        try:
            if self._watch is not None:  # a tick landed: the watchdog need not look before two intervals; after
                # one on time with its GPU rows, quiet ticks may follow (no landing) for LOOP_S more: an NVML call
                # hung after them is found within LOOP_S + two intervals; a late tick keeps two (NVML slow again)
                spare = LOOP_S if self.interval < LOOP_S and self._on_time and isinstance(tick.gpu, tuple) else 0.0
                self._arm(max(0.0, tick.t0 + 2 * self.interval + spare - time.monotonic()))
            self._on_beat(now)
            if error is None:
                try:
                    done, answered, error = stages_now(self._stages, tick)
                except Exception as exc:  # noqa: BLE001 - one bad tick must not stop the clock
                    error = exc
                else:
                    if error is None and done < len(self._stages):
                        asyncio.get_running_loop().create_task(self._rest(tick, self._stages[done:], answered))
                        handed = True
                        return
            self._end(tick, error)
        finally:
            if not handed:
                self._on_loop = False  # the clock thread's next tick may start

    async def _rest(self, tick: Tick, stages: list[list[Sampler]], answered: list[Any] | None) -> None:
        try:
            try:
                error = await sample_stages(stages, tick, answered)
            except Exception as exc:  # noqa: BLE001 - one bad tick must not stop the clock
                error = exc
            self._end(tick, error)
        finally:
            self._on_loop = False  # cancelled too (the agent stopping)

    def _failed(self, exc: Exception) -> None:
        """A tick that raised is a missed tick (status and /metrics show it); the log says so once per episode."""
        self.failed_ticks += 1
        self.last_tick_error = f"{type(exc).__name__}: {exc}"
        self._loop_due = -math.inf  # the ticks after it reach the loop until one ends the episode
        if is_resource_error(exc):
            self._episodes.hit("tick", f"sampling ticks fail: out of descriptors or memory ({exc})")
        elif self._episodes.hit("tick", f"sampling ticks fail: {type(exc).__name__}: {exc}"):
            log.warning("first failed tick of this episode", exc_info=exc)  # one traceback, for the bug report

    def _finish(self, tick: Tick) -> None:
        rows = tick.rows
        self._writer().submit_tick(tick.ts_ms, gpu_rows=rows.get("gpu_rows", []), host_row=rows.get("host_row"),
                                   serving_row=rows.get("serving_row"), nvlink_rows=rows.get("nvlink_rows", []),
                                   process_rows=rows.get("process_rows", []))
        self.latest_gpu_rows, self.gpu_t0 = kept_gpu_rows(rows, tick.t0, self)
        self.latest_host = rows.get("host_row") or {}
        if "serving_row" in rows:  # a tick without a scrape (scraping slower than sampling) keeps the last page
            self.latest_serving = rows["serving_row"]
        self.ticks += 1
        self.last_tick_done = time.monotonic()
        self.last_tick_unix = time.time()  # lynxtop_agent_last_tick_timestamp_seconds: rules compare it to time()
        if "tick" in self._episodes.open:
            self._episodes.end("tick", f"sampling ticks failed ({self.failed_ticks} failed in all); sampling again")
        if tick.t0 >= self._done_due:  # building the line was a tenth of the main thread at 10 Hz (issue 29.3)
            self._done_due = tick.t0 + STATUS_LINE_S - self.interval / 2  # half an interval of slack: 1 Hz ticks
            self._on_done()  # each call it; serving's own changes call it at once (node.py)

    # ------------------------------------------------------------------------------------------ health

    def resumed(self, now: float) -> None:
        """Stopped (SIGSTOP, a VM pause) and running again: ticks get a fresh grace, samplers are told."""
        self._resumed_mono = now
        log.warning("the agent was not running for a while (stopped or paused); ticks resume now")
        tell_resumed(self._stages, now)

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
