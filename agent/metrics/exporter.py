"""The optional read-only Prometheus endpoint: `lynxtop_*` metrics from the agent's cached status snapshot.

It lives on its own TCP listener with no control routes, because Prometheus' model treats metrics as readable
by anyone who can reach the port; the control socket stays the only way to change anything. `collect()` does no
I/O: it only reshapes the snapshot the agent already holds, so a scrape can never stall sampling.
"""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from aiohttp import hdrs, web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from lynxtop.agent.api.connguard import ConnectionGuard, Episodes, GuardedSite, handler_args
from lynxtop.agent.api.tcpreads import TcpReads, add_refusals
from lynxtop.agent.metrics.lifetime import ModelTotals
from lynxtop.agent.metrics.textpage import TextPage
from lynxtop.agent.serving.startup import PHASES as STARTUP_PHASES
from lynxtop.contract.columns import LATENCY_SERIES
from lynxtop.contract.exported import Exported, exported
from lynxtop.contract.format import THROTTLE_REASONS
from lynxtop.contract.status import (
    AgentStatus,
    ClusterStatus,
    EngineLoad,
    GpuStatus,
    RayState,
    Role,
    ServingState,
    ServingStatus,
    SlaState,
    SlaStatus,
    Status,
    without_callers,
)

_log = logging.getLogger("lynxtop.exporter")

DEFAULT_MAX_CONNECTIONS = 64  # [agent] metrics_max_connections: a few Prometheus servers and the odd curl

SERVING_STATES = tuple(s.value for s in ServingState)
DEGRADED_CONDITIONS = ("hang", "unresponsive", "health")  # why a run is degraded (agent/serving/health.py)
SLA_STATES = tuple(s.value for s in SlaState)
# NVML's states (agent/gpu/sampler.py): "error" is a failing library (event nvml.unavailable, error), "no-driver" a
# node without an NVIDIA driver (the same event, warning): alerts tell them apart as the events do
NVML_STATES = ("ok", "error", "no-driver")
# The readings taken every tick (agent/gpu/unreadable.py): none of them read while the GPU is not lost is a GPU whose
# readings fail (gpu.unreadable); those read less often carry their last value, so they cannot tell
_TICK_READINGS = ("util_gpu_pct", "power_w", "sm_clock_mhz", "throttle_reasons")
RAY_STATES = tuple(s.value for s in RayState if s != RayState.OFF)  # OFF is a single node's: no Ray series there
# NVML's clock event (throttle) reasons as `reason` label values, dcgm-exporter's DCGM_FI_DEV_CLOCK_THROTTLE_REASONS
# bits one series each; "other" holds any bit this table does not name
_THROTTLE = tuple((bit, name.replace(" ", "_").lower()) for bit, name, _ in THROTTLE_REASONS)
_SIMULATED_HELP = "1 when any part of this node (GPUs or vLLM) is SIMULATED"

# The plain per-column families, derived from the column contract (contract/exported.py)
_GPU = exported("gpu")
_HOST = exported("host")
_SERVING = exported("serving")
# Per data-parallel engine, labelled `engine` as vLLM labels it: (EngineLoad field, metric suffix, help, scale)
_ENGINE = (
    ("running", "requests_running", "Requests running on one data-parallel engine", 1),
    ("waiting", "requests_waiting", "Requests waiting on one data-parallel engine", 1),
    ("kv_cache_usage_pct", "kv_cache_usage_ratio", "KV cache usage of one data-parallel engine", 0.01),
)
# Agent-lifetime counters (agent/metrics/lifetime.py), labelled model_name as vLLM's: (key, metric name, help)
_TOTALS = (
    ("prompt_tokens", "lynxtop_serving_prompt_tokens", "Prefill tokens vLLM processed since the agent started"),
    ("generation_tokens", "lynxtop_serving_generation_tokens", "Tokens vLLM generated since the agent started"),
    ("preemptions", "lynxtop_serving_preemptions", "Requests vLLM preempted since the agent started"),
)
_SERIES_HELP = {"ttft": "Time to first token", "itl": "Inter-token latency", "tpot": "Time per output token "
                "(per request)", "e2e": "End-to-end request latency", "queue": "Time requests waited in the queue",
                "prefill": "Time requests spent in prefill (vLLM's histogram; a mean TTFT - queue where vLLM has none: "
                "see lynxtop_serving_phase_times_derived)",
                "decode": "Time requests spent in decode (vLLM's histogram; a mean e2e - TTFT where vLLM has none: "
                "see lynxtop_serving_phase_times_derived)"}


