"""Latency percentiles estimated from a Prometheus histogram, and the ones that are only an upper bound.

A percentile is interpolated inside the bucket that holds its rank, as `histogram_quantile` does. In the lowest
bucket that interpolation starts from 0 and makes the figure up: with every request queued for 0 s, vLLM's
queue-time histogram (lowest bucket 0-0.3 s) gives p50 150 ms and p99 297 ms. All the histogram says there is
"at or below 0.3 s". The agent keeps the interpolated number (what Grafana shows for the same window) and stores
the lowest bucket's bound beside it (`{series}_lowest_bucket_ms`, contract/columns.py); this module is the one place
that decides from the two whether a percentile is a figure or a bound, how it reads, and whether it can be judged
against a limit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lynxtop.contract.columns import lowest_bucket_column
from lynxtop.contract.format import fmt_ms

__all__ = ["fmt_quantile", "fmt_series", "judged", "lowest_bucket_column", "over", "quantile_bound"]


def quantile_bound(value: float | None, lowest_bucket: float | None) -> float | None:
    """The bound a percentile is only known to be at or below: the lowest bucket's bound where the percentile lies
    in that bucket (an interpolated value never exceeds the bucket's bound); None where it is a figure (a higher
    bucket), or where either is unknown."""
    if value is None or lowest_bucket is None:
        return None
    return lowest_bucket if value <= lowest_bucket else None


def judged(value: float | None, lowest_bucket: float | None, limit: float) -> float | None:
    """The percentile to judge against `limit`; None where the histogram cannot tell: a percentile in the lowest
    bucket with that bucket's bound above the limit may be anywhere from 0 to the bound, on either side of it.
    At or below the limit the bound itself says "within" (the percentile is at most the bound)."""
    bound = quantile_bound(value, lowest_bucket)
    return None if bound is not None and bound > limit else value


def over(value: float | None, lowest_bucket: float | None, limit: float | None) -> bool:
    """The percentile is known to be above `limit` (a breach); never for one known only as below a bound."""
    if limit is None:
        return False
    v = judged(value, lowest_bucket, limit)
    return v is not None and v > limit


def fmt_quantile(value: float | None, lowest_bucket: float | None, decimals: int | None = None) -> str:
    """A percentile as it reads: `<300 ms` for one in the lowest bucket, else fmt_ms's figure (N/A for None)."""
    bound = quantile_bound(value, lowest_bucket)
    return fmt_ms(value, decimals) if bound is None else "<" + fmt_ms(bound, decimals)


def fmt_series(metric: Callable[[str], Any], series: str, stat: str, decimals: int | None = None) -> str:
    """`fmt_quantile` of a serving row's `{series}_{stat}_ms`, its bound read from the same row (`metric`: a
    column's value by name, as ServingMetrics.metric). A mean is Δsum/Δcount, a figure wherever it lies."""
    if stat == "mean":
        return fmt_ms(metric(f"{series}_mean_ms"), decimals)
    return fmt_quantile(metric(f"{series}_{stat}_ms"), metric(lowest_bucket_column(series)), decimals)
