"""Cumulative Prometheus histograms: differences between scrapes and quantiles the way Prometheus computes them.

A percentile over the last minute cannot be read off a cumulative histogram; it comes from the difference of
two scrapes' buckets. The quantile follows Prometheus' `histogram_quantile` (promql/quantile.go) exactly, edge
cases included, so a number here matches what an operator's Grafana shows for the same window.

Counter resets are handled like Prometheus' `rate()`/`increase()` (promql/functions.go extrapolatedRate): each
series (every `le` bucket, `_sum` and `_count` on its own) that goes down between two scrapes contributes its new
value as the increase, so a vLLM restart inside the window keeps the observations made before it.
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import accumulate, repeat

_FIRST = operator.itemgetter(0)
_SECOND = operator.itemgetter(1)
_Prepared = tuple[list[float], list[float]]  # bucket upper bounds, strictly increasing; cumulative counts


@dataclass(frozen=True)
class HistogramSnapshot:
    """Cumulative state of one histogram (summed over engines): `buckets` is (upper bound, cumulative count)."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float

    def minus(self, older: HistogramSnapshot) -> HistogramSnapshot | None:
        """Observations made between `older` and self; None when the bucket layouts differ."""
        les = list(map(_FIRST, self.buckets))
        if les != list(map(_FIRST, older.buckets)):
            return None
        return HistogramSnapshot(  # each count's difference, pairs built in C (7 histograms a scrape)
            buckets=tuple(zip(les, map(operator.sub, map(_SECOND, self.buckets), map(_SECOND, older.buckets)),
                              strict=True)),
            sum=self.sum - older.sum,
            count=self.count - older.count,
        )

    def went_down(self, older: HistogramSnapshot) -> bool:
        """A cumulative count that decreased: the process behind the page restarted."""
        if self.count < older.count:
            return True
        old = dict(older.buckets)
        return any(le in old and c < old[le] for le, c in self.buckets)

    def same_layout(self, other: HistogramSnapshot) -> bool:
        """The same bucket bounds in the same order: only then are the bucket series the same ones."""
        a, b = self.buckets, other.buckets
        return len(a) == len(b) and all(map(operator.eq, map(_FIRST, a), map(_FIRST, b)))

    def reset_correction(self, older: HistogramSnapshot) -> HistogramSnapshot | None:
        """What Prometheus adds back at a counter reset between `older` and self (same layout): for each series
        that went down, its previous value (so the increase over that step is the new value, not a negative
        delta); None when no series went down, which is the common case and costs no allocation."""
        if self.sum >= older.sum and self.count >= older.count and all(
                c >= o for (_, c), (_, o) in zip(self.buckets, older.buckets, strict=True)):
            return None
        return HistogramSnapshot(
            buckets=tuple((le, o if c < o else 0.0) for (le, c), (_, o) in zip(self.buckets, older.buckets,
                                                                                 strict=True)),
            sum=older.sum if self.sum < older.sum else 0.0,
            count=older.count if self.count < older.count else 0.0,
        )

    def plus(self, other: HistogramSnapshot) -> HistogramSnapshot:
        """Series by series sum (same layout)."""
        return HistogramSnapshot(
            buckets=tuple((le, c + o) for (le, c), (_, o) in zip(self.buckets, other.buckets, strict=True)),
            sum=self.sum + other.sum,
            count=self.count + other.count,
        )

    @staticmethod
    def zero_like(other: HistogramSnapshot) -> HistogramSnapshot:
        return HistogramSnapshot(tuple((le, 0.0) for le, _ in other.buckets), 0.0, 0.0)


def bucket_quantile(q: float, buckets: list[tuple[float, float]] | tuple[tuple[float, float], ...]) -> float:
    """Prometheus' bucketQuantile: `buckets` are (upper bound, cumulative count), in any order.

    Returns NaN where Prometheus does (no +Inf bucket, fewer than two buckets, no observations); a rank in the
    +Inf bucket returns the upper bound of the last finite bucket; the first bucket's lower bound is 0 unless
    its upper bound is <= 0, in which case that upper bound is returned.
    """
    return quantile_of(q, prepared(buckets))


def prepared(buckets: list[tuple[float, float]] | tuple[tuple[float, float], ...]) -> _Prepared | None:
    """The buckets as bucketQuantile reads them (sorted, coalesced, monotonic): (bounds, cumulative counts); None
    where every quantile is NaN. Several quantiles of one histogram share this work.

    Bounds already strictly increasing (every window of a page's histogram: page.py sorts them, once each) take
    no Python step per bucket: the monotonic counts are one C `accumulate(max)` and `quantile_of` finds the
    rank's bucket by bisection (7 histograms x 3 quantiles a scrape, issue 29.3)."""
    les = list(map(_FIRST, buckets))
    if not all(map(operator.lt, les, les[1:])):
        return _prepared_slow(buckets)
    return _monotonic(les, map(_SECOND, buckets))


