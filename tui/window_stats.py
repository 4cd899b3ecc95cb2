"""Averages over the recent window of a live series, for counters that a single tick shows badly.

vLLM's finished-request rate is finished requests per tick: a TP8 run whose requests take 30 s or more
finishes none in most ticks, so the tick value reads 0.00 for minutes while 16 requests run. Its mean over
the last minutes is the rate an operator means.
"""

from __future__ import annotations

from collections.abc import Sequence

RATE_WINDOW_MS = 5 * 60 * 1000


def window_mean(points: Sequence[tuple[int, float | None]], end_ms: int | None = None,
                window_ms: int = RATE_WINDOW_MS, interval_ms: int = 1000) -> tuple[float | None, int]:
    """Mean of the readings in the `window_ms` up to `end_ms` (the newest point's time when None), and the
    time they cover (ms).

    Each reading is a rate over the tick before it, so n readings one interval apart cover n intervals;
    the span is capped at the window. None when there is no reading in the window.
    """
    if not points:
        return None, 0
    end = points[-1][0] if end_ms is None else end_ms
    recent = [(ts, v) for ts, v in points if end - window_ms < ts <= end and v is not None]
    if not recent:
        return None, 0
    span = min(window_ms, end - recent[0][0] + interval_ms)
    return sum(v for _, v in recent) / len(recent), span


def span_label(span_ms: int) -> str:
    """5m, 45s: how long an average covers, short enough for a stats line."""
    s = round(span_ms / 1000)
    return f"{s}s" if s < 120 else f"{round(s / 60)}m"
