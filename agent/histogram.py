"""Cumulative Prometheus histograms: differences between scrapes and quantiles the way Prometheus computes them.

A percentile over the last minute cannot be read off a cumulative histogram; it comes from the difference of
two scrapes' buckets. The quantile follows Prometheus' `histogram_quantile` (promql/quantile.go) exactly, edge
cases included, so a number here matches what an operator's Grafana shows for the same window.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class HistogramSnapshot:
    """Cumulative state of one histogram (summed over engines): `buckets` is (upper bound, cumulative count)."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float

    def minus(self, older: HistogramSnapshot) -> HistogramSnapshot | None:
        """Observations made between `older` and self; None when the bucket layouts differ."""
        if [le for le, _ in self.buckets] != [le for le, _ in older.buckets]:
            return None
        return HistogramSnapshot(
            buckets=tuple((le, c - o) for (le, c), (_, o) in zip(self.buckets, older.buckets, strict=True)),
            sum=self.sum - older.sum,
            count=self.count - older.count,
        )

    def went_down(self, older: HistogramSnapshot) -> bool:
        """A cumulative count that decreased: the process behind the page restarted."""
        if self.count < older.count:
            return True
        old = dict(older.buckets)
        return any(le in old and c < old[le] for le, c in self.buckets)

    @staticmethod
    def zero_like(other: HistogramSnapshot) -> HistogramSnapshot:
        return HistogramSnapshot(tuple((le, 0.0) for le, _ in other.buckets), 0.0, 0.0)


def bucket_quantile(q: float, buckets: list[tuple[float, float]] | tuple[tuple[float, float], ...]) -> float:
    """Prometheus' bucketQuantile: `buckets` are (upper bound, cumulative count), in any order.

    Returns NaN where Prometheus does (no +Inf bucket, fewer than two buckets, no observations); a rank in the
    +Inf bucket returns the upper bound of the last finite bucket; the first bucket's lower bound is 0 unless
    its upper bound is <= 0, in which case that upper bound is returned.
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    bs = sorted(buckets, key=lambda b: b[0])
    if not bs or not math.isinf(bs[-1][0]) or bs[-1][0] < 0:
        return math.nan
    # coalesceBuckets: the same bound twice (after summing label sets) counts once, with the counts added.
    merged: list[list[float]] = []
    for le, c in bs:
        if merged and merged[-1][0] == le:
            merged[-1][1] += c
        else:
            merged.append([le, c])
    # ensureMonotonic: a scrape can catch buckets mid-update; never let a cumulative count decrease.
    running = -math.inf
    for b in merged:
        running = max(running, b[1])
        b[1] = running
    if len(merged) < 2:
        return math.nan
    observations = merged[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    # sort.Search over all but the +Inf bucket: the first bucket whose count reaches the rank.
    b = next((i for i in range(len(merged) - 1) if merged[i][1] >= rank), len(merged) - 1)
    if b == len(merged) - 1:
        return merged[-2][0]
    if b == 0 and merged[0][0] <= 0:
        return merged[0][0]
    start, end, count = 0.0, merged[b][0], merged[b][1]
    if b > 0:
        start = merged[b - 1][0]
        count -= merged[b - 1][1]
        rank -= merged[b - 1][1]
    if count == 0:  # only reachable with q == 0: Prometheus would divide 0 by 0
        return start
    return start + (end - start) * (rank / count)


class SlidingHistogram:
    """Snapshots of one cumulative histogram over time, answering quantiles over the last `window_s` seconds."""

    def __init__(self, window_s: float):
        self.window_s = window_s
        self._snaps: deque[tuple[float, HistogramSnapshot]] = deque()

    def add(self, now: float, snap: HistogramSnapshot) -> bool:
        """Record a scrape; returns True when the histogram went down (server restart: baseline reset to zero)."""
        reset = False
        if self._snaps:
            last_t, last = self._snaps[-1]
            if snap.went_down(last) or [le for le, _ in snap.buckets] != [le for le, _ in last.buckets]:
                # Prometheus' reset rule: the new process counted from zero, just after our last scrape.
                self._snaps.clear()
                self._snaps.append((last_t, HistogramSnapshot.zero_like(snap)))
                reset = True
        self._snaps.append((now, snap))
        # Keep one snapshot at or before the window's start as the baseline.
        while len(self._snaps) >= 2 and self._snaps[1][0] <= now - self.window_s:
            self._snaps.popleft()
        return reset

    def clear(self) -> None:
        self._snaps.clear()

    def window(self) -> HistogramSnapshot | None:
        """Observations over the window (from the baseline to the newest scrape); None before two scrapes."""
        if len(self._snaps) < 2:
            return None
        return self._snaps[-1][1].minus(self._snaps[0][1])

    def quantile(self, q: float) -> float | None:
        """The q-quantile over the window, in the histogram's unit; None for an empty window."""
        delta = self.window()
        if delta is None:
            return None
        value = bucket_quantile(q, delta.buckets)
        return None if math.isnan(value) else value

    def mean(self) -> float | None:
        delta = self.window()
        if delta is None or delta.count <= 0:
            return None
        return delta.sum / delta.count
