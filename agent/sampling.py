"""The samplers of one tick behind one protocol: each returns `(rows, events)`.

The tick (node.py) runs the samplers in stages, the samplers of one stage at once: the host first (it finds the
vLLM processes the GPU sampler attributes memory to), then NVML and the `/metrics` scrape side by side (a slow
GPU must not hold the scrape back), then the SLA over the scraped row. Rows are merged into the tick's
`submit_tick` arguments; events of every sampler reach the store through the one function the node gives.

The host row and the GPU sample are read in the ticker's own clock thread (`ClockPart`, agent/ticker.py), NVML in
that thread too (`GpuGate`: one sample at a time; a thread stuck in it loses the clock to a new one, which waits
for that sample until each tick's deadline): at 10 Hz the loop's timer, the executor hand-off and the loop
wake-ups on its completion cost more than the sampling (issue 29.3). The loop gets each tick once, and its
samplers that need not wait (`sample_now`) answer without a task.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from lynxtop.agent.serving.health import HangDetector, HttpClient, Verdict
from lynxtop.contract.events import Event
from lynxtop.contract.records import RecordError

log = logging.getLogger("lynxtop.agent")
# A page cut off (slower than its time limit, larger than its size limit) is read up to the cut-off each time:
# while that goes on, scrapes back off from this, doubling up to the cap (docs/sampling.md).
CUT_OFF = "page cut off"  # how agent/metrics/fetch.py begins such a failure
CUT_BACKOFF_FIRST_S = 1.0
CUT_BACKOFF_MAX_S = 30.0
Rows = dict[str, Any]  # keyword arguments of StoreWriter.submit_tick: host_row, gpu_rows, serving_row, ...


@dataclass
class Tick:
    """What the samplers of one tick share."""

    ts_ms: int
    t0: float  # monotonic start of the tick
    deadline: float  # monotonic time past which a slow sampler (NVML) is not waited for
    root: int | None  # the vLLM API server's pid, when one runs
    run_id: int | None
    pids: set[int] = field(default_factory=set)  # the run's processes (set by the host sampler)
    rows: Rows = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    gpu: Any = None  # what the clock thread's GPU read gave the loop: (started, GpuTick), an error, or None (late)


class Sampler(Protocol):
    async def sample(self, tick: Tick) -> tuple[Rows, list[Event]]: ...


NOT_NOW: Any = object()  # what `sample_now` answers when the sampler must be awaited (`sample`) this tick


def _now(sampler: Any, tick: Tick) -> Any:
    """The sampler's answer without waiting (`sample_now`, which has no side effect when it answers NOT_NOW), its
    error as a value, or NOT_NOW."""
    now = getattr(sampler, "sample_now", None)
    if now is None:
        return NOT_NOW
    try:
        return now(tick)
    except Exception as exc:  # noqa: BLE001 - the stage's error, as gather returned it
        return exc


def stages_now(stages: Sequence[Sequence[Sampler]], tick: Tick) -> tuple[int, list[Any] | None, Exception | None]:
    """Run the stages whose samplers all answer at once, in this call (no task, no loop turn: at 10 Hz most ticks'
    scrape and SLA have nothing to wait for). Returns (index of the first stage left, the answers its samplers
    gave at once or NOT_NOW, the error that ended the tick); index len(stages): all done."""
    for i, stage in enumerate(stages):
        answers = [_now(s, tick) for s in stage]
        if any(a is NOT_NOW for a in answers):
            return i, answers, None
        error = _merge(tick, answers)
        if error is not None:
            return i, None, error
    return len(stages), None, None


async def sample_stages(stages: Sequence[Sequence[Sampler]], tick: Tick,
                        answered: list[Any] | None = None) -> Exception | None:
    """Run the stages in order into `tick.rows` and `tick.events`; the first failure ends the tick.

    The events of the samplers that did answer are kept in `tick.events` even then (an outage begins with one).
    `answered`: the first stage's answers already given (stages_now), NOT_NOW for those to await.
    """
    for k, stage in enumerate(stages):
        given = answered if k == 0 and answered is not None else [NOT_NOW] * len(stage)
        waited = [s for s, a in zip(stage, given, strict=True) if a is NOT_NOW]
        # A stage's last sampler runs in the tick's own task, the others as tasks beside it: every task and gather
        # costs loop turns (issue 29.3). Results and errors are gather's (return_exceptions), in the stage's order.
        others = [asyncio.ensure_future(s.sample(tick)) for s in waited[:-1]]
        last: Any = None
        if waited:
            try:
                last = await waited[-1].sample(tick)
            except Exception as exc:  # noqa: BLE001 - the stage's error, as gather returned it
                last = exc
            except BaseException:
                for task in others:  # cancelled (the agent stopping): so are the stage's other samplers, as by gather
                    task.cancel()
                raise
        got = iter([*(await asyncio.gather(*others, return_exceptions=True) if len(others) > 1 else
                      [await _result(others[0])] if others else []), *([last] if waited else [])])
        error = _merge(tick, [next(got) if a is NOT_NOW else a for a in given])
        if error is not None:
            return error
    return None


def _merge(tick: Tick, results: list[Any]) -> Exception | None:
    """A stage's results into the tick, in the stage's order; its first error (a BaseException is raised)."""
    error: BaseException | None = None
    for res in results:
        if isinstance(res, BaseException):
            error = error or res
            continue
        rows, events = res
        tick.rows.update(rows)
        tick.events.extend(events)
    if error is not None and not isinstance(error, Exception):
        raise error
    return error


async def _result(task: asyncio.Future) -> Any:
    """A sampler task's result, or its error as a value (gather's return_exceptions, without a gather)."""
    try:
        return await task
    except Exception as exc:  # noqa: BLE001 - the stage's error
        return exc


def as_event(d: Mapping[str, Any], run_id: int | None = None, ts_ms: int | None = None) -> Event:
    """An event dict of a sampler that speaks dicts (kind, severity, message, details), with the dotted kind.

    Strict as `Event(...)` is: a reader takes a newer agent's kind as an UnknownKind, the agent writes only its own."""
    event = Event.from_json({**d, "run_id": run_id, "ts_ms": d.get("ts_ms", ts_ms)})  # the one mapping of kinds
    if not event.known:
        raise RecordError("Event", "kind", f"unknown kind {str(event.kind)!r} (not in EventKind: add it there "
                          "before writing it)")
    return event


