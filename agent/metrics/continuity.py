"""Counter continuity: per-series reset correction and the per-counter sliding window, as Prometheus counts.

Owns what keeps a cumulative quantity's increases true across a vLLM restart, an engine scaling down or a proxy
switching backends: `_SeriesCorrection` (one family's series, corrected before summing), `ResetCorrections` (the
offsets each corrected sum carries, by family) and `_CounterWindow` (one counter's per-tick delta and its delta
over the window). Invariant: with no series ever going down, every figure is the page's raw sum, bit for bit.
"""

from __future__ import annotations

import math
import operator
from collections import deque
from collections.abc import Sequence

from lynxtop.agent.metrics.histogram import HistogramSnapshot
from lynxtop.agent.metrics.page import ParsedPage, SeriesKey
from lynxtop.agent.metrics.promtext import label_value

# vanished series remembered per family (a server inventing label sets cannot grow this further): a DP=8 page's
# largest family has ~180 series, so this is nearly three pages' worth; 4096 let a label that changes every scrape
# keep up to 29 families x 4096 keys (benchmarks/peer_memory.py's churn grew past 2x the normal RSS)
MAX_GONE = 512
_FIRST = operator.itemgetter(0)


class _SeriesCorrection:
    """Prometheus' counter correction per series, for a quantity the page gives summed over series (engines).

    Prometheus checks each series for a reset and sums afterwards (`sum(increase(x[1m]))`); summing first would
    miss one engine restarting while the total still grows, and take a scale-down (an engine's series gone) for a
    reset. `update` returns what to add to this page's sum so the sum only moves by Prometheus' increases: at a
    reset the series' previous value; for a series that vanished its last value (its increases stay in the window);
    for one that comes back, minus that value again unless it came back lower (then it is a reset). A series that
    is no reading on a page (NaN) holds its last value (`held`): NaN is never a previous value, never below one
    (a restart behind it would be missed), and never in what is added (it would stay in the sum for good).
    """

    __slots__ = ("_keys", "_vals", "_gone")

    def __init__(self) -> None:
        self._keys: tuple[SeriesKey, ...] | None = None
        self._vals: Sequence[float] = ()
        self._gone: dict[SeriesKey, float] = {}

    def update(self, cur: dict[SeriesKey, float]) -> tuple[dict[SeriesKey, float] | None, bool]:
        """({series: correction} or None when nothing to correct, whether a series went down)."""
        return self.update_lists(tuple(cur), tuple(cur.values()))

    def update_lists(self, keys: tuple[SeriesKey, ...], vals: Sequence[float]
                     ) -> tuple[dict[SeriesKey, float] | None, bool]:
        """`update` for the series as (keys, values), each key once (ParsedPage.series_lists)."""
        prev_keys, prev_vals = self._keys, self._vals
        total = sum(vals)
        if total != total:  # NaN: a series that is no reading on this page (the page's sums left it out)
            now = held(dict(zip(keys, vals, strict=True)), dict(zip(prev_keys or (), prev_vals, strict=True)))
            keys, vals = tuple(now), tuple(now.values())
        self._keys, self._vals = keys, vals
        if prev_keys is None:
            return None, False
        if keys is prev_keys or keys == prev_keys:  # the same series in the same order: a steady server's pages
            if not any(map(operator.lt, vals, prev_vals)):
                return None, False
            return {k: p for k, v, p in zip(keys, vals, prev_vals, strict=True) if v < p}, True
        prev = dict(zip(prev_keys, prev_vals, strict=True))
        fix: dict[SeriesKey, float] = {}
        reset = False
        gone = self._gone
        for k, v in zip(keys, vals, strict=True):
            p = prev.pop(k, None)
            if p is not None:
                if v < p:
                    fix[k] = p
                    reset = True
            elif gone:  # back after a gap: continue from its last value, as Prometheus skips stale markers
                q = gone.pop(k, None)
                if q is not None:
                    if v < q:
                        reset = True
                    else:
                        fix[k] = -q
        for k, p in prev.items():  # vanished: what it counted stays counted
            gone[k] = p
            fix[k] = p
        while len(gone) > MAX_GONE:  # labels that change every scrape: forget the oldest (it comes back as new)
            del gone[next(iter(gone))]
        return fix or None, reset


def held(cur: dict[SeriesKey, float], prev: dict[SeriesKey, float]) -> dict[SeriesKey, float]:
    """A page's series with each that is no reading (NaN) at its value in `prev`, and left out where it has none
    there (never read, or vanished before: it stays so): what one unreadable page changes is nothing."""
    out: dict[SeriesKey, float] = {}
    for k, v in cur.items():
        if v != v:
            p = prev.get(k)
            if p is None or p != p:
                continue
            v = p
        out[k] = v
    return out


def _num(text: str) -> float:
    """A label's number as written ("0.5", "+Inf"); NaN where it is not one."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def _le(series: SeriesKey) -> float:
    """The `le` bound of a bucket series' key (only read when a bucket needs a correction)."""
    le = label_value(series, "le")  # read at its pair: no other label's value passes for it
    return math.nan if le is None else _num(le)