def _prepared_slow(buckets: list[tuple[float, float]] | tuple[tuple[float, float], ...]) -> _Prepared | None:
    """`prepared` for bounds in any order or repeated (summed label sets)."""
    bs = sorted(buckets, key=_FIRST)
    # coalesceBuckets: the same bound twice (after summing label sets) counts once, with the counts added.
    merged: list[list[float]] = []
    for le, c in bs:
        if merged and merged[-1][0] == le:
            merged[-1][1] += c
        else:
            merged.append([le, c])
    return _monotonic(list(map(_FIRST, merged)), map(_SECOND, merged))


def _monotonic(les: list[float], counts: Iterable[float]) -> _Prepared | None:
    """Sorted, coalesced bounds with their counts made monotonic; None where every quantile is NaN."""
    if not les or not math.isinf(les[-1]) or les[-1] < 0:
        return None
    # ensureMonotonic: a scrape can catch buckets mid-update; never let a cumulative count decrease.
    mono = list(accumulate(counts, max, initial=-math.inf))[1:]
    if len(les) < 2 or mono[-1] == 0:
        return None
    return les, mono


def quantile_of(q: float, merged: _Prepared | None) -> float:
    """bucketQuantile's answer for q over `prepared` buckets."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    if merged is None:
        return math.nan
    les, counts = merged
    last = len(les) - 1
    rank = q * counts[-1]
    # sort.Search over all but the +Inf bucket: the first bucket whose count reaches the rank (counts are
    # monotonic, so bisection finds the one the scan did; a NaN rank reaches none)
    b = last if rank != rank else bisect_left(counts, rank, 0, last)
    if b == last:
        return les[-2]
    if b == 0 and les[0] <= 0:
        return les[0]
    start, end, count = 0.0, les[b], counts[b]
    if b > 0:
        start = les[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    if count == 0:  # only reachable with q == 0: Prometheus would divide 0 by 0
        return start
    return start + (end - start) * (rank / count)


def lowest_bound(les: Iterable[float]) -> float | None:
    """The upper bound of a histogram's lowest bucket, where a quantile at or below it is an upper bound only; None
    with fewer than two finite bounds: a rank in +Inf then also answers the one finite bound, which is a lower
    bound there (`quantile_of`), so a quantile equal to it could be either."""
    finite = sorted({le for le in les if math.isfinite(le)})
    return finite[0] if len(finite) >= 2 else None


def _increases(new: Iterable[float], old: Iterable[float]) -> Iterable[float]:
    """Each count's increase, never below 0, in C: a corrected count only goes down where a correction was missed
    (never on a page read right), and a negative bucket would pin every percentile at the top bucket."""
    return map(max, map(operator.sub, new, old), repeat(0.0))


class SlidingHistogram:
    """Snapshots of one cumulative histogram over time, answering quantiles over the last `window_s` seconds.

    The window holds counter-corrected snapshots: each raw snapshot plus everything its series lost at resets
    since this object started (Prometheus' counterCorrection). The window's increase is then newest minus
    baseline, which equals Prometheus' per-series `increase()` over the same samples, resets included; without
    a reset the correction is absent and the figures are the raw differences, bit for bit.

    `corrected=True`: the caller already corrected each series before summing (the scraper does, per engine, as
    Prometheus' `sum(rate())` does); then only a change of bucket bounds starts over, and a float `_sum` summed in
    another order (an ulp lower) is never taken for a reset.
    """

    def __init__(self, window_s: float, corrected: bool = False):
        self.window_s = window_s
        self.corrected = corrected
        self._snaps: deque[tuple[float, HistogramSnapshot]] = deque()
        self._last: HistogramSnapshot | None = None  # the newest raw snapshot, to detect the next reset
        self._correction: HistogramSnapshot | None = None  # sum of reset corrections so far; None: no reset yet
        self._window: tuple[HistogramSnapshot | None] | None = None  # window() since the last add (a row asks 4x)
        self._prepared: tuple[_Prepared | None] | None = None  # its buckets, prepared for quantiles
        # the newest snapshot's bucket bounds, which every snapshot of the window shares (other bounds start the
        # window over), and whether they increase: read once an add, not again by each window and its quantiles
        self._les: list[float] = []
        self._increasing = False
        self._lowest: float | None = None  # the lowest bucket's bound of those bounds (`lowest_bound`)

    def add(self, now: float, snap: HistogramSnapshot) -> bool:
        """Record a scrape; returns True when a series went down (the server behind the page restarted)."""
        reset = False
        self._window = self._prepared = None
        last = self._last
        if last is not None:
            if not snap.same_layout(last):
                # Other bucket bounds (restarted with other buckets): nothing to subtract from. The new process
                # counted from zero just after our last scrape; what came before cannot be merged into one window.
                last_t = self._snaps[-1][0]
                self._snaps.clear()
                self._snaps.append((last_t, HistogramSnapshot.zero_like(snap)))
                self._correction = None
                reset = True
            elif not self.corrected:
                fix = snap.reset_correction(last)
                if fix is not None:
                    self._correction = fix if self._correction is None else self._correction.plus(fix)
                    reset = True
        self._last = snap
        les = list(map(_FIRST, snap.buckets))
        if les != self._les:  # the same floats: the same order
            self._increasing = all(map(operator.lt, les, les[1:]))
            self._lowest = lowest_bound(les)
        self._les = les
        self._snaps.append((now, snap if self._correction is None else snap.plus(self._correction)))
        # Keep one snapshot at or before the window's start as the baseline.
        while len(self._snaps) >= 2 and self._snaps[1][0] <= now - self.window_s:
            self._snaps.popleft()
        return reset

    @property
    def last(self) -> HistogramSnapshot | None:
        """The newest snapshot as given (held by the scraper on a page where it is no reading)."""
        return self._last

    @property
    def lowest_bound(self) -> float | None:
        """The upper bound of the lowest bucket (see `lowest_bound`): a quantile at or below it lies in that bucket,
        interpolated from 0, and is known only to be at most it."""
        return self._lowest

    def clear(self) -> None:
        self._snaps.clear()
        self._last = self._correction = None
        self._window = self._prepared = None
        self._les = []
        self._lowest = None

    def window(self) -> HistogramSnapshot | None:
        """Observations over the window (from the baseline to the newest scrape); None before two scrapes."""
        if self._window is None:
            self._window = (self._delta() if len(self._snaps) >= 2 else None,)
        return self._window[0]

    def _delta(self) -> HistogramSnapshot:
        """Newest minus baseline: what `minus` gives, its bounds not compared again (the window's share them), each
        count at least 0 (`_increases`; `mean` gives None for a `_sum` gone down)."""
        new, old = self._snaps[-1][1], self._snaps[0][1]
        return HistogramSnapshot(
            buckets=tuple(zip(self._les, _increases(map(_SECOND, new.buckets), map(_SECOND, old.buckets)),
                              strict=True)),
            sum=new.sum - old.sum,
            count=max(new.count - old.count, 0.0),
        )

    def quantile(self, q: float) -> float | None:
        """The q-quantile over the window, in the histogram's unit; None for an empty window."""
        if len(self._snaps) < 2:
            return None
        if self._prepared is None:
            self._prepared = (self._prepare(),)
        value = quantile_of(q, self._prepared[0])
        return None if math.isnan(value) else value

    def _prepare(self) -> _Prepared | None:
        """The window's buckets prepared for quantiles. Bounds increasing (a page's histogram): the counts are
        newest minus baseline straight into `prepared`'s own path, no (bound, count) pairs or snapshot built for
        it (the scraper asks 7 histograms a scrape, each moving under load); otherwise from `window()`."""
        new, old = self._snaps[-1][1].buckets, self._snaps[0][1].buckets
        if self._increasing and len(new) == len(old) == len(self._les):
            return _monotonic(self._les, _increases(map(_SECOND, new), map(_SECOND, old)))
        delta = self.window()
        if delta is None:  # never: two snapshots or more
            return None
        return _monotonic(self._les, map(_SECOND, delta.buckets)) if self._increasing else prepared(delta.buckets)

    def count(self) -> int | None:
        """Observations over the window: the `_count` increase from the baseline to the newest scrape (vLLM's
        requests; the ITL histogram's inter-token intervals), the sample size of `quantile`'s figures; None before
        two scrapes. Two snapshots' counts subtracted: no bucket read (issue 29)."""
        if len(self._snaps) < 2:
            return None
        n = self._snaps[-1][1].count - self._snaps[0][1].count
        return max(0, round(n)) if math.isfinite(n) else None

    def mean(self) -> float | None:
        """The window's `_sum` over its `_count` (newest minus baseline each); None for an empty window."""
        if len(self._snaps) < 2:
            return None
        new, old = self._snaps[-1][1], self._snaps[0][1]
        count, total = new.count - old.count, new.sum - old.sum
        if count <= 0 or total < 0:
            return None
        return total / count
