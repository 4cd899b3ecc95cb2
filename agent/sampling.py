"""The samplers of one tick behind one protocol: each returns `(rows, events)`.

The tick (node.py) runs the samplers in stages, the samplers of one stage at once: the host first (it finds the
vLLM processes the GPU sampler attributes memory to), then NVML and the `/metrics` scrape side by side (a slow
GPU must not hold the scrape back), then the SLA over the scraped row. Rows are merged into the tick's
`submit_tick` arguments; events of every sampler reach the store through the one function the node gives.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from lynxtop.agent.serving.health import HangDetector, HttpClient, Verdict
from lynxtop.contract.events import Event

log = logging.getLogger("lynxtop.agent")
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


class Sampler(Protocol):
    async def sample(self, tick: Tick) -> tuple[Rows, list[Event]]: ...


async def sample_stages(stages: Sequence[Sequence[Sampler]], tick: Tick) -> Exception | None:
    """Run the stages in order into `tick.rows` and `tick.events`; the first failure ends the tick.

    The events of the samplers that did answer are kept in `tick.events` even then (an outage begins with one).
    """
    for stage in stages:
        # A stage's last sampler runs in the tick's own task, the others as tasks beside it: every task and gather
        # costs loop turns, and at 10 Hz each turn while the GPU job runs in the executor is a GIL hand-over
        # (issue 29.3). Results and errors are gather's (return_exceptions), in the stage's order.
        others = [asyncio.ensure_future(s.sample(tick)) for s in stage[:-1]]
        try:
            last: Any = await stage[-1].sample(tick)
        except Exception as exc:  # noqa: BLE001 - the stage's error, as gather returned it
            last = exc
        except BaseException:
            for task in others:  # cancelled (the agent stopping): so are the stage's other samplers, as by gather
                task.cancel()
            raise
        results = [*(await asyncio.gather(*others, return_exceptions=True) if len(others) > 1 else
                     [await _result(others[0])] if others else []), last]
        error: BaseException | None = None
        for res in results:
            if isinstance(res, BaseException):
                error = error or res
                continue
            rows, events = res
            tick.rows.update(rows)
            tick.events.extend(events)
        if error is not None:
            if not isinstance(error, Exception):
                raise error
            return error
    return None


async def _result(task: asyncio.Future) -> Any:
    """A sampler task's result, or its error as a value (gather's return_exceptions, without a gather)."""
    try:
        return await task
    except Exception as exc:  # noqa: BLE001 - the stage's error
        return exc


def as_event(d: Mapping[str, Any], run_id: int | None = None, ts_ms: int | None = None) -> Event:
    """An event dict of a sampler that speaks dicts (kind, severity, message, details), with the dotted kind."""
    return Event.from_json({**d, "run_id": run_id, "ts_ms": d.get("ts_ms", ts_ms)})  # the one mapping of kinds


class EventCollector:
    """An `on_event(kind, severity, message, details)` sink that keeps the events for the next tick.

    The GPU sampler reports from its own threads (NVML calls, the XID watcher): events are stamped when they
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


def _settle(fut: asyncio.Future, result: Any = None, exc: BaseException | None = None) -> None:
    """Resolve `fut` from the loop (a tick cancelled meanwhile has dropped it)."""
    if not fut.done():
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)


class HostSource:
    """psutil's host row, and the pids of the served run for the GPU sampler.

    With a `gpu` source whose previous sample is done, the host row and the GPU sample are one executor job
    (the host first, then NVML with its pids): at 10 Hz the executor hand-off cost as much as the sampling
    itself (issue 29.3), so a tick pays one, not two. The host row comes back to the tick as soon as it is
    read; the GPU part is waited for by the GPU source in the next stage, as before.
    """

    def __init__(self, sampler: Any, members: Callable[[], Awaitable[set[int]]], gpu: GpuSource | None = None):
        self.sampler = sampler
        self.members = members  # processes of the run outside the leader's tree
        self.gpu = gpu

    async def sample(self, tick: Tick) -> tuple[Rows, list[Event]]:
        root = tick.root
        members = await self.members() if root is not None else set()

        def host_part() -> tuple[frozenset[int], dict]:
            row = self.sampler.sample(root)
            return self.sampler.tree_pids, row  # the members that row read: /proc once per process a tick

        gpu = self.gpu
        if gpu is None or not gpu.idle():  # a GPU sample still running (slow NVML) never holds the host back
            pids, row = await asyncio.to_thread(host_part)
        else:
            loop = asyncio.get_running_loop()
            host_done: asyncio.Future = loop.create_future()

            def both() -> Any:
                try:
                    res = host_part()
                except Exception as exc:  # noqa: BLE001 - the tick's error, raised by the await below
                    loop.call_soon_threadsafe(_settle, host_done, None, exc)
                    return None  # no GPU sample: the tick ends here and the next starts a new one
                loop.call_soon_threadsafe(_settle, host_done, res)
                return gpu.sampler.sample(set(res[0]) | members)

            def ended(job: asyncio.Task) -> None:  # a job that could not run (no thread to be had) fails the tick
                if not host_done.done():  # the row, when read, was settled before this callback came
                    exc = None if job.cancelled() else job.exception()
                    _settle(host_done, None, exc or RuntimeError("the host sample ended without a row"))

            gpu.start(both).add_done_callback(ended)
            pids, row = await host_done
        tick.pids = set(pids) | members
        return {"host_row": row}, []


