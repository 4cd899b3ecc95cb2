"""Averages over the recent window of a live series, for counters that a single tick shows badly.

vLLM's finished-request rate is finished requests per tick: a TP8 run whose requests take 30 s or more
finishes none in most ticks, so the tick value reads 0.00 for minutes while 16 requests run. Its mean over
the last minutes is the rate an operator means.
"""

from __future__ import annotations

from collections.abc import Sequence

RATE_WINDOW_MS = 5 * 60 * 1000


def window_mean(points: Sequence[tuple[int, float | None]], end_ms: int | None = None,
                window_ms: int = RATE_WINDOW_MS, interval_ms: int = 1000,
                start_ms: int | None = None) -> tuple[float | None, int]:
    """Mean of the readings in the `window_ms` up to `end_ms` (the newest point's time when None), and the
    time they cover (ms).

    Each reading is a rate over the tick before it, so n readings one interval apart cover n intervals;
    the span is capped at the window. `start_ms` (the current run's start: its READY time) clamps the window
    further: after a switch, the previous run's readings and the downtime before READY are no part of this
    run's rate, and the span says how long the mean really covers. None when there is no reading in the window.
    """
    if not points:
        return None, 0
    end = points[-1][0] if end_ms is None else end_ms
    first = end - window_ms if start_ms is None else max(end - window_ms, start_ms)
    recent = [(ts, v) for ts, v in points if first < ts <= end and v is not None]
    if not recent:
        return None, 0
    span = min(window_ms, end - recent[0][0] + interval_ms)
    if start_ms is not None:
        span = max(0, min(span, end - start_ms))
    return sum(v for _, v in recent) / len(recent), span


def span_label(span_ms: int) -> str:
    """5m, 45s: how long an average covers, short enough for a stats line."""
    s = round(span_ms / 1000)
    return f"{s}s" if s < 120 else f"{round(s / 60)}m"
