"""Turn the store reader's rows into chart points: one value per timestamp, averaged across GPUs."""

from __future__ import annotations

import math
from typing import Any

from lynxtop.contract.records import RunInfo

RANGES: tuple[tuple[str, int | None], ...] = (
    ("1h", 3600_000), ("6h", 6 * 3600_000), ("24h", 24 * 3600_000), ("7d", 7 * 86400_000),
    ("30d", 30 * 86400_000), ("run", None),
)


def value(row: dict[str, Any], col: str, agg: str) -> float | None:
    """Raw rows hold {col}; rollups {col}_avg/_max: latency wants the max (breaches), activity the mean."""
    if col in row:
        return row[col]
    return row.get(f"{col}_{agg}", row.get(f"{col}_avg"))


def points(rows: list[dict[str, Any]], col: str, agg: str = "avg") -> list[tuple[int, float | None]]:
    """Series over time; rows with a `gpu` key are averaged per timestamp across GPUs."""
    by_ts: dict[int, list[float]] = {}
    order: list[int] = []
    for row in rows:
        ts = int(row["ts_ms"])
        v = value(row, col, agg)
        if ts not in by_ts:
            by_ts[ts] = []
            order.append(ts)
        if v is not None and math.isfinite(v):  # the store keeps a REAL inf as it came: no reading to average
            by_ts[ts].append(float(v))
    return [(ts, (sum(by_ts[ts]) / len(by_ts[ts])) if by_ts[ts] else None) for ts in sorted(order)]


def span(run: RunInfo | None, range_ms: int | None, now_ms: int) -> tuple[int, int]:
    """The window to chart: the range ending where the run ended (or now), or the whole run."""
    end = int(run.ended_ms if run and run.ended_ms else now_ms)
    if range_ms is None:
        start = int(run.started_ms if run and run.started_ms else end - 3600_000)
    else:
        start = end - range_ms
    return start, max(end, start + 1)


# Steering the window (Grafana's zoom and pan): a minute at the closest, 90 days at the widest, never past now.
MIN_WINDOW_MS = 60_000
MAX_WINDOW_MS = 90 * 86400_000


def _fit(start: int, end: int, now_ms: int) -> tuple[int, int]:
    """The window moved back to end at now if it ran past it (there is nothing to chart in the future)."""
    if end > now_ms:
        start, end = start - (end - now_ms), now_ms
    return start, end


def zoom(start: int, end: int, factor: float, now_ms: int) -> tuple[int, int]:
    """The window `factor` times as long about its middle (0.5 zooms in), within MIN/MAX_WINDOW_MS."""
    length = min(MAX_WINDOW_MS, max(MIN_WINDOW_MS, round((end - start) * factor)))
    middle = (start + end) // 2
    return _fit(middle - length // 2, middle - length // 2 + length, now_ms)


def pan(start: int, end: int, fraction: float, now_ms: int) -> tuple[int, int]:
    """The window moved by `fraction` of its length (negative: earlier), its length kept."""
    step = round((end - start) * fraction)
    return _fit(start + step, end + step, now_ms)


def run_window(started_ms: int | None, ended_ms: int | None, now_ms: int) -> tuple[int, int] | None:
    """A run's own time range (to now while it runs); None without a start."""
    if started_ms is None:
        return None
    return int(started_ms), max(int(ended_ms or now_ms), int(started_ms) + MIN_WINDOW_MS)