class _CounterWindow:
    """One cumulative counter over time: per-tick deltas and deltas over the sliding window, reset-aware.

    Points are stored counter-corrected, as Prometheus' `increase()` sees them: at a reset (value below the
    previous one) the previous value is added to every later point, so that step's increase is the new value
    and the increases before the reset stay in the window until they age out. `corrected=True`: the caller
    corrected each series before summing (see `_SeriesCorrection`); only float noise could go down then, never
    taken for a reset.
    """

    def __init__(self, window_s: float, corrected: bool = False):
        self.window_s = window_s
        self.corrected = corrected
        self._points: deque[tuple[float, float]] = deque()
        self._raw = 0.0  # the newest value as read, to detect the next reset
        self._correction = 0.0  # sum of the values lost at resets so far
        self.last_delta: float | None = None
        self.last_dt: float | None = None
        self.last_value: float | None = None  # the newest value as given (held on a page where it is no reading)

    def add(self, now: float, value: float) -> bool:
        """Record a reading; returns True when the counter went down (the server restarted)."""
        reset = False
        if self._points:
            if value < self._raw and not self.corrected:  # a reset: counted from zero, so the increase is `value`
                self._correction += self._raw
                self.last_delta = value
                reset = True
            else:
                self.last_delta = value - self._raw
            self.last_dt = now - self._points[-1][0]
        else:
            self.last_delta = self.last_dt = None
        self._raw = value
        self._points.append((now, value + self._correction))
        self.last_value = value
        while len(self._points) >= 2 and self._points[1][0] <= now - self.window_s:
            self._points.popleft()
        return reset

    def window_delta(self) -> float | None:
        if len(self._points) < 2:
            return None
        return self._points[-1][1] - self._points[0][1]

    def rate(self) -> float | None:
        """The last step's increase per second; None without one, or for a negative one (a cumulative count that
        went down past every correction is no reading, never a negative rate)."""
        if self.last_delta is None or self.last_delta < 0 or not self.last_dt or self.last_dt <= 0:
            return None
        return self.last_delta / self.last_dt



class ResetCorrections:
    """The per-series counter corrections of one server's page, for every counter and histogram it gives.

    Owns, per family, the `_SeriesCorrection` of its series and what they add up to: an offset per corrected sum
    (`offsets`, keyed ("counter" | "sum" | "count", key)) and per histogram bucket (`bucket_offsets`). A histogram
    whose bucket bounds change, or a family that vanishes, starts over: its corrections are dropped with it.
    """

    def __init__(self) -> None:
        self.series: dict[tuple[str, str], _SeriesCorrection] = {}
        self.offsets: dict[tuple[str, str], float] = {}  # ("counter" | "sum" | "count", key) -> added to the sum
        self.bucket_offsets: dict[str, dict[float, float]] = {}  # histogram key -> le -> added to that bucket
        self._layouts: dict[str, tuple[float, ...]] = {}

    def corrected(self, page: ParsedPage) -> tuple[dict[str, float], dict[str, HistogramSnapshot], list[str]]:
        """The page's sums with Prometheus' per-series counter correction applied, and the keys that had a series
        go down on this page. Without any reset so far the page's own dicts are returned untouched."""
        self._check_layouts(page)
        went_down: list[str] = []
        for sk, (keys, vals) in page.series_lists.items():
            corr = self.series.get(sk)
            if corr is None:
                corr = self.series[sk] = _SeriesCorrection()
            fix, reset = corr.update_lists(keys, vals)
            if reset and sk[1] not in went_down:
                went_down.append(sk[1])
            if fix:
                self._book(sk, fix)
        if len(self.series) > len(page.series_lists):  # a whole family vanished: it starts over if it comes back
            self._forget_vanished(page)
        if not (self.offsets or self.bucket_offsets):
            return page.counters, page.histograms, went_down
        off = self.offsets
        counters = {k: v + off.get(("counter", k), 0.0) for k, v in page.counters.items()}
        hists = {key: self._offset_histogram(key, snap) for key, snap in page.histograms.items()}
        return counters, hists, went_down

    def _check_layouts(self, page: ParsedPage) -> None:
        """A histogram with other buckets than before starts its window over: so do its corrections."""
        for key, snap in page.histograms.items():
            layout = tuple(map(_FIRST, snap.buckets))
            if self._layouts.get(key, layout) != layout:
                for kind in ("bucket", "sum", "count"):
                    self.series.pop((kind, key), None)
                    self.offsets.pop((kind, key), None)
                self.bucket_offsets.pop(key, None)
            self._layouts[key] = layout

    def _book(self, sk: tuple[str, str], fix: dict[SeriesKey, float]) -> None:
        """Add one page's per-series corrections to the offsets of the sum they belong to."""
        if sk[0] == "bucket":
            per = self.bucket_offsets.setdefault(sk[1], {})
            for series, x in fix.items():
                le = _le(series)
                per[le] = per.get(le, 0.0) + x
        else:
            self.offsets[sk] = self.offsets.get(sk, 0.0) + math.fsum(fix.values())

    def _forget_vanished(self, page: ParsedPage) -> None:
        for sk in [sk for sk in self.series if sk not in page.series_lists]:
            del self.series[sk]
            self.offsets.pop(sk, None)
            if sk[0] == "bucket":
                self.bucket_offsets.pop(sk[1], None)
                self._layouts.pop(sk[1], None)

    def _offset_histogram(self, key: str, snap: HistogramSnapshot) -> HistogramSnapshot:
        off = self.offsets
        per = self.bucket_offsets.get(key)
        s_off, n_off = off.get(("sum", key), 0.0), off.get(("count", key), 0.0)
        if not (per or s_off or n_off):
            return snap
        per = per or {}
        return HistogramSnapshot(tuple((le, c + per.get(le, 0.0)) for le, c in snap.buckets),
                                 snap.sum + s_off, snap.count + n_off)
