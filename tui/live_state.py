"""What the dashboard knows about the node right now, and the last minutes of it, independent of Textual.

The poller feeds it; screens read it. Keeping it free of widgets lets the outage rules (greyed values with
their age, one notice per outage) be tested without a terminal.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from lynxtop.contract.columns import GPU_METRICS, LATENCY_SERIES, LATENCY_STATS, SERVING_METRICS, names
from lynxtop.contract.status import (
    AgentStatus,
    EngineLoad,
    GpuStatus,
    ServingMetrics,
    ServingState,
    ServingStatus,
    SlaStatus,
    Status,
)

# 15 minutes at the default 1 s interval: what the GPU and Latency views show live.
HISTORY_POINTS = 900
SERVING_KEYS = names(SERVING_METRICS)
GPU_KEYS = names(GPU_METRICS)
LATENCY_KEYS = tuple(f"{s}_{st}_ms" for s in LATENCY_SERIES for st in LATENCY_STATS)


@dataclass
class Outage:
    since_ms: int
    error: str
    notified: bool = False


@dataclass
class LiveState:
    status: Status | None = None
    received_ms: int | None = None  # wall time of the last good status (for "age")
    # The node's clock minus ours, measured at the last answer that said its clock (`Status.now_ms`); None: the node
    # did not (an older agent, a replay), and its times are judged by our clock as they always were.
    clock_offset_ms: int | None = None
    outage: Outage | None = None
    serving_history: deque[tuple[int, dict[str, Any]]] = field(
        default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    gpu_history: dict[int, deque[tuple[int, dict[str, Any]]]] = field(default_factory=dict)
    profiles: dict[str, Any] | None = None
    # Told before any status that the node is simulated (`lynxtop demo`): labelled from the first frame, since
    # the rule is that a simulated node is never shown unlabelled, not even while the agent comes up.
    known_simulated: bool = False

    # ------------------------------------------------------------------ updates
    def apply_status(self, status: Status, now_ms: int) -> Outage | None:
        """Take a fresh status; returns the outage that just ended, if any."""
        ended = self.outage
        self.outage = None
        self.status = status
        self.received_ms = now_ms
        self.clock_offset_ms = status.now_ms - now_ms if status.now_ms is not None else None
        ts = int(status.ts_ms or now_ms)
        _append(self.serving_history, ts, {k: status.serving_metrics.metric(k) for k in SERVING_KEYS})
        for gpu in status.gpus:
            if not isinstance(gpu.index, int):
                continue
            _append(self.gpu_history.setdefault(gpu.index, deque(maxlen=HISTORY_POINTS)), ts,
                    {k: gpu.metric(k) for k in GPU_KEYS})
        return ended

    def mark_lost(self, error: str, now_ms: int) -> bool:
        """Record a failed poll; True only for the first failure of an outage (notify once)."""
        if self.outage is None:
            self.outage = Outage(since_ms=now_ms, error=error)
            return True
        self.outage.error = error
        return False

    def backfill(self, serving_rows: list[dict[str, Any]], gpu_rows: list[dict[str, Any]]) -> None:
        """Seed the live charts from the store so they are not empty when the dashboard opens.

        Stored rows older than the first live sample go before it; live samples are never replaced.
        """
        self.serving_history = _merge(self.serving_history, [
            (int(r["ts_ms"]), _readings(r, SERVING_KEYS)) for r in serving_rows])
        by_gpu: dict[int, list[tuple[int, dict[str, Any]]]] = {}
        for row in gpu_rows:
            by_gpu.setdefault(int(row["gpu"]), []).append((int(row["ts_ms"]), _readings(row, GPU_KEYS)))
        for idx, rows in by_gpu.items():
            self.gpu_history[idx] = _merge(self.gpu_history.get(idx, deque()), rows)

    # ------------------------------------------------------------------ reads
    @property
    def connected(self) -> bool:
        return self.status is not None and self.outage is None

    @property
    def stale(self) -> bool:
        return self.outage is not None

    def node_ms(self, local_ms: int) -> int:
        """`local_ms` (this dashboard's clock) read on the node's clock: the node's clock when it last answered plus
        our time since, so every age and duration shown for a node counts on its own clock, whatever the skew
        between the two hosts (a worker a minute behind the head is neither "1m old" nor a minute short).

        The offset is measured anew at every answer (each poll), so a step of our own clock shifts the node's
        times until the next answer only; and it converts any instant of ours, the header's frozen "last answer"
        (an outage) included, which a count from a monotonic clock could not. Without the node's clock: ours."""
        return local_ms if self.clock_offset_ms is None else local_ms + self.clock_offset_ms

    def age_s(self, now_ms: int) -> float | None:
        return None if self.received_ms is None else max(0.0, (now_ms - self.received_ms) / 1000)

    @property
    def ts_ms(self) -> int | None:
        """When the agent took the current status (its clock, not ours)."""
        return self.status.ts_ms if self.status is not None else None

    # Before the first status every part reads as its empty default (no host, no GPUs, nothing measured).
    @property
    def agent(self) -> AgentStatus:
        return self.status.agent if self.status is not None else AgentStatus()

    @property
    def serving(self) -> ServingStatus:
        return self.status.serving if self.status is not None else ServingStatus()

    @property
    def sla(self) -> SlaStatus:
        return self.status.sla if self.status is not None else SlaStatus()

    @property
    def serving_metrics(self) -> ServingMetrics:
        return self.status.serving_metrics if self.status is not None else ServingMetrics()

    @property
    def gpus(self) -> tuple[GpuStatus, ...]:
        return self.status.gpus if self.status is not None else ()

    @property
    def engines(self) -> tuple[EngineLoad, ...]:
        """Each data-parallel engine's load on the last page read (empty when not serving)."""
        return self.status.engines if self.status is not None else ()

    @property
    def simulated(self) -> bool:
        """SIMULATED is shown: known so, or the status says so; False also before a status (not known yet)."""
        if self.known_simulated:
            return True
        return self.status is not None and (self.status.agent.simulated or self.status.serving.simulated)

    def requests_at_stop(self) -> tuple[float, float] | None:
        """(running, waiting) as vLLM last reported them before serving began to stop: what the stop drains. The
        agent reads no metrics while a run stops (a server shutting down is not scraped), so these are the last
        ones before it, of the run that stops (a run stopped while it loaded served none: the last run's are not
        its); None when there is none (a dashboard opened mid-drain, unbackfilled)."""
        reading = self.reading_at_stop()
        return None if reading is None else reading[1:]

    def reading_at_stop(self) -> tuple[int, float, float] | None:
        """(ts_ms, running, waiting): `requests_at_stop` with the time of that reading, on the node's clock (the
        serving line and the Serving panel say how old the counts are, alike)."""
        serving = self.serving
        since, run_id = serving.state_since_ms, serving.run_id
        if serving.state != ServingState.STOPPING or since is None or run_id is None:
            return None
        for ts, row in reversed(self.serving_history):
            if ts > since:
                continue
            if row.get("run_id") not in (run_id, None):
                return None  # readings of an earlier run: this one was never read
            running, waiting = row.get("requests_running"), row.get("requests_waiting")
            if running is not None and waiting is not None and row.get("run_id") == run_id:
                return ts, running, waiting
        return None

    def serving_series(self, key: str) -> list[tuple[int, float | None]]:
        return [(ts, row.get(key)) for ts, row in self.serving_history]

    def gpu_series(self, idx: int, key: str) -> list[tuple[int, float | None]]:
        return [(ts, row.get(key)) for ts, row in self.gpu_history.get(idx, ())]


def _append(hist: deque[tuple[int, dict[str, Any]]], ts: int, row: dict[str, Any]) -> None:
    """A live sample appended to its history. A sample older than the last one held means the agent's timeline
    stepped back (a restart adopts the wall clock after it was set back: docs/reliability.md): the samples
    "after" it are from the abandoned timeline and go, so the charts follow the new readings at once instead of
    holding the last old one (and drawing nothing) for as long as the step. The same ts again is the same tick."""
    if hist and hist[-1][0] == ts:
        return
    while hist and hist[-1][0] > ts:
        hist.pop()
    hist.append((ts, row))


def _readings(row: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """A stored row's metric columns; a value that is not a finite number (the store keeps a REAL inf as it came)
    is None, as the status reads it (contract/status.py)."""
    return {k: v if not isinstance(v, float) or math.isfinite(v) else None for k in keys for v in (row.get(k),)}


def _merge(live: deque[tuple[int, dict[str, Any]]], stored: list[tuple[int, dict[str, Any]]]
           ) -> deque[tuple[int, dict[str, Any]]]:
    first_live = live[0][0] if live else None
    older = [p for p in sorted(stored, key=lambda p: p[0]) if first_live is None or p[0] < first_live]
    return deque([*older, *live], maxlen=HISTORY_POINTS)
