"""The agent's status, built from the node's parts: the `Status` the API and the exporter serve, the status line.

Reads the node's parts (supervisor, ticker, GPU view, store writer, listeners) and writes nothing: the node owns
them and wires this view to them; every field's meaning is contract/status.py's.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lynxtop import __version__
from lynxtop.agent.api import connguard
from lynxtop.agent.clock import span
from lynxtop.agent.serving import heldaction
from lynxtop.agent.serving.run import now_ms
from lynxtop.contract.files import free_bytes
from lynxtop.contract.status import (
    GPU_METRIC_NAMES,
    AgentStatus,
    ClusterStatus,
    EngineLoad,
    GpuStatus,
    HostStatus,
    NvmlStatus,
    ServingMetrics,
    ServingState,
    ServingStatus,
    SlaStatus,
    Status,
    StoreStatus,
    join_json,
    without_callers,
)

if TYPE_CHECKING:
    from lynxtop.agent.node import Node

FREE_EVERY_S = 5.0  # how often the database's file system's free space is read for the status


class FreeSpace:
    """Free bytes of the file system that holds a path, read with statvfs at most once every `every_s`: every
    GET /v1/status and scrape builds the store's status, and a poller at 4 Hz needs no fresher figure."""

    def __init__(self, path: str | os.PathLike[str], every_s: float = FREE_EVERY_S,
                 clock: Callable[[], float] = time.monotonic):
        self.path = Path(path)
        self.every_s = every_s
        self._clock = clock
        self._read_at: float | None = None
        self._free: int | None = None

    def bytes(self) -> int | None:
        """The last reading, renewed when older than `every_s`; None when it cannot be read."""
        now = self._clock()
        if self._read_at is None or now - self._read_at >= self.every_s:
            self._read_at, self._free = now, free_bytes(self.path)
        return self._free


def with_not_served(serving: ServingStatus, src: Any, run_token: str | None) -> ServingStatus:
    """`serving` with the quantities the served vLLM's page lacks and its version (the run's scraper,
    agent/metrics/served.py): an empty column then reads "not served", not "no traffic". Only while it serves, and
    only the current run's list: the scraper outlives its run (a stopped run's page is no one's now), and a new run is
    ready a tick or more before the sampling path makes its scraper, so until then the source's scraper is the
    previous run's (its list, under its version or the new run's, is no claim about this run). The list is the run's
    whose page it read (the source's target); `serving.run_id` and `run_token` (the lifecycle's) name the current
    one."""
    scraper = _current_scraper(serving, src, run_token)
    if scraper is None:
        return serving  # another run's list, or one no run can be told from: none shown until this run's page
    missing = tuple(scraper.not_served)
    if not missing:
        return serving
    version = scraper.vllm_version or serving.vllm_version  # GET /version's, else the run's (the same run: checked)
    return dataclasses.replace(serving, not_served=missing, not_served_version=version)


def with_window_counts(serving: ServingStatus, src: Any, run_token: str | None,
                       row: dict[str, Any] | None) -> ServingStatus:
    """`serving` with how many observations each latency series' window holds (`window_counts`, `window_s`), so a
    p99 of one request reads as one. Only beside the percentiles they count: `row` is the serving row the status
    shows (the ticker's latest), and the counts are the scraper's for that very row (a failed page's row has no
    percentiles, a newer page's counts are not this row's); only the current run's, as `with_not_served`. Read
    from what the scrape computed already: nothing parsed or walked per GET."""
    scraper = _current_scraper(serving, src, run_token)
    counted = getattr(scraper, "counted", None) if scraper is not None else None
    if counted is None or row is None or counted[0] is not row:
        return serving
    return dataclasses.replace(serving, window_counts=counted[1], window_s=float(scraper.window_s))


def _current_scraper(serving: ServingStatus, src: Any, run_token: str | None) -> Any:
    """The source's scraper where it reads the current run's page while it serves (`with_not_served`); else None."""
    scraper = src.scraper if src is not None else None
    if scraper is None or not serving.state.serving:
        return None
    read = scraped_run(src)
    if read is None or (read.run_id, read.run_token) != (serving.run_id, run_token) or (
            read.run_id is None and read.run_token is None):
        return None
    return scraper


def scraped_run(src: Any) -> Any:
    """The run whose page the source's current scraper reads (agent/sampling.py ScrapeSource.scraped_target); None
    before any."""
    return getattr(src, "scraped_target", None)


