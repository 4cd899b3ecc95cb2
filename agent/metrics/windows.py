"""The scraper's sliding windows: per-tick and windowed counter figures, latency percentiles and means.

Owns one `_CounterWindow` per counter and one `SlidingHistogram` per latency histogram of the server being read,
all over `window_s`. Invariants: a quantity whose page value is no reading holds its last value (no made-up
increase, the window stays); a quantity that vanishes from the page is forgotten and starts over if it comes
back; one that first appears after a page was read starts from zero at that page's time.
"""

from __future__ import annotations

from typing import Any

from lynxtop.agent.metrics.continuity import _CounterWindow
from lynxtop.agent.metrics.families import DERIVED_MEANS, QUANTILES
from lynxtop.agent.metrics.histogram import HistogramSnapshot, SlidingHistogram
from lynxtop.contract.columns import LATENCY_SERIES, lowest_bucket_column

# each latency series' percentile columns with their quantile, its mean column and the column of its lowest
# bucket's bound: named once, not per scrape
_LATENCY_COLUMNS = tuple((series, tuple((f"{series}_{stat}_ms", q) for stat, q in QUANTILES), f"{series}_mean_ms",
                          lowest_bucket_column(series))
                         for series in LATENCY_SERIES)


class ServingWindows:
    """Counters and histograms (already corrected for resets, summed over engines) over the last `window_s`."""

    def __init__(self, window_s: float):
        self.window_s = window_s
        self.counters: dict[str, _CounterWindow] = {}
        self.hists: dict[str, SlidingHistogram] = {}
        self._last_ok_t: float | None = None
        self._stale: set[str] = set()  # counters and histograms the page being read adds nothing to
        # stale before any value was read: on the page that first reads them they were there all along (a bad
        # sample hid them), so they take no zero baseline (that would count their whole total as one tick's)
        self._unbased: set[str] = set()
        # each latency series' observations over the window, as of the last `latency_columns` (SlidingHistogram.count):
        # the sample size of its percentiles; a new dict each page, never changed after
        self.counts: dict[str, int] = {}

    def clear(self) -> None:
        """Forget history (a new run): the next page only sets baselines."""
        self.counters.clear()
        self.hists.clear()
        self._last_ok_t = None
        self._unbased.clear()
        self.counts = {}

    def add(self, stale: set[str], counters: dict[str, float], hists: dict[str, HistogramSnapshot], now: float,
            went_down: list[str]) -> tuple[dict[str, float], dict[str, HistogramSnapshot]]:
        """Add one read page's sums (`stale`: those with a bad sample on it); appends to `went_down` what a
        window saw go down. Returns the sums as held (what lifetime totals add up)."""
        self._stale = stale
        if stale:
            counters, hists = self._held(stale, counters, hists)
        self._add_counters(counters, now, went_down)
        self._add_histograms(hists, now, went_down)
        self._last_ok_t = now
        return counters, hists

    def _held(self, stale: set[str], counters: dict[str, float], hists: dict[str, HistogramSnapshot]
              ) -> tuple[dict[str, float], dict[str, HistogramSnapshot]]:
        """A counter or histogram with a bad sample on this page holds its last value: no increase is made up
        (an engine's series left out of the sum would look like a drop, then a jump), and the window stays."""
        counters, hists = dict(counters), dict(hists)
        for key in stale:
            cw, sh = self.counters.get(key), self.hists.get(key)
            if cw is not None and cw.last_value is not None:
                counters[key] = cw.last_value
            else:
                counters.pop(key, None)
            if sh is not None and sh.last is not None:
                hists[key] = sh.last
            else:
                hists.pop(key, None)
            if key not in counters and key not in hists:
                self._unbased.add(key)
        return counters, hists

    def _add_counters(self, counters: dict[str, float], now: float, went_down: list[str]) -> None:
        # A series that appears on a page we read before started from zero since then (vLLM creates some
        # label sets lazily); on the first page there is no baseline at all.
        for key, value in counters.items():
            if key in self._stale:
                continue  # held at its last value: nothing to add
            cw = self.counters.get(key)
            if cw is None:
                cw = self.counters[key] = _CounterWindow(self.window_s, corrected=True)
                if self._last_ok_t is not None and key not in self._unbased:
                    cw.add(self._last_ok_t, 0.0)
                self._unbased.discard(key)
            if cw.add(now, value) and key not in went_down:
                went_down.append(key)
        for key in set(self.counters) - set(counters):
            del self.counters[key]  # the series vanished: start over if it comes back

    def _add_histograms(self, hists: dict[str, HistogramSnapshot], now: float, went_down: list[str]) -> None:
        for key, snap in hists.items():
            if key in self._stale:
                continue
            sh = self.hists.get(key)
            if sh is None:
                sh = self.hists[key] = SlidingHistogram(self.window_s, corrected=True)
                if self._last_ok_t is not None and key not in self._unbased:
                    sh.add(self._last_ok_t, HistogramSnapshot.zero_like(snap))
                self._unbased.discard(key)
            if sh.add(now, snap) and key not in went_down:
                went_down.append(key)
        for key in set(self.hists) - set(hists):
            del self.hists[key]

    def counter_columns(self, row: dict[str, Any]) -> None:
        """Rates, per-tick counts and windowed ratios of the counters, into the row."""
        row["requests_per_s"] = self._rate("requests")
        row["prompt_tokens_per_s"] = self._rate("prompt_tokens")
        row["generation_tokens_per_s"] = self._rate("generation_tokens")
        row["requests_finished"] = self._delta("requests")  # INTEGER columns: made ints by row.checked
        row["prompt_tokens"] = self._delta("prompt_tokens")
        row["generation_tokens"] = self._delta("generation_tokens")
        row["preemptions"] = self._delta("preemptions")
        row["prefix_cache_hit_pct"] = self._ratio_pct("prefix_hits", "prefix_queries")
        row["spec_decode_acceptance_pct"] = self._ratio_pct("spec_accepted", "spec_drafted")

    def latency_columns(self, row: dict[str, Any]) -> None:
        """Percentiles and means over the window of each latency series, in ms, into the row; with percentiles,
        the bound of the lowest bucket too (a percentile at or below it is only known to be at most it); and in
        `counts` how many observations each series' window holds (a p99 of one request is shown with its 1)."""
        counts: dict[str, int] = {}
        for series, columns, mean_column, lowest_column in _LATENCY_COLUMNS:
            sh = self.hists.get(series)
            n = None if sh is None else sh.count()
            if n is not None:
                counts[series] = n
            known = False
            for column, q in columns:
                value = None if sh is None else sh.quantile(q)
                row[column] = None if value is None else value * 1000.0
                known = known or value is not None
            lowest = sh.lowest_bound if sh is not None and known else None
            row[lowest_column] = None if lowest is None else lowest * 1000.0  # x1000 as the quantiles: compared
            mean = None if sh is None else sh.mean()
            row[mean_column] = None if mean is None else mean * 1000.0
        derived = [phase for phase, _, _ in DERIVED_MEANS if phase not in self.hists]
        for phase, whole, part in DERIVED_MEANS:
            if phase in derived:  # a difference of means is a mean; percentiles do not subtract, so stay None
                w, b = row[f"{whole}_mean_ms"], row[f"{part}_mean_ms"]
                row[f"{phase}_mean_ms"] = None if w is None or b is None else max(w - b, 0.0)
        row["phase_times_derived"] = 1 if derived else 0
        self.counts = counts

    def _delta(self, key: str) -> float | None:
        """The last step's increase; None for a negative one, as `_CounterWindow.rate` gives."""
        cw = None if key in self._stale else self.counters.get(key)
        delta = None if cw is None else cw.last_delta
        return None if delta is None or delta < 0 else delta

    def _rate(self, key: str) -> float | None:
        cw = None if key in self._stale else self.counters.get(key)
        return None if cw is None else cw.rate()

    def _ratio_pct(self, num: str, den: str) -> float | None:
        n, d = self.counters.get(num), self.counters.get(den)
        if n is None or d is None:
            return None
        dn, dd = n.window_delta(), d.window_delta()
        if dn is None or not dd or dd <= 0:
            return None
        return max(0.0, min(100.0, 100.0 * dn / dd))