class EventCollector:
    """An `on_event(kind, severity, message, details)` sink that keeps the events for the next tick.

    The GPU sampler reports from its own threads (NVML calls, the XID poll): events are stamped when they
    happen and written by the tick, so they take the same path into the store as every other sampler's.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[Event] = []

    def __call__(self, kind: str, severity: str, message: str, details: dict | None = None) -> None:
        ev = as_event({"kind": kind, "severity": severity, "message": message, "details": details},
                      ts_ms=int(time.time() * 1000))
        with self._lock:
            self._events.append(ev)

    def drain(self) -> list[Event]:
        with self._lock:
            out, self._events = self._events, []
        return out

    def pending(self) -> bool:
        """Whether an event waits for the next tick (read without the lock: a list's length is one read)."""
        return bool(self._events)


class ClockPart(Protocol):
    """What the ticker's clock thread reads each tick before handing it to the loop (HostSource)."""

    def read(self, tick: Tick) -> None: ...

    def in_gpu_since(self) -> float | None: ...

    def wake(self) -> None: ...

    def late(self) -> None: ...

    def finish(self, tick: Tick) -> bool: ...


class GpuWaitEnded(Exception):
    """A wait for another thread's GPU sample given up: the clock is stopping."""


class GpuGate:
    """One NVML sample at a time, run in the thread that asks (the ticker's clock thread): no hand-off to another
    thread in the common case. A thread that asks while a sample runs in another (one stuck in NVML, whose clock
    the ticker gave to a new thread) waits for it until its deadline and takes its result: never two at once.
    """

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self.busy_since: float | None = None  # monotonic start of the sample running, None when idle
        self._outcome: tuple[float, Any, Exception | None] | None = None  # the last sample's, until taken
        self._done = 0  # samples ended, for a waiter to tell a new outcome from an old one
        self._woken = 0  # wake() calls: a waiter gives up (the clock stopping)

    def sample(self, job: Callable[[set[int]], Any], pids: set[int], until: float) -> tuple[float, Any] | None:
        """(start, result) of a sample, or None when another thread's is still running at `until`; the sample's
        error is raised here."""
        with self._cv:
            if self.busy_since is not None:
                return self._wait(until)
            self.busy_since = started = time.monotonic()
            self._outcome = None  # one that ended between two ticks gives way to this fresh one
        exc: Exception | None = None
        result: Any = None
        try:
            result = job(pids)
        except Exception as e:  # noqa: BLE001 - the tick's error, raised below after the gate is open again
            exc = e
        finally:
            with self._cv:
                self.busy_since = None
                self._outcome = (started, result, exc)
                self._done += 1
                self._cv.notify_all()  # a waiter only when this one was stuck: nobody to wake otherwise
        if exc is not None:
            raise exc
        return started, result

    def _wait(self, until: float) -> tuple[float, Any] | None:
        done, woken = self._done, self._woken
        while self._done == done:
            left = until - time.monotonic()
            if left <= 0:
                return None
            if self._woken != woken:
                raise GpuWaitEnded("the clock stopped while a GPU sample of another thread ran")
            self._cv.wait(left)
        outcome, self._outcome = self._outcome, None
        if outcome is None:  # taken by another waiter
            return None
        started, result, exc = outcome
        if exc is not None:
            raise exc
        return started, result

    def wake(self) -> None:
        """Ends the waits for another thread's sample (the clock stopping); the sample itself runs on."""
        with self._cv:
            self._woken += 1
            self._cv.notify_all()


class HostSource:
    """psutil's host row and the pids of the served run, then the GPU sample with them: read in the clock thread.

    The host row first, then NVML with the pids just read (GpuSource.read), in the same thread: a GPU sample still
    running (hung NVML) never holds the host row back, since the ticker's watchdog gives the clock to a new thread
    whose ticks wait for that sample only until their deadline (agent/ticker.py). A host row that raises (each of
    its readings fails alone: agent/host.py; this is what is left) still has NVML read, with the pids known so far,
    before its error fails the tick: the GPU sampler keeps its cadence (GPM intervals, XIDs, a lost GPU found).
    """

    def __init__(self, sampler: Any, members: Callable[[], set[int]], gpu: GpuSource | None = None):
        self.sampler = sampler
        self.members = members  # processes of the run outside the leader's tree (called in the clock thread)
        self.gpu = gpu

    def read(self, tick: Tick) -> None:
        root = tick.root
        try:
            members = self.members() if root is not None else set()
            row = self.sampler.sample(root)
            tick.pids = set(self.sampler.tree_pids) | members  # the members that row read: /proc once a tick
            tick.rows["host_row"] = row
        finally:
            if self.gpu is not None:
                self.gpu.read(tick)

    def in_gpu_since(self) -> float | None:
        """When the GPU sample now running started (monotonic), None when none runs."""
        return self.gpu.gate.busy_since if self.gpu is not None else None

    def wake(self) -> None:
        if self.gpu is not None:
            self.gpu.gate.wake()

    def late(self) -> None:
        """The tick being read was handed on without its GPU rows (its thread stuck in NVML): counted."""
        if self.gpu is not None:
            self.gpu.late += 1

    def finish(self, tick: Tick) -> bool:
        """In the clock thread, after `read`: the tick's GPU part made without the loop (GpuSource.finish); False
        when it needs the loop."""
        return self.gpu.finish(tick) if self.gpu is not None else True


class GpuSource:
    """NVML through the GPU sampler, one sample at a time, never waited for past the tick's deadline.

    A GPU that answers slowly makes the tick carry no GPU rows (counted in `late`) rather than hold the host,
    serving and store parts back; the sample still running is reused by the next tick, never doubled. Read in the
    clock thread (`read`); the loop takes the outcome (`sample_now`: rows, the supervisor's view, static facts).
    """

    def __init__(self, sampler: Any, view: Any, on_static: Callable[[list[dict]], None],
                 collector: EventCollector):
        self.sampler = sampler
        self.view = view  # node.NodeGpuView: what the supervisor reads about the GPUs
        self.on_static = on_static  # the GPUs' static facts, when they changed (a re-initialisation)
        self.collector = collector  # where the sampler's on_event puts its events
        self.gate = GpuGate()
        self.late = 0  # ticks without GPU rows: NVML slower than the tick's deadline
        self._static_version: int | None = None

    def read(self, tick: Tick) -> None:
        """In the clock thread: the GPU sample for `tick.pids`, waited for until the tick's deadline."""
        try:
            got = self.gate.sample(self.sampler.sample, tick.pids, max(time.monotonic() + 0.05, tick.deadline))
        except Exception as exc:  # noqa: BLE001 - the tick's error, raised on the loop with the stage's others
            tick.gpu = exc
            return
        if got is None:
            self.late += 1
        tick.gpu = got

    def sample_now(self, tick: Tick) -> tuple[Rows, list[Event]]:
        got = tick.gpu
        if isinstance(got, Exception):
            raise got
        if got is None:  # late: no GPU rows this tick
            return {}, self.collector.drain()
        if self.sampler.static_version != self._static_version:
            self._static_version = self.sampler.static_version
            self.on_static(self.sampler.static())
        return self._rows(tick, got), self.collector.drain()

    def finish(self, tick: Tick) -> bool:
        """In the clock thread: the tick's GPU rows put in `tick.rows` when nothing in them needs the loop (a sample
        on time, no event waiting, the same static facts); False, nothing done, leaves them to `sample_now`."""
        got = tick.gpu
        if (not isinstance(got, tuple) or self.collector.pending()
                or self.sampler.static_version != self._static_version):
            return False
        tick.rows.update(self._rows(tick, got))
        return True

    def _rows(self, tick: Tick, got: tuple[float, Any]) -> Rows:
        """The sample's rows; the supervisor's view updated (from the clock thread too: NodeGpuView.update)."""
        started, gpu_tick = got
        # the rows are stored under the tick's time: the view must not claim a later one
        self.view.update(min(started, tick.t0), gpu_tick.process_rows, self.sampler.status(), self.sampler.static())
        return {"gpu_rows": gpu_tick.gpu_rows, "nvlink_rows": gpu_tick.nvlink_rows,
                "process_rows": gpu_tick.process_rows}

    async def sample(self, tick: Tick) -> tuple[Rows, list[Event]]:
        return self.sample_now(tick)


@dataclass(frozen=True)
class ScrapeTarget:
    url: str
    run_id: int | None
    run_token: str | None  # tells two runs apart even when the store could not give either an id
    # the run's vLLM version where it knows one (GET /version at readiness): names a family the page lacks without
    # a GET of its own; not part of the run's identity (a version learnt later is the same run)
    vllm_version: str | None = field(default=None, compare=False)


class ScrapeSource:
    """The served vLLM's `/metrics`: the serving row, outage and counter-reset events, and hang verdicts.

    One scraper and one hang detector per run (a new run starts its own windows and its own hang clock). The
    scrape runs every `interval_s` (a multiple of the tick at 10 Hz sampling) as a task of its own: a tick waits
    for it only until the tick's deadline, and a page slower than that is collected by a later tick or cut off
    at `timeout_s` (one outage event), so a slow or huge page never holds the GPU and host samples back.
    """

    def __init__(self, http: HttpClient, target: Callable[[], ScrapeTarget | None], *, window_s: float,
                 timeout_s: float, hang_timeout_s: float, on_new_run: Callable[[], None],
                 on_verdict: Callable[[Verdict], None], interval_s: float = 0.0):
        self.http = http
        self.target = target  # None while nothing serves
        self.window_s = window_s
        self.timeout_s = timeout_s
        self.interval_s = interval_s  # 0: every tick
        self.hang_timeout_s = hang_timeout_s
        self.on_new_run = on_new_run
        self.on_verdict = on_verdict
        self.scraper: Any = None
        self.hang: HangDetector | None = None
        self.engines: list[dict[str, Any]] = []  # per-engine load of the last page read
        self.totals: Any = None  # agent/lifetime.ServingTotals: every run's counts, for the exporter
        self._key: ScrapeTarget | None = None
        self._pending: asyncio.Task | None = None
        self._next = 0.0
        self._cut_backoff = 0.0  # seconds the next scrape waits after a page cut off (0: none cut off last)
        # the target `sample_now` read for the tick it left to `sample`: one read a tick (node.py's builds the
        # supervisor's whole serving status to say whether it serves)
        self._asked: tuple[Tick, ScrapeTarget] | None = None

    @property
    def scraped_target(self) -> ScrapeTarget | None:
        """The run whose page `scraper` reads (the target it was made for); None before any."""
        return self._key

    def _for(self, target: ScrapeTarget) -> tuple[Any, HangDetector]:
        from lynxtop.agent.metrics.lifetime import ServingTotals
        from lynxtop.agent.metrics.scrape import MetricsScraper

        if self.totals is None:
            self.totals = ServingTotals()
        if self.scraper is None or self.hang is None or (target is not self._key and target != self._key):
            errors = 0
            if self.scraper is not None:
                self.scraper.close()  # its kept connection to the previous run's server
                errors = self.scraper.scrape_errors
            self.scraper = MetricsScraper(target.url, window_s=self.window_s, timeout_s=self.timeout_s)
            # failed scrapes count since the agent started (contract/columns.py), not per run: the counter
            # lynxtop_serving_scrape_errors_total must not fall to 0 at every restart of vLLM
            self.scraper.scrape_errors = errors
            if target.vllm_version:
                self.scraper.vllm_version = target.vllm_version
            # a gap between readings far longer than the usual one (plus a scrape's timeout) is time the agent did
            # not watch (stopped, the VM paused), never stall time
            self.hang = HangDetector(self.hang_timeout_s, slack_s=self.timeout_s)
            self._key = target
            self._pending = None  # a scrape of the previous run is not this run's
            self._next = self._cut_backoff = 0.0
            self.on_new_run()
        return self.scraper, self.hang

    def resumed(self, now: float) -> None:
        """The agent was stopped (SIGSTOP, a VM pause) and runs again: the run's hang detector counts the gap to
        its next reading as not watched (HangDetector.resumed), and so does the /health probe (HttpClient.resumes).
        Called from the watchdog's thread (Ticker.resumed); a detector made after it starts with no reading, so it
        has nothing to forget."""
        hang = self.hang
        if hang is not None:
            hang.resumed(now)
        if hasattr(self.http, "resumes"):
            self.http.resumes += 1  # the /health probe's silence over the pause was not watched either

    def loop_due(self) -> float:
        """The tick start (monotonic) from which a tick must reach the loop for this source: at once while a scrape
        runs, the next scrape's due time, none (inf) while nothing was served (a new target is seen by the loop's
        once-a-second tick). Read by the clock thread: a tick before it is written without the loop."""
        if self._pending is not None:
            return -math.inf
        return self._next if self.scraper is not None else math.inf

    def sample_now(self, tick: Tick) -> Any:
        """This tick's answer when there is nothing to wait for (nothing served, or no scrape due or running: 9
        ticks in 10 at 10 Hz), else NOT_NOW with nothing done (`sample` then)."""
        target = self.target()
        if target is not None and (self._pending is not None or tick.t0 >= self._next or self.scraper is None
                                   or (target is not self._key and target != self._key)):  # a new run's
            self._asked = (tick, target)
            return NOT_NOW
        refused = [as_event(ev, run_id=target.run_id if target else None) for ev in self._http_events()]
        if target is None:
            self.engines = []
            return {"serving_row": None}, refused
        return {}, refused  # not due: this tick carries no serving row

    async def sample(self, tick: Tick) -> tuple[Rows, list[Event]]:
        asked, self._asked = self._asked, None
        target = asked[1] if asked is not None and asked[0] is tick else self.target()
        refused = [as_event(ev, run_id=target.run_id if target else None) for ev in self._http_events()]
        if target is None:
            self.engines = []
            return {"serving_row": None}, refused
        rows, events = await self._sample(tick, target)
        return rows, refused + events

    def _http_events(self) -> list[dict[str, Any]]:
        drain = getattr(self.http, "drain_events", None)  # /version and /health answers over the cap
        return drain() if drain is not None else []

    async def _sample(self, tick: Tick, target: ScrapeTarget) -> tuple[Rows, list[Event]]:
        scraper, hang = self._for(target)
        if self._pending is None:
            if tick.t0 < self._next:
                return {}, []  # not due: this tick carries no serving row
            self._next = max(self._next + self.interval_s, tick.t0) if self._next else tick.t0 + self.interval_s
            self._pending = asyncio.get_running_loop().create_task(scraper.scrape(self.http.session(), tick.t0))
        done, _ = await asyncio.wait({self._pending}, timeout=max(0.05, tick.deadline - time.monotonic()))
        if self._pending not in done:
            return {}, []  # still reading: a later tick takes it (the scraper cuts it off at its timeout)
        task, self._pending = self._pending, None
        try:
            row = task.result()
            self.totals.observe(scraper)
        except Exception as exc:  # noqa: BLE001 - a scrape problem never costs the tick its GPU and host rows
            if not scraper.in_outage:
                log.warning("reading %s failed", scraper.url, exc_info=exc)  # once per outage: for the bug report
            row = scraper.failed(tick.t0, f"cannot read the page at {scraper.url}: {type(exc).__name__}: {exc}")
        if self._cut_backoff or (not row["scrape_ok"] and (scraper.last_error or "").startswith(CUT_OFF)):
            self._back_off(scraper, tick.t0)  # a page cut off, or the first page after one
        row["run_id"] = target.run_id
        self.engines = list(scraper.engines)
        events = [as_event(ev, run_id=target.run_id) for ev in scraper.events(tick.t0)]
        verdict = hang.observe(scraper.requests_running, scraper.generation_tokens_total,
                               row.get("requests_waiting"), now=tick.t0, row=row, engines=self.engines)
        if hang.moved_at is not None and hasattr(self.http, "engine_moved_at"):
            self.http.engine_moved_at = hang.moved_at  # the /health probe's "frozen" asks whether the engine moves
        if hasattr(self.http, "engine_idle_since"):
            self.http.engine_idle_since = hang.idle_since  # the idle probe asks an engine idle that long
        if verdict is not None:
            self.on_verdict(verdict)
        return {"serving_row": row}, events

    def _back_off(self, scraper: Any, now: float) -> None:
        """A page cut off (too slow, too large) was read up to the cut-off: at every tick that is up to 15 % of a
        core at 10 Hz for nothing. While such pages go on, the next scrape waits CUT_BACKOFF_FIRST_S, doubling to
        CUT_BACKOFF_MAX_S; a page read whole restores the cadence. Other failures (refused, HTTP 500) are cheap
        and keep it: their recovery is seen at once."""
        if not (scraper.last_error or "").startswith(CUT_OFF):
            self._cut_backoff = 0.0
            return
        self._cut_backoff = min(CUT_BACKOFF_MAX_S, max(self._cut_backoff * 2, CUT_BACKOFF_FIRST_S,
                                                       2 * self.interval_s))
        self._next = max(self._next, now + self._cut_backoff)

    def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
        if self.scraper is not None:
            self.scraper.close()


class SlaSource:
    """The SLA over the tick's serving row: breach and recovery events (the state is read by the status)."""

    def __init__(self, tracker: Any):
        self.tracker = tracker

    async def sample(self, tick: Tick) -> tuple[Rows, list[Event]]:
        return self.sample_now(tick)

    def sample_now(self, tick: Tick) -> tuple[Rows, list[Event]]:
        if "serving_row" not in tick.rows:
            return {}, []  # no scrape this tick (scraping slower than sampling): the SLA waits for the next page
        events = self.tracker.update(tick.rows.get("serving_row"), tick.ts_ms)
        return {}, [dataclasses.replace(ev, run_id=tick.run_id) for ev in events]
