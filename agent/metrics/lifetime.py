"""Serving counters and latency histograms over the agent's life: what the exporter's `_total` and `_bucket` count.

vLLM's counters start over whenever vLLM does, so a fleet's `sum(rate(vllm:...))` loses what a restarted server
had counted since its last scrape, and a per-run gauge cannot be aggregated at all. The agent outlives the server:
it adds up the increases it sees page after page, per `model_name`, and those sums only start over when the agent
does. Prometheus then sees no counter reset at a vLLM restart, and `histogram_quantile` over the buckets is the
fleet's real percentile.

Nothing is corrected twice: each page's sums come from the scraper already corrected for resets within one run
(agent/metrics/scrape.py, per series before summing, as Prometheus does); here only the step from one run to the next is
added. A new run's first page is counted whole, since the supervisor started that process after the agent's
previous run (everything it counted is new). The first run the agent sees may be adopted from a previous agent:
its first page only sets the baseline, as a scraper's first page does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lynxtop.agent.metrics.continuity import _SeriesCorrection, held
from lynxtop.agent.metrics.histogram import HistogramSnapshot
from lynxtop.agent.metrics.page import ParsedPage, SeriesKey
from lynxtop.agent.metrics.promtext import label_value

COUNTERS = ("prompt_tokens", "generation_tokens", "preemptions")  # keys of agent/metrics/families.py's COUNTERS
MAX_MODELS = 32  # model names kept: a node serves a few over the agent's life; the oldest goes past this
# finished_reason values kept per model (vLLM has four: stop, length, abort, error); past this a new reason's count
# goes to OTHER_REASON, so a server inventing reasons cannot grow the page and Prometheus' series without bound
MAX_REASONS = 64
OTHER_REASON = "other"


@dataclass
class ModelTotals:
    """One model's sums since the agent started: counters by agent/metrics/scrape.py's keys, finished requests by
    `finished_reason`, histograms by latency series (cumulative buckets with vLLM's bounds)."""

    counters: dict[str, float] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, HistogramSnapshot] = field(default_factory=dict)


def _increase(prev: float, cur: float) -> float:
    """What a corrected sum grew by. It goes down only when the scraper started a sum over (new bucket bounds, a
    family back after vanishing): counted from zero then, as the scraper's windows do. An ulp lower (float sums
    added in another order) is no increase; NaN is none either."""
    d = cur - prev
    if d >= 0:
        return d
    if d != d:  # NaN
        return 0.0
    return max(cur, 0.0) if -d > 1e-9 * max(1.0, abs(prev)) else 0.0


def _hist_increase(prev: HistogramSnapshot | None, cur: HistogramSnapshot) -> HistogramSnapshot:
    """Observations between two corrected snapshots; all of `cur` when there is no comparable previous one."""
    if prev is None or not cur.same_layout(prev):
        return cur
    return HistogramSnapshot(tuple((le, _increase(p, c)) for (le, c), (_, p) in zip(cur.buckets, prev.buckets,
                                                                                       strict=True)),
                             _increase(prev.sum, cur.sum), _increase(prev.count, cur.count))