class StatusView:
    def __init__(self, node: Node):
        self._node = node
        self._tick_key: tuple[tuple[Any, ...], tuple[Any, ...]] | None = None  # what the cached tick part read
        self._tick = Status()  # the tick part built from those sources: the same objects until they change
        self._tick_text: str | None = None  # its tick_json(), encoded when first asked for
        self._free: FreeSpace | None = None  # made at the first status: the database's path is the config's

    def body(self, dumps: Callable[[Any], str], tcp: bool = False) -> str:
        """GET /v1/status's JSON text: `dumps(self.status().to_json())`, with the part only a tick changes (GPUs,
        host, serving metrics, engines: most of the text) encoded once per tick for every poller.

        That part is keyed by the identity of what it is built from (tick_part), so the first GET after a tick
        reads the new tick; the rest (states, actions, listeners, the clock) is built on every GET, so any change is
        in the next answer (issue 29.3). `tcp`: the open TCP endpoint's answer, without who asked for an action
        (`without_callers`; only the head holds one, so the tick part's text is shared)."""
        tick = self.tick_part()
        if self._tick_text is None:
            self._tick_text = dumps(tick.tick_json())
        head = self._head().head_json()
        return join_json(dumps(without_callers(head) if tcp else head), self._tick_text)

    def tick_part(self) -> Status:
        """The part of the status only a tick changes (GPUs, host, serving metrics, engines), built once per change
        of its sources and the same objects until then: keyed by the identity of what it is built from (each tick
        replaces the rows, a scrape its engines), so GET /v1/status encodes it and GET /metrics renders it once per
        tick (agent/metrics/exporter.py keys its page by these objects' identity, never compares them by value)."""
        n = self._node
        src = n.scrape_source
        sources = (n.ticker.latest_gpu_rows, n.gpu_view.static, n.ticker.latest_host, n.ticker.latest_serving,
                   src.engines if src is not None else None)
        xids = tuple(sorted(dict(n.xid_errors).items()))  # counted in place by the XID poll: compared by value
        cached = self._tick_key
        if cached is None or cached[1] != xids or any(a is not b for a, b in zip(cached[0], sources, strict=True)):
            self._tick = Status(gpus=self.gpu_statuses(), host=HostStatus.from_json(n.ticker.latest_host),
                                serving_metrics=ServingMetrics.from_json(n.ticker.latest_serving),
                                engines=self._engines())
            self._tick_text, self._tick_key = None, (sources, xids)
        return self._tick

    def line(self) -> str:
        """The one-line summary systemd shows (STATUS=) and the log repeats."""
        n = self._node
        sup = n.supervisor
        if sup is None:
            return "starting"
        # the four fields the line shows, as serving_status() gives them: not its whole ServingStatus (~20 fields,
        # a PhaseMark per phase) once a tick for a line that then rarely changes (issue 29.3)
        lc = sup.runs
        state, run, profile, run_id = lc.state, lc.run, lc.profile_name, lc.run_id
        parts = [f"serving {state}"]
        if profile:
            parts.append(f"profile {profile}" + (f" run {run_id}" if run_id else ""))
        phase = run.tracker.phase if run is not None and state == ServingState.STARTING else None
        if phase:
            parts.append(f"phase {phase}")
        parts.append(f"{len(n.gpu_view.static)} GPUs" + (" (SIMULATED)" if n.simulated else ""))
        if n.cluster is not None:
            parts.append(f"{n.cluster.role}, Ray {n.cluster.ray.state}")
            taken = n.cluster.gpus.taken if n.cluster.gpus is not None else ()
            if taken:  # a worker: what will make the head's vLLM ranks here run out of memory
                parts.append("GPUs held by process(es) not Ray's: " + ", ".join(f"pid {t.pid} ({t.name})"
                                                                              for t in taken))
        if n.ticker.missed_ticks:
            parts.append(f"{n.ticker.missed_ticks} missed ticks" + (f" ({n.ticker.failed_ticks} failed)"
                                                                 if n.ticker.failed_ticks else ""))
        if n.timeline.steps:
            off = n.timeline.offset_ms
            parts.append(f"wall clock stepped ({span(off)} {'ahead of' if off >= 0 else 'behind'} the samples)")
        ws = n.writer.stats() if n.writer is not None else {}
        if ws.get("rejected"):
            parts.append(f"{ws['rejected']} ticks refused by the store")
        if ws.get("wal_unlinked"):
            parts.append("history WAL was unlinked: " + ("recovered" if ws.get("wal_recovered")
                                                         else "NOT recovered, history at risk"))
        if ws.get("db_swapped"):
            parts.append("history database file was deleted or replaced under the agent (see status)")
        return "; ".join(parts)

    def status(self) -> Status:
        tick = self.tick_part()
        return dataclasses.replace(self._head(), gpus=tick.gpus, host=tick.host, serving_metrics=tick.serving_metrics,
                                   engines=tick.engines)

    def _head(self) -> Status:
        """The status without its tick part (see `body`)."""
        n = self._node
        sup = n.supervisor
        assert sup is not None
        sla = n.sla.state() if n.sla is not None else SlaStatus()
        now = now_ms()  # the status is taken as it is answered: its time and the clock the dashboard counts from
        return Status(ts_ms=now, now_ms=now, agent=self._agent(now), serving=self._serving(), sla=sla,
                      cluster=self._cluster())

    def _serving(self) -> ServingStatus:
        """The supervisor's serving status; while it stops a live run, with the timeouts that stop runs under.

        The stop (lifecycle.stop_current) SIGTERMs the run and kills what is left after the profile's
        stop_grace_s; vLLM drains in-flight requests for the profile's --shutdown-timeout meanwhile. A run that
        crashed has nothing to drain and is cleaned up under a shorter grace: nothing is said for it."""
        sup = self._node.supervisor
        assert sup is not None
        src, token = self._node.scrape_source, sup.runs.run_token()
        serving = with_not_served(sup.serving_status(), src, token)
        serving = with_window_counts(serving, src, token, self._node.ticker.latest_serving)
        if (held := heldaction.status_of(sup)) is not None:  # a server the previous agent left, held unsupervised
            serving = dataclasses.replace(serving, held=held)
        lc = sup.runs
        run, prof = lc.run, lc.profile
        if serving.state != ServingState.STOPPING or run is None or prof is None or run.crash_reason:
            return serving
        return dataclasses.replace(serving, shutdown_timeout_s=float(prof.shutdown_timeout_s),
                                   stop_grace_s=float(prof.stop_grace_s))

    def serving_totals(self) -> Any:
        """Every run's serving counts since the agent started (agent/metrics/lifetime.py), per model: the exporter's."""
        n = self._node
        totals = n.scrape_source.totals if n.scrape_source is not None else None
        return totals.models if totals is not None else None

    def _cluster(self) -> ClusterStatus:
        n = self._node
        if n.cluster is None:
            return ClusterStatus()
        prof = n.supervisor.profile if n.supervisor is not None else None
        return n.cluster.status(prof.gpus_needed if prof is not None and prof.uses_ray else None)

    def _engines(self) -> tuple[EngineLoad, ...]:
        n = self._node
        src = n.scrape_source
        return tuple(EngineLoad.from_json(e) for e in src.engines) if src is not None else ()

    def _agent(self, now: int) -> AgentStatus:
        """The agent's part; `now`: the status's `now_ms` (the timeline), which `last_tick_ms` is counted back from."""
        n = self._node
        sup = n.supervisor
        assert sup is not None
        ws = n.writer.stats() if n.writer is not None else {}
        return AgentStatus(
            version=__version__, pid=os.getpid(), host=n.host, started_ms=n.started_ms,
            uptime_s=round(time.monotonic() - n.started_mono, 1), simulated=n.simulated,
            healthy=n.ticker.healthy(), missed_ticks=n.ticker.missed_ticks, sample_interval_s=n.interval,
            gpu_late_ticks=n.gpu_late, failed_ticks=n.ticker.failed_ticks, last_tick_error=n.ticker.last_tick_error,
            connections={name: part.guard.stats() for name, part in (("api", n.api), ("metrics", n.exporter))
                         if part is not None},
            descriptors={"open": connguard.open_fds(), "limit": n.fd_plan.soft if n.fd_plan else None},
            nvml=NvmlStatus(**{k: n.gpu_view.nvml.get(k, "") for k in ("state", "message", "driver_version",
                                                                          "nvml_version")}),
            clock_steps=n.timeline.steps, clock_offset_ms=n.timeline.offset_ms,
            last_clock_step_ms=n.timeline.last_step.step_ms if n.timeline.last_step else None,
            last_tick_ms=self._last_tick_ms(now),
            store=self._store(ws),
            action=sup.action_status(),
            live_restore=n.cfg.agent.live_restore,
        )

    def _last_tick_ms(self, now: int) -> int | None:
        """When the last tick was written, on the status's clock: `now` less the monotonic time since (the ticker's
        `last_tick_done`), so a wall-clock step moves neither (the ticker's `last_tick_unix` is wall time, for
        /metrics' rules that compare it to time())."""
        done = self._node.ticker.last_tick_done
        return None if done is None else now - max(0, round((time.monotonic() - done) * 1000))

    def _store(self, ws: dict[str, Any]) -> StoreStatus:
        """The writer's counts and state (its `stats()`, read by `_agent`) with the free space of the database's
        file system: a full disk must show as the cause, with where it is and what is queued or lost."""
        path = self._node.cfg.agent.database
        if self._free is None:
            self._free = FreeSpace(path)
        return StoreStatus(path=str(path), queued=ws.get("queued"),
                           dropped=ws.get("dropped"), rejected=ws.get("rejected"), last_error=ws.get("last_error"),
                           last_error_ms=ws.get("last_error_ms"), retrying=ws.get("retrying"),
                           free_bytes=self._free.bytes(), wal_unlinked=ws.get("wal_unlinked"),
                           wal_unlinked_ms=ws.get("wal_unlinked_ms"), wal_recovered=ws.get("wal_recovered"),
                           db_swapped=ws.get("db_swapped"), db_swapped_ms=ws.get("db_swapped_ms"))

    def gpu_statuses(self) -> tuple[GpuStatus, ...]:
        n = self._node
        by_idx = {r.get("gpu"): r for r in n.ticker.latest_gpu_rows}
        return tuple(
            GpuStatus(index=g.get("idx"), name=g.get("name"), uuid=g.get("uuid"), pci_bus_id=g.get("pci_bus_id"),
                      arch=g.get("arch"), gpm_supported=g.get("gpm_supported"), nvlink_count=g.get("nvlink_count"),
                      xid_errors=n.xid_errors.get(g.get("idx"), 0),
                      metrics={k: by_idx.get(g.get("idx"), {}).get(k) for k in GPU_METRIC_NAMES})
            for g in n.gpu_view.static)