class GpuSource:
    """NVML through the GPU sampler, one sample at a time, never waited for past the tick's deadline.

    A GPU that answers slowly makes the tick carry no GPU rows (counted in `late`) rather than hold the host,
    serving and store parts back; the sample still running is reused by the next tick, never doubled.
    """

    def __init__(self, sampler: Any, view: Any, on_static: Callable[[list[dict]], None],
                 collector: EventCollector):
        self.sampler = sampler
        self.view = view  # node.NodeGpuView: what the supervisor reads about the GPUs
        self.on_static = on_static  # the GPUs' static facts, when they changed (a re-initialisation)
        self.collector = collector  # where the sampler's on_event puts its events
        self.late = 0
        self._pending: asyncio.Task | None = None
        self._started: float | None = None
        self._static_version: int | None = None
        self._started_here = False  # _pending was started by the host source for the tick now running

    def idle(self) -> bool:
        """No GPU sample running: the host source may start this tick's (GpuSource.start)."""
        return self._pending is None or self._pending.done()

    def start(self, job: Callable[[], Any]) -> asyncio.Task:
        """Run `job` (the host row, then `sampler.sample`) as this tick's GPU sample: one executor hand-off."""
        self._started = time.monotonic()
        self._pending = asyncio.get_running_loop().create_task(asyncio.to_thread(job))
        self._started_here = True
        return self._pending

    def _task(self, pids: set[int]) -> asyncio.Task:
        """The running GPU sample, or a new one: never two NVML samples at once."""
        if self._started_here and self._pending is not None:
            self._started_here = False  # the sample the host source started for this tick, done or not
            return self._pending
        if self._pending is None or self._pending.done():
            self._started = time.monotonic()
            self._pending = asyncio.get_running_loop().create_task(asyncio.to_thread(self.sampler.sample, pids))
        return self._pending

    async def sample(self, tick: Tick) -> tuple[Rows, list[Event]]:
        task = self._task(tick.pids)
        done, _ = await asyncio.wait({task}, timeout=max(0.05, tick.deadline - time.monotonic()))
        if task not in done:
            self.late += 1
            return {}, self.collector.drain()
        self._pending = None
        gpu_tick = task.result()
        if gpu_tick is None:  # the host part of the job failed (that tick failed): no GPU rows from it
            return {}, self.collector.drain()
        if self._started is not None:
            # the rows are stored under the tick's time: the view must not claim a later one
            seen = min(self._started, tick.t0)
            self.view.update(seen, gpu_tick.process_rows, self.sampler.status(), self.sampler.static())
        if self.sampler.static_version != self._static_version:
            self._static_version = self.sampler.static_version
            self.on_static(self.sampler.static())
        return ({"gpu_rows": gpu_tick.gpu_rows, "nvlink_rows": gpu_tick.nvlink_rows,
                 "process_rows": gpu_tick.process_rows}, self.collector.drain())


@dataclass(frozen=True)
class ScrapeTarget:
    url: str
    run_id: int | None
    run_token: str | None  # tells two runs apart even when the store could not give either an id


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

    def _for(self, target: ScrapeTarget) -> tuple[Any, HangDetector]:
        from lynxtop.agent.metrics.lifetime import ServingTotals
        from lynxtop.agent.metrics.scrape import MetricsScraper

        if self.totals is None:
            self.totals = ServingTotals()
        if self.scraper is None or self.hang is None or self._key != target:
            if self.scraper is not None:
                self.scraper.close()  # its kept connection to the previous run's server
            self.scraper = MetricsScraper(target.url, window_s=self.window_s, timeout_s=self.timeout_s)
            self.hang = HangDetector(self.hang_timeout_s)
            self._key = target
            self._pending = None  # a scrape of the previous run is not this run's
            self._next = 0.0
            self.on_new_run()
        return self.scraper, self.hang

    async def sample(self, tick: Tick) -> tuple[Rows, list[Event]]:
        target = self.target()
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
        row["run_id"] = target.run_id
        self.engines = list(scraper.engines)
        events = [as_event(ev, run_id=target.run_id) for ev in scraper.events(tick.t0)]
        verdict = hang.observe(scraper.requests_running, scraper.generation_tokens_total,
                               row.get("requests_waiting"), now=tick.t0)
        if verdict is not None:
            self.on_verdict(verdict)
        return {"serving_row": row}, events

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
        if "serving_row" not in tick.rows:
            return {}, []  # no scrape this tick (scraping slower than sampling): the SLA waits for the next page
        events = self.tracker.update(tick.rows.get("serving_row"), tick.ts_ms)
        return {}, [dataclasses.replace(ev, run_id=tick.run_id) for ev in events]