def _num(v: Any) -> float | None:
    """A reading as a sample value; None (no sample) for none, or one that is not finite (issue 25.1)."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        f = float(v)
        return f if math.isfinite(f) else None
    return None


def _gauge(name: str, help_: str, value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, help_)
    g.add_metric([], value)
    return g


class SnapshotCollector(Collector):
    """Yields families from `snapshot()` (the agent's `Status`) and `totals()`
    (agent/metrics/lifetime.py's sums per model);
    a missing value is no sample."""

    def __init__(self, snapshot: Callable[[], Status | None],
                 totals: Callable[[], Mapping[str, ModelTotals] | None] | None = None,
                 last_tick: Callable[[], float | None] | None = None):
        self.snapshot = snapshot
        self.totals = totals
        self.last_tick = last_tick  # Unix time the last sampling tick was written (agent/ticker.py)

    def collect(self) -> Iterator[Any]:
        st = self.read_snapshot()
        if st is None:  # no snapshot yet: say only that nothing is known to be simulated
            yield _gauge("lynxtop_agent_simulated", _SIMULATED_HELP, 0.0)
            return
        models = self.read_totals()
        families = [*self.head(st, self.read_last_tick()), *self._listeners(st.agent), *self.rest(st, models)]
        # the `name[]` path (prometheus_client's own encoder): a label value that is not UTF-8 is written escaped
        yield from (encodable(families) if not all(_utf8(f) for f in families) else families)

    def read_last_tick(self) -> float | None:
        try:
            v = self.last_tick() if self.last_tick is not None else None
        except Exception as exc:  # as with the snapshot: the rest of the page is still served
            _log.warning("metrics last tick failed: %r", exc)
            return None
        return _num(v)

    def read_snapshot(self) -> Status | None:
        try:
            return self.snapshot()
        except Exception as exc:  # a broken snapshot must not turn the endpoint into a 500 loop
            _log.warning("metrics snapshot failed: %r", exc)
            return None

    def read_totals(self) -> Mapping[str, ModelTotals] | None:
        try:
            return self.totals() if self.totals is not None else None
        except Exception as exc:  # as with the snapshot: the rest of the page is still served
            _log.warning("metrics totals failed: %r", exc)
            return None

    # The page in three parts, in this order: `head` and `rest` change with a tick (cached by MetricsExporter),
    # the listeners' connections and descriptors between them change with every connection (built per GET)

    def head(self, st: Status, last_tick: float | None = None) -> Iterator[Any]:
        agent = st.agent
        yield _gauge("lynxtop_agent_simulated", _SIMULATED_HELP, 1.0 if agent.simulated else 0.0)
        yield _gauge("lynxtop_agent_healthy", "1 when the agent's own checks pass", float(agent.healthy))
        if last_tick is not None:  # the page is served from the cached status: a stalled sampler shows here
            yield _gauge("lynxtop_agent_last_tick_timestamp_seconds", "When the agent last wrote a sampling tick, "
                         "Unix time (time() - this: how stale every other series is)", last_tick)
        if agent.started_ms is not None:
            yield _gauge("lynxtop_agent_start_time_seconds", "Agent start, Unix time", agent.started_ms / 1000)
        for cls, name, help_, value in (
            (CounterMetricFamily, "lynxtop_agent_missed_ticks", "Sampling ticks skipped (one ran late) or failed",
             agent.missed_ticks),
            (CounterMetricFamily, "lynxtop_agent_failed_ticks", "Sampling ticks that raised an error",
             agent.failed_ticks),
            (CounterMetricFamily, "lynxtop_store_dropped_ticks", "Ticks dropped because the store writer lagged",
             agent.store.dropped),
            (GaugeMetricFamily, "lynxtop_store_queued_ticks", "Ticks waiting for the store writer",
             agent.store.queued),
        ):
            v = _num(value)
            if v is not None:  # a missing reading is left out, never shown as 0
                fam = cls(name, help_)
                fam.add_metric([], v)
                yield fam

    def rest(self, st: Status, models: Mapping[str, ModelTotals] | None) -> Iterator[Any]:
        if st.agent.nvml.state:
            yield _gauge("lynxtop_nvml_ok", "1 when NVML answers normally", 1.0 if st.agent.nvml.state == "ok"
                         else 0.0)
            nvml = GaugeMetricFamily("lynxtop_nvml_state", "1 for NVML's current state (no-driver: no NVIDIA "
                                     "driver on the node; error: the library fails or re-initialises)",
                                     labels=["state"])
            for s in NVML_STATES:
                nvml.add_metric([s], 1.0 if s == st.agent.nvml.state else 0.0)
            yield nvml
        yield from self._gpus(st.gpus)
        yield from self._simple(_HOST, st.host.metrics)
        yield from self._serving(st.serving, st.serving_metrics.metrics)
        yield from self._lifetime(models)
        yield from self._engines(st.engines)
        yield from self._sla(st.sla)
        yield from self._cluster(st.cluster)

    def _listeners(self, agent: AgentStatus) -> Iterator[Any]:
        """Connections of the control socket and this endpoint (docs/api.md, connection limits)."""
        conns = agent.connections
        for key, cls, name, help_ in (
            ("open", GaugeMetricFamily, "lynxtop_agent_connections", "Connections open on the listener"),
            ("max", GaugeMetricFamily, "lynxtop_agent_connections_max", "Connection limit of the listener"),
            ("refused", CounterMetricFamily, "lynxtop_agent_connections_refused",
             "Connections refused with 503 (limit reached)"),
            ("evicted", CounterMetricFamily, "lynxtop_agent_connections_evicted",
             "Idle or half-sent connections closed to make room"),
            ("timed_out", CounterMetricFamily, "lynxtop_agent_connections_timed_out",
             "Connections closed because no complete request came within request_timeout_s"),
            ("dropped_slow", CounterMetricFamily, "lynxtop_agent_connections_dropped_slow",
             "Connections dropped because the client read nothing of its answer for request_timeout_s"),
        ):
            fam = cls(name, help_, labels=["listener"])
            values = [(listener, _num(st.get(key))) for listener, st in sorted(conns.items())]
            for listener, v in values:
                if v is not None:
                    fam.add_metric([listener], v)
            if any(v is not None for _, v in values):
                yield fam
        for key, name, help_ in (("open", "lynxtop_agent_open_fds", "Descriptors open in the agent"),
                                 ("limit", "lynxtop_agent_max_fds", "The agent's soft RLIMIT_NOFILE")):
            v = _num(agent.descriptors.get(key))
            if v is not None:
                yield _gauge(name, help_, v)

    def _gpus(self, gpus: tuple[GpuStatus, ...]) -> Iterator[Any]:
        for col in _GPU:
            if col.counter:
                fam: Any = CounterMetricFamily(col.name[: -len("_total")], col.help, labels=["gpu", "uuid"])
            else:
                fam = GaugeMetricFamily(col.name, col.help, labels=["gpu", "uuid"])
            any_value = False
            for g in gpus:
                v = _num(g.metric(col.column))
                if v is None:
                    continue
                fam.add_metric([str(g.index), str(g.uuid or "")], v * col.scale)
                any_value = True
            if any_value:
                yield fam
        yield from self._xids(gpus)
        yield from self._throttle(gpus)
        yield from self._unreadable(gpus)

    def _unreadable(self, gpus: tuple[GpuStatus, ...]) -> Iterator[Any]:
        """1 for a GPU whose last tick read none of its per-tick readings while not lost (LynxtopGpuUnreadable):
        before, such a GPU was only a `gpu.unreadable` event, and no alert could see it. No sample without a row
        (not read yet, NVML down): unknown, never "readable"."""
        fam = GaugeMetricFamily("lynxtop_gpu_unreadable", "1 while every per-tick reading of the GPU fails (not "
                                "lost: NVML answers it errors)", labels=["gpu", "uuid"])
        for g in gpus:
            if g.metric("lost") is None:
                continue
            bad = g.metric("lost") == 0 and all(g.metric(k) is None for k in _TICK_READINGS)
            fam.add_metric([str(g.index), str(g.uuid or "")], 1.0 if bad else 0.0)
        if fam.samples:
            yield fam

    def _xids(self, gpus: tuple[GpuStatus, ...]) -> Iterator[Any]:
        """A counter from 0 on every GPU, so `increase()` sees the first XID after a start."""
        xid = CounterMetricFamily("lynxtop_gpu_xid_errors", "XID critical errors NVML reported since the agent "
                                  "started", labels=["gpu", "uuid"])
        for g in gpus:
            v = _num(g.xid_errors)
            if v is not None:
                xid.add_metric([str(g.index), str(g.uuid or "")], v)
        if xid.samples:
            yield xid

    def _throttle(self, gpus: tuple[GpuStatus, ...]) -> Iterator[Any]:
        """1 for each reason NVML gives for the clocks being held down now (idle and sync boost cost nothing)."""
        fam = GaugeMetricFamily("lynxtop_gpu_clock_throttle_reasons", "1 while NVML reports this reason for the "
                                "GPU's clocks being lowered (its clock event reasons)",
                                labels=["gpu", "uuid", "reason"])
        known = 0
        for bit, _ in _THROTTLE:
            known |= bit
        for g in gpus:
            v = _num(g.metric("throttle_reasons"))
            if v is None or not 0 <= v < 2**63:  # not read (NULL): no series, never "no reason"
                continue
            mask = int(v)
            labels = [str(g.index), str(g.uuid or "")]
            for bit, reason in _THROTTLE:
                fam.add_metric([*labels, reason], 1.0 if mask & bit else 0.0)
            fam.add_metric([*labels, "other"], 1.0 if mask & ~known else 0.0)
        if fam.samples:
            yield fam

    def _simple(self, spec: tuple[Exported, ...], data: Mapping[str, Any]) -> Iterator[Any]:
        for col in spec:
            v = _num(data.get(col.column))
            if v is None:
                continue
            if col.counter:  # prometheus_client adds `_total` to a counter family's samples
                fam: Any = CounterMetricFamily(col.name[: -len("_total")], col.help)
                fam.add_metric([], v * col.scale)
                yield fam
            else:
                yield _gauge(col.name, col.help, v * col.scale)

    def _serving(self, srv: ServingStatus, sm: Mapping[str, Any]) -> Iterator[Any]:
        g = GaugeMetricFamily("lynxtop_serving_state", "1 for the supervisor's current state of vLLM",
                              labels=["state"])
        for s in SERVING_STATES:
            g.add_metric([s], 1.0 if s == srv.state else 0.0)
        yield g
        yield _gauge("lynxtop_serving_up", "1 when vLLM is ready (healthy and answering)",
                     1.0 if srv.state == ServingState.READY else 0.0)
        # the state reads stopped while a server the previous agent left serves on, unsupervised (serving.held)
        yield _gauge("lynxtop_serving_held", "1 while a vLLM left by the previous agent serves unsupervised "
                     "(not adopted: no crash, hang or health handling); `lynxtop stop` ends it",
                     1.0 if srv.held is not None else 0.0)
        for value, name, help_, scale in (
            (srv.state_since_ms, "lynxtop_serving_state_since_seconds", "When the current state began, Unix time",
             1e-3),
            (srv.ready_ms, "lynxtop_serving_ready_time_seconds", "When the current run became ready, Unix time", 1e-3),
            (srv.run_id, "lynxtop_serving_run_id", "Id of the current run in the history store", 1),
            (srv.failures_in_window, "lynxtop_serving_failures_in_window", "Failures counted toward crash-loop", 1),
            (srv.adopted, "lynxtop_serving_adopted", "1 when the run was adopted from a previous agent", 1),
        ):
            v = _num(value)
            if v is not None:
                yield _gauge(name, help_, v * scale)
        yield from self._run(srv)
        yield from self._startup(srv)
        yield from self._simple(_SERVING, sm)
        yield from self._latency(sm)

    def _run(self, srv: ServingStatus) -> Iterator[Any]:
        """Which run the serving series belong to, as an info metric: joining on it gives them profile and run
        labels without a new series of every gauge at each restart. And why a run is degraded (a hang alerts)."""
        g = GaugeMetricFamily("lynxtop_serving_degraded", "1 while this condition holds the run degraded",
                              labels=["condition"])
        for cond in DEGRADED_CONDITIONS:
            g.add_metric([cond], 1.0 if cond in srv.degraded else 0.0)
        yield g
        if srv.profile and srv.run_id is not None:
            info = GaugeMetricFamily("lynxtop_serving_info", "The supervisor's current run: profile, run id, model",
                                     labels=["profile", "run", "model"])
            info.add_metric([srv.profile, str(srv.run_id), srv.model or ""], 1.0)
            yield info

    def _startup(self, srv: ServingStatus) -> Iterator[Any]:
        """Where a load is, while the run starts: its phase (a state set over the known phases), when that phase
        began and when the readiness timeout stops the load. Why: `state="starting"` alone cannot tell a load
        stuck in its weights for 40 minutes from one about to serve, nor alert before the timeout kills it.
        Absent outside a load, so a rule on them never fires on a serving or stopped run."""
        if srv.state != ServingState.STARTING:
            return
        if srv.phase:
            g = GaugeMetricFamily("lynxtop_serving_startup_phase", "1 for the start-up phase vLLM's log shows the "
                                  "run in now, 0 for the others (only while it starts)", labels=["phase"])
            for phase in STARTUP_PHASES:
                g.add_metric([phase], 1.0 if phase == srv.phase else 0.0)
            if srv.phase not in STARTUP_PHASES:  # a phase word this list lacks: still the one the run is in
                g.add_metric([srv.phase], 1.0)
            yield g
        for value, name, help_ in (
            (srv.phase_since_ms, "lynxtop_serving_phase_since_seconds",
             "When the current start-up phase began, Unix time (only while the run starts)"),
            (srv.ready_deadline_ms, "lynxtop_serving_ready_deadline_seconds",
             "When the readiness timeout stops the load unless vLLM is ready by then, Unix time (only while the "
             "run starts)"),
        ):
            v = _num(value)
            if v is not None:
                yield _gauge(name, help_, v / 1000)

    def _engines(self, engines: tuple[EngineLoad, ...]) -> Iterator[Any]:
        """The load of each data-parallel engine (the totals above are their sum, KV their max)."""
        for attr, suffix, help_, scale in _ENGINE:
            fam = GaugeMetricFamily(f"lynxtop_serving_engine_{suffix}", help_, labels=["engine"])
            values = [(e.engine, _num(getattr(e, attr))) for e in engines]
            for engine, v in values:
                if v is not None:
                    fam.add_metric([engine], v * scale)
            if any(v is not None for _, v in values):
                yield fam

    def _latency(self, sm: Mapping[str, Any]) -> Iterator[Any]:
        v = _num(sm.get("scrape_errors"))
        if v is not None:
            c = CounterMetricFamily("lynxtop_serving_scrape_errors", "Failed scrapes of vLLM's /metrics")
            c.add_metric([], v)
            yield c
        for series in LATENCY_SERIES:
            for stat in ("p50", "p90", "p99", "mean"):
                v = _num(sm.get(f"{series}_{stat}_ms"))
                if v is not None:
                    yield _gauge(f"lynxtop_serving_{series}_{stat}_seconds",
                                 f"{_SERIES_HELP[series]}, {stat} over the sliding window", v / 1000)

    def _lifetime(self, models: Mapping[str, ModelTotals] | None) -> Iterator[Any]:
        """Counters and histograms that a fleet can add up and re-window: they grow across vLLM restarts and
        start over only with the agent (agent/metrics/lifetime.py). The percentile gauges above stay for the TUI."""
        if not models:
            return
        ordered = sorted(models.items())
        for key, name, help_ in _TOTALS:
            fam = CounterMetricFamily(name, help_, labels=["model_name"])
            for model, m in ordered:
                if key in m.counters:
                    fam.add_metric([model], m.counters[key])
            if fam.samples:
                yield fam
        fam = CounterMetricFamily("lynxtop_serving_requests", "Requests vLLM finished since the agent started, by "
                                  "finish reason", labels=["model_name", "finished_reason"])
        for model, m in ordered:
            for reason, v in sorted(m.finished.items()):
                fam.add_metric([model, reason], v)
        if fam.samples:
            yield fam
        for series in LATENCY_SERIES:
            h = HistogramMetricFamily(f"lynxtop_serving_{series}_seconds", f"{_SERIES_HELP[series]} since the agent "
                                      "started, with vLLM's buckets", labels=["model_name"])
            for model, m in ordered:
                snap = m.histograms.get(series)
                if snap is not None:
                    h.add_metric([model], [(floatToGoString(le), c) for le, c in snap.buckets], snap.sum)
            if h.samples:
                yield h

    def _sla(self, sla: SlaStatus) -> Iterator[Any]:
        yield _gauge("lynxtop_sla_breach", "1 while p99 TTFT or TPOT is over its threshold",
                     1.0 if sla.state == SlaState.BREACH else 0.0)
        for value, name, help_ in (
            (sla.ttft_threshold_ms, "lynxtop_sla_ttft_p99_threshold_seconds", "SLA: p99 TTFT limit"),
            (sla.tpot_threshold_ms, "lynxtop_sla_tpot_p99_threshold_seconds", "SLA: p99 TPOT limit"),
        ):
            v = _num(value)
            if v is not None:
                yield _gauge(name, help_, v / 1000)


    def _cluster(self, cl: ClusterStatus) -> Iterator[Any]:
        """This node's Ray (head or worker) and, on a head, the cluster as Ray reports it. A single node exports
        none of it: its page stays as it was."""
        if cl.role == Role.SINGLE:
            return
        info = GaugeMetricFamily("lynxtop_ray_info", "This node's part in a Ray cluster: its role and the head's GCS "
                                 "address", labels=["role", "address"])
        info.add_metric([cl.role.value, cl.address], 1.0)
        yield info
        yield _gauge("lynxtop_ray_up", "1 when this node's Ray runs (the agent's ray start --block)",
                     1.0 if cl.ray_state == RayState.RUNNING else 0.0)
        g = GaugeMetricFamily("lynxtop_ray_state", "1 for the agent's current state of this node's Ray",
                              labels=["state"])
        for s in RAY_STATES:
            g.add_metric([s], 1.0 if s == cl.ray_state else 0.0)
        yield g
        yield _gauge("lynxtop_ray_failures_in_window", "Ray failures counted toward crash-loop", float(cl.ray_failures))
        if cl.ray_since_ms is not None:
            yield _gauge("lynxtop_ray_state_since_seconds", "When Ray's current state began, Unix time",
                         cl.ray_since_ms / 1000)
        if cl.role == Role.HEAD:
            yield from self._cluster_view(cl)

    def _cluster_view(self, cl: ClusterStatus) -> Iterator[Any]:
        yield _gauge("lynxtop_cluster_view_ok", "1 when the last read of Ray's view of the cluster succeeded",
                     0.0 if cl.view_error else 1.0)
        if cl.view_ms is not None:  # known while the view is not: how old the last good one is
            yield _gauge("lynxtop_cluster_view_time_seconds", "When Ray's view of the cluster was last read, Unix "
                         "time", cl.view_ms / 1000)
        if cl.gpus_needed is not None:
            yield _gauge("lynxtop_cluster_gpus_needed", "GPUs the head's Ray profile needs (TP x PP x DP)",
                         float(cl.gpus_needed))
        if not cl.nodes:  # not read (yet), or unreadable for a while: unknown, never 0
            return
        alive = cl.alive_nodes
        lost = cl.lost_nodes  # not a rejoined node's old entry
        nodes = GaugeMetricFamily("lynxtop_cluster_nodes", "Nodes in Ray's view: alive, or dead with no live node "
                                  "of their kind at their address", labels=["state"])
        nodes.add_metric(["alive"], float(len(alive)))
        nodes.add_metric(["dead"], float(len(lost)))
        yield nodes
        yield _gauge("lynxtop_cluster_gpus", "GPUs of the alive nodes, as Ray reports them", float(cl.gpus_alive))
        up = GaugeMetricFamily("lynxtop_cluster_node_up", "1 for a node Ray reports alive, 0 for one lost",
                               labels=["ip", "kind"])
        present = GaugeMetricFamily("lynxtop_cluster_node_gpus", "GPUs Ray reports on the node while it is alive "
                                    "(0 once lost)", labels=["ip", "kind"])
        expected = GaugeMetricFamily("lynxtop_cluster_node_gpus_expected", "GPUs Ray listed for the node, a lost "
                                     "node's included: what the cluster expects back", labels=["ip", "kind"])
        by_key: dict[tuple[str, str], list[float]] = {}  # (ip, kind) -> [up, GPUs present, GPUs expected]
        for n in (*alive, *lost):  # one series per address and kind: two workers on one host (tests) are one
            key = (n.ip or n.name or n.node_id, "head" if n.head else "worker")
            v = by_key.setdefault(key, [0.0, 0.0, 0.0])
            v[0] = max(v[0], 1.0 if n.alive else 0.0)
            v[1] += n.gpus if n.alive else 0.0
            v[2] += n.gpus
        for key, (is_up, gpus, want) in sorted(by_key.items()):
            up.add_metric(list(key), is_up)
            present.add_metric(list(key), gpus)
            expected.add_metric(list(key), want)
        yield up
        yield present
        yield expected


class _Families:
    """Families already built, as the one thing an encoder asks of a registry (`collect`)."""

    def __init__(self, families: Iterable[Any]):
        self.families = list(families)

    def collect(self) -> list[Any]:
        return self.families


_EOF = b"# EOF\n"  # OpenMetrics' end of the page: once, after the last part


def _encode(encoder: Callable[[Any], bytes], families: Iterable[Any]) -> bytes:
    """The families encoded; a label value that is not UTF-8 (a lone surrogate in a foreign value such as Ray's
    node_ip) makes the encoder raise, and would make the whole page a 500: those values are written escaped
    (`encodable`) and every other series is served as usual. TextPage escapes them itself (textpage.py)."""
    fams = list(families)
    try:
        return encoder(_Families(fams))
    except UnicodeEncodeError:
        return encoder(_Families(encodable(fams)))


def _utf8(family: Any) -> bool:
    """Whether every label value (and the help) of the family encodes as UTF-8 (ASCII: the C-level check only)."""
    return all(all(v.isascii() or _encodes(v) for v in s.labels.values()) for s in family.samples) \
        and (family.documentation.isascii() or _encodes(family.documentation))


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def utf8_text(text: str) -> str:
    """`text` with what UTF-8 cannot encode (lone surrogates) as backslash escapes: `\\ud800`, read back as text."""
    return text if text.isascii() or _encodes(text) else text.encode("utf-8", "backslashreplace").decode("utf-8")


def encodable(families: list[Any]) -> list[Any]:
    """The families with every label value and help UTF-8 can encode (`utf8_text`): copies, the cached originals
    untouched."""
    out = []
    for fam in families:
        if _utf8(fam):
            out.append(fam)
            continue
        new = copy.copy(fam)
        new.documentation = utf8_text(fam.documentation)
        new.samples = [s._replace(labels={k: utf8_text(v) for k, v in s.labels.items()}) for s in fam.samples]
        out.append(new)
    return out


def _page_key(st: Status) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """What the cached parts are built from, as GET /v1/status keys its tick part (agent/status_view.py): the part
    only a tick changes (GPUs, host, serving metrics, engines: most of the page) by identity, since the agent hands
    out the same objects until a tick or a scrape replaces them, so a GET never compares them by value; the small
    rest by value, less what the page does not carry (the uptime, moving every 0.1 s; `last_tick_ms`, counted back
    from each status's own now, so it moves by a millisecond between GETs: the page's last tick is the ticker's,
    keyed beside; the disk's free bytes, moving with every write to it) and the listeners' counts (built per GET)."""
    agent = dataclasses.replace(st.agent, uptime_s=None, last_tick_ms=None, connections={}, descriptors={},
                                store=dataclasses.replace(st.agent.store, free_bytes=None))
    return ((st.gpus, st.host, st.serving_metrics, st.engines), (agent, st.serving, st.sla, st.cluster))


def _same_page(cached: tuple[Any, ...], key: tuple[Any, ...]) -> bool:
    """`_page_key`s (with the totals') of one page: the tick part the same objects, the rest equal."""
    return all(a is b for a, b in zip(cached[0][0], key[0][0], strict=True)) and cached[0][1] == key[0][1] \
        and cached[1] == key[1]


def _totals_key(models: Mapping[str, ModelTotals] | None) -> tuple[Any, ...] | None:
    """The lifetime totals by value: lifetime.py adds to them in place, so their identity never changes."""
    if models is None:
        return None
    return tuple((name, tuple(m.counters.items()), tuple(m.finished.items()), tuple(m.histograms.items()))
                 for name, m in models.items())


def parse_listen(listen: str) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host, port); raises ValueError naming the problem."""
    host, sep, port_s = listen.rpartition(":")
    if not sep or not host:
        raise ValueError(f"metrics_listen {listen!r} is not host:port (for example 127.0.0.1:9464)")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        port = int(port_s)
    except ValueError:
        raise ValueError(f"metrics_listen {listen!r}: port {port_s!r} is not a number") from None
    if not 0 <= port < 65536:  # 0 = any free port (tests)
        raise ValueError(f"metrics_listen {listen!r}: port out of range (1..65535)")
    return host, port


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class NamedSeries:
    """The collector's families restricted to `names`, for `GET /metrics?name[]=...` as prometheus_client's own
    endpoint answers it (registry.py, RestrictedRegistry): the samples whose name is listed, under their family's
    HELP and TYPE. A family's own name selects all its samples too (`lynxtop_gpu_energy_joules` for its `_total`,
    a histogram for its buckets, sum and count), which prometheus_client's filter leaves out.

    The registry could not do it: its name filter asks only collectors that declared their names (describe()), and
    this collector's families depend on the status (a head's cluster series, one per engine), so it declares none.
    """

    def __init__(self, collector: Collector, names: Iterable[str]):
        self.collector = collector
        self.names = frozenset(names)

    def collect(self) -> Iterator[Any]:
        for family in self.collector.collect():
            whole = family.name in self.names
            samples = [smp for smp in family.samples if whole or smp.name in self.names]
            if samples:
                picked = copy.copy(family)
                picked.samples = samples
                yield picked


class MetricsExporter:
    """GET /metrics and GET /v1/status on `listen` (host:port from `[agent] metrics_listen`), and with `reads`
    ([agent] tcp_reads) the token holder's reads (agent/api/tcpreads.py); no control route is served there."""

    def __init__(self, listen: str, snapshot: Callable[[], Status | None],
                 log: Callable[[str], None] | None = None, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 request_timeout_s: float = 10.0, episodes: Episodes | None = None,
                 totals: Callable[[], Mapping[str, ModelTotals] | None] | None = None,
                 reads: TcpReads | None = None, status_body: Callable[[], str] | None = None,
                 last_tick: Callable[[], float | None] | None = None):
        self.host, self.port = parse_listen(listen)
        self._status_body = status_body  # the agent's GET /v1/status text for TCP (StatusView.body(tcp=True))
        self.reads = reads  # [agent] tcp_reads: history, events, logs, processes for the token's holder
        self.listen = listen
        self.log = log or _log.info
        self.request_timeout_s = request_timeout_s
        self.guard = ConnectionGuard("metrics endpoint", max_connections, request_timeout_s,
                                     "metrics_max_connections", json_refusal=False, log=self.log, episodes=episodes)
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = SnapshotCollector(snapshot, totals, last_tick)
        self.registry.register(self.collector)
        # content type -> (what the parts were built from, head, rest): the page is built once per change of it,
        # not per scrape (a 14 ms render at DP8 on the event loop, issue 27); `renders` counts the builds
        self._pages: dict[str, tuple[Any, bytes, bytes]] = {}
        self.renders = 0
        self._text = TextPage()  # the text format with each series' text kept between renders (textpage.py)
        self._snapshot = snapshot
        self._runner: web.AppRunner | None = None
        self.bound_port: int | None = None

    async def start(self) -> None:
        if not is_loopback(self.host):
            self.log(f"warning: metrics endpoint listens on {self.host}:{self.port}, reachable from the network "
                     "(read-only; [agent] metrics_listen sets it)")
        app = web.Application(middlewares=[self.guard.middleware])
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/status", self._status)  # the head's cluster view reads other nodes here (read-only)
        if self.reads is not None:
            self.reads.add_routes(app)
        else:
            add_refusals(app)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     **handler_args(self.request_timeout_s))
        await self._runner.setup()
        site = GuardedSite(self._runner, self.guard, host=self.host, port=self.port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            self._runner = None
            raise RuntimeError(f"cannot listen on {self.listen} for metrics: {exc.strerror or exc}") from None
        sockets = site.sockets  # the bound port matters when the config says :0 (tests)
        self.bound_port = sockets[0].getsockname()[1] if sockets else self.port
        self.log(f"Prometheus metrics on http://{self.listen.rsplit(':', 1)[0]}:{self.bound_port}/metrics")
        if self.reads is not None:
            self.log("runs, events, logs, processes and history served there too, to the holder of the read token "
                     "([agent] tcp_reads, tcp_token_file)")

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, request: web.Request) -> web.Response:
        """GET /metrics as prometheus_client's aiohttp handler answers it (format by Accept, compression by aiohttp),
        from `page`."""
        encoder, content_type = choose_encoder(",".join(request.headers.getall(hdrs.ACCEPT, [])))
        wanted = request.query.getall("name[]", [])
        if wanted:  # rare (a debugging curl, a federation): built fresh, not cached
            body = encoder(NamedSeries(self.collector, wanted))
        else:
            if encoder is generate_latest:  # the same bytes, each series escaped once, not at every render
                encoder = self._text
            body = self.page(encoder, content_type)
        response = web.Response(status=200, headers=[("Content-Type", content_type)], body=body)
        response.enable_compression()
        return response

    def page(self, encoder: Callable[[Any], bytes], content_type: str) -> bytes:
        """The page, byte for byte the registry's: the parts a tick changes are encoded again only when what they
        are built from changed (`_page_key`: the tick part by identity, the rest by value, so a change between ticks
        is in the next GET); the listeners' connection counts, which change with every connection, are encoded on
        every GET."""
        c = self.collector
        st = c.read_snapshot()
        if st is None:
            return encoder(self.registry)
        models = c.read_totals()
        last_tick = c.read_last_tick()
        key = (_page_key(st), (_totals_key(models), last_tick))
        cached = self._pages.get(content_type)
        if cached is None or not _same_page(cached[0], key):
            if len(self._pages) >= 8:  # content types come from clients' Accept headers: keep a few
                self._pages.clear()
            head = _encode(encoder, c.head(st, last_tick)).removesuffix(_EOF)
            rest = _encode(encoder, c.rest(st, models))
            cached = self._pages[content_type] = (key, head, rest)
            self.renders += 1
        live = _encode(encoder, c._listeners(st.agent)).removesuffix(_EOF)
        return cached[1] + live + cached[2]

    async def _status(self, request: web.Request) -> web.Response:
        """The socket's `GET /v1/status` JSON from the same cached snapshot (no I/O; secrets are never in it), less
        who asked for an action (`without_callers`): this port is open to whoever reaches it, with no token."""
        if self._status_body is not None:  # the agent's (without callers): one encoding per tick for all pollers
            return web.Response(text=self._status_body(), content_type="application/json")
        status = self._snapshot()
        if status is None:
            return web.json_response({"error": "not_ready", "message": "the agent has no status yet"}, status=503)
        return web.json_response(without_callers(status.to_json()))