class ServingTotals:
    """Fed with each scraper after its pages (`observe`); read by the exporter (`models`). One per agent.

    `kept=False` (an agent without the exporter: nothing ever reads them) makes `observe` add nothing, so the
    scrape does not pay for them: ~0.4 ms of the event loop per DP8 page (issue 29.3)."""

    def __init__(self, kept: bool = True) -> None:
        self.kept = kept
        self.models: dict[str, ModelTotals] = {}
        self._source: Any = None  # the scraper read last: another one is another run
        self._seen_run = False  # a run was read before: a new run's first page counts whole
        self._page: ParsedPage | None = None  # the page last added (a scraper keeps its last page between scrapes)
        self._counters: dict[str, float] = {}
        self._hists: dict[str, HistogramSnapshot] = {}
        self._reasons = _SeriesCorrection()
        self._reason_vals: dict[SeriesKey, float] = {}
        self._reason_of: dict[SeriesKey, str] = {}
        self._model = ""
        self._hidden: set[str] = set()  # stale (a bad sample) before they had a baseline: their total was there
        self._from_zero = False  # this run's first page counted whole: a series first read later counts whole too

    def observe(self, scraper: Any) -> None:
        """Add what `scraper`'s last page (its `totals`) counted since the page added before; calling again
        without a new page adds nothing."""
        totals = getattr(scraper, "totals", None)
        if totals is None or not self.kept:
            return
        page, counters, hists = totals
        if page is self._page:
            return
        if scraper is not self._source:  # a new run: its first page counts from zero, unless it is the first
            fresh = self._seen_run
            self._source, self._seen_run = scraper, True
            self._model = _model_of(page)
            self._reasons = _SeriesCorrection()
            self._hidden, self._from_zero = set(), fresh
            if fresh:
                self._counters, self._hists, self._reason_vals = {}, {}, {}
            else:
                self._counters, self._hists = dict(counters), dict(hists)
                self._reason_vals = dict(_finished_series(page))
                self._reasons.update(self._reason_vals)
        elif not self._model:  # the first page named no model (its samples no reading): the first that does
            self._model = _model_of(page)
        self._page = page
        hidden = self._hidden
        if page.stale and not self._from_zero:
            hidden.update(k for k in page.stale if k not in self._counters and k not in self._hists)
        m = self._totals(self._model)
        for key in COUNTERS:
            if key not in counters:
                continue
            if key in hidden:  # first read after a bad sample hid it: a baseline, not an increase from zero
                hidden.discard(key)
                continue
            m.counters[key] = m.counters.get(key, 0.0) + _increase(self._counters.get(key, 0.0), counters[key])
        for key, snap in hists.items():
            if key in hidden:
                hidden.discard(key)
                continue
            self._add_histogram(m, key, _hist_increase(self._hists.get(key), snap))
        self._add_finished(m, page)
        self._counters, self._hists = dict(counters), dict(hists)

    def _totals(self, model: str) -> ModelTotals:
        m = self.models.get(model)
        if m is None:
            if len(self.models) >= MAX_MODELS:
                del self.models[next(iter(self.models))]
            m = self.models[model] = ModelTotals()
        return m

    @staticmethod
    def _add_histogram(m: ModelTotals, key: str, inc: HistogramSnapshot) -> None:
        acc = m.histograms.get(key)
        if acc is None or not acc.same_layout(inc):
            # other bucket bounds (another vLLM version): this histogram starts over; Prometheus sees a reset
            acc = HistogramSnapshot.zero_like(inc)
        m.histograms[key] = acc.plus(inc)

    def _add_finished(self, m: ModelTotals, page: ParsedPage) -> None:
        """Finished requests per `finished_reason`: per series, with the scraper's own reset correction."""
        prev = self._reason_vals
        cur = _finished_series(page, prev)
        if not cur and not prev:
            return
        fix, _ = self._reasons.update(cur)
        fix = fix or {}
        for key in cur.keys() | prev.keys():
            inc = cur.get(key, 0.0) - prev.get(key, 0.0) + fix.get(key, 0.0)
            if not inc > 0:  # NaN, nothing, or float noise
                continue
            reason = self._reason(key)
            if reason not in m.finished and len(m.finished) >= MAX_REASONS - 1:  # room kept for OTHER_REASON
                reason = OTHER_REASON
            m.finished[reason] = m.finished.get(reason, 0.0) + inc
        self._reason_vals = dict(cur)

    def _reason(self, key: SeriesKey) -> str:
        r = self._reason_of.get(key)
        if r is None:
            if len(self._reason_of) >= 10_000:  # a server inventing label sets cannot grow this further
                self._reason_of.clear()
            # read at its pair (agent/metrics/promtext.py): no other label's value passes for the reason
            r = self._reason_of[key] = label_value(key, "finished_reason") or ""
        return r


def _finished_series(page: ParsedPage, prev: dict[SeriesKey, float] | None = None) -> dict[SeriesKey, float]:
    """vllm:request_success_total, series by series (engine, finished_reason); one that is no reading on this page
    (NaN) held at its value in `prev`, as the scraper's sums hold it (continuity.held)."""
    keys, values = page.series_lists.get(("counter", "requests"), ((), ()))
    cur = dict(zip(keys, values, strict=True))
    total = sum(values)
    return cur if total == total else held(cur, prev or {})


def _model_of(page: ParsedPage) -> str:
    """The `model_name` label vLLM puts on its series, as vLLM set it (the page escapes it: the exporter escapes
    it once when it writes it), "" on a page without one."""
    for keys, _ in page.series_lists.values():
        for key in keys:
            model = label_value(key, "model_name")
            if model is not None:
                return model
    return ""
