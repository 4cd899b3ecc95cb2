"""Reads vLLM's Prometheus page once per tick and turns it into one `serving` row (contract/columns.py).

vLLM's page changes between versions (0.10 prints old and new names, later versions drop the old ones) and
carries one series per data-parallel engine, so everything is matched by exact sample name, summed over
labels (max for the KV-cache gauge), and percentiles come from bucket differences over a sliding window
(agent/histogram.py). The scraper keeps state between calls; the caller owns the clock (`now`, monotonic s).
"""

from __future__ import annotations

import asyncio
import math
import operator
import re
from collections import deque
from collections.abc import Callable, Sequence
from functools import reduce
from typing import Any

import aiohttp

from lynxtop.agent.histogram import HistogramSnapshot, SlidingHistogram
from lynxtop.agent.promtext import SampleError, le_of, split_sample
from lynxtop.contract.columns import LATENCY_SERIES, SERVING_METRICS, names
from lynxtop.contract.events import EventKind

SERVING_COLUMNS = names(SERVING_METRICS)
# aiohttp asks for gzip by default; a server that honours it (prometheus_client's own ASGI app does; vLLM 0.32's
# instrumentator handler does not) would compress a DP=8 page (~0.3 MB) on its event loop for the agent to inflate.
_PLAIN = {"Accept-Encoding": "identity"}
INLINE_PARSE_CHARS = 1024 * 1024  # larger pages are parsed in a worker thread
MAX_PAGE_BYTES = 8 * 1024 * 1024  # a DP=8 page with two API servers is ~0.5 MiB; past this it is cut off unread

# Each entry: preferred (newest) name first, then older names vLLM used for the same thing.
COUNTERS: dict[str, tuple[str, ...]] = {
    "requests": ("vllm:request_success_total",),
    "prompt_tokens": ("vllm:prompt_tokens_total",),
    "generation_tokens": ("vllm:generation_tokens_total",),
    "preemptions": ("vllm:num_preemptions_total",),
    "prefix_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "spec_drafted": ("vllm:spec_decode_num_draft_tokens_total",),
    "spec_accepted": ("vllm:spec_decode_num_accepted_tokens_total",),
}
GAUGES_SUM: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
}
GAUGES_MAX: dict[str, tuple[str, ...]] = {
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}
HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "tpot": ("vllm:request_time_per_output_token_seconds",),
    "e2e": ("vllm:e2e_request_latency_seconds",),
    "queue": ("vllm:request_queue_time_seconds",),
}
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


class PageError(ValueError):
    """The page is not a vLLM metrics page we can read; the message says why."""


SeriesKey = str  # one series: its sample line up to the value (name and labels, as the page spells them)


class ParsedPage:
    """The values of one page we care about, summed over engines.

    `series` keeps each counter series behind those sums (per engine, per `le`), keyed by ("counter", key),
    ("bucket" | "sum" | "count", histogram key): Prometheus detects a counter reset per series, before summing.
    Values are the floats the page's lines were read as (NaN included: never below anything, so never a reset).
    """

    def __init__(self) -> None:
        self.counters: dict[str, float] = {}
        self.gauges: dict[str, float] = {}
        self.histograms: dict[str, HistogramSnapshot] = {}
        self.series: dict[tuple[str, str], dict[SeriesKey, float]] = {}
        self.engines: dict[str, dict[str, float]] = {}  # engine label -> running / waiting / kv_usage


_HIST_NAMES = frozenset(n for ns in HISTOGRAMS.values() for n in ns)
_SUM_NAMES = frozenset(n for ns in (*COUNTERS.values(), *GAUGES_SUM.values()) for n in ns)
_MAX_NAMES = frozenset(n for ns in GAUGES_MAX.values() for n in ns)
_COUNTER_NAMES = frozenset(n for ns in COUNTERS.values() for n in ns)
_SERIES_NAMES = _COUNTER_NAMES | frozenset(h + s for h in _HIST_NAMES for s in ("_bucket", "_sum", "_count"))
# The names TYPE lines give the families we read: histograms by their base name, counters with and without
# `_total` (prometheus_client's text format writes it, OpenMetrics does not), gauges as sampled.
_TYPED_FAMILIES = _HIST_NAMES | _SUM_NAMES | _MAX_NAMES | frozenset(n[:-6] for n in _COUNTER_NAMES
                                                                   if n.endswith("_total"))
_FIRST = operator.itemgetter(0)
_THIRD = operator.itemgetter(2)
_LE = re.compile(r'[{,]\s*le\s*=\s*"([^"]*)"')
_ENGINE = re.compile(r'[{,]\s*engine\s*=\s*"([^"]*)"')
_GAUGE_NAMES = frozenset(n for ns in (*GAUGES_SUM.values(), *GAUGES_MAX.values()) for n in ns)
_WANTED_SAMPLES = _SUM_NAMES | _MAX_NAMES | frozenset(h + s for h in _HIST_NAMES for s in ("_bucket", "_sum", "_count"))
# A wanted sample line: the newline before it, its name, the rest of the line. Led by a literal "\n" rather than
# a MULTILINE "^", so the regex engine skips from newline to newline in C: a third of the time on a DP8 page.
_WANTED_LINE = re.compile(r"\n((?:" + "|".join(re.escape(n) for n in sorted(_WANTED_SAMPLES, key=len, reverse=True))
                          + r")(?=[{ \t])[^\n]*)")
_TYPE_LINE = re.compile(r"\n# TYPE ([^ \n]*)")


def _name_end(line: str) -> int:
    end = len(line)
    for sep in ("{", " ", "\t"):
        i = line.find(sep, 0, end)
        if i >= 0:
            end = i
    return end


def relevant_lines(text: str) -> tuple[str, bool]:
    """The sample lines we use, and whether the page had any vllm: sample at all (for benchmarks/scale.py)."""
    keep: list[str] = []
    seen = False
    for line in text.splitlines():
        if line.startswith("vllm:"):
            seen = True
            if line[:_name_end(line)] in _WANTED_SAMPLES:
                keep.append(line)
    return "\n".join(keep) + "\n", seen


# What a known series (name and labels exactly as a page spelled them) adds to: its kind, name, `le`, engine.
_GAUGE_SUM, _GAUGE_MAX, _COUNTER, _BUCKET, _PART = range(5)
_SeriesInfo = tuple[int, str, float, str]
_KNOWN: dict[SeriesKey, _SeriesInfo] = {}
_KNOWN_MAX = 200_000  # as promtext's label cache: a server inventing label sets cannot grow this further


def _kind(name: str) -> int:
    if name in _MAX_NAMES:
        return _GAUGE_MAX
    if name in _GAUGE_NAMES:
        return _GAUGE_SUM
    if name in _COUNTER_NAMES:
        return _COUNTER
    return _BUCKET if name.endswith("_bucket") else _PART


class _Totals:
    """The selected samples of one page, added up as Prometheus' `sum by ()` / `max by ()` would.

    Lines are read in page order, so every sum adds the same floats in the same order as prometheus_client's
    parser did (same result to the last digit); NaN samples are skipped, as before. A line of a series seen
    before (`name{labels} value`, the same labels) costs a split and a float: its labels were checked when it
    was first seen (agent/promtext.py), and what it adds to is remembered. Any other line takes that full path.
    """

    __slots__ = ("sums", "maxes", "buckets", "raw", "engines")

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.maxes: dict[str, float] = {}
        self.buckets: dict[str, dict[float, float]] = {}
        self.raw: dict[str, dict[SeriesKey, float]] = {}  # counter and histogram series: value by series
        self.engines: dict[str, dict[str, float]] = {}  # engine label -> gauge sample name -> value

    def add_lines(self, found: list[str]) -> None:
        """Add the wanted sample lines of a page, in page order."""
        known, raw, sums, buckets = _KNOWN, self.raw, self.sums, self.buckets
        last = ""  # a family's lines are contiguous: its dicts are looked up once per family
        per: dict[SeriesKey, float] = {}
        per_le: dict[float, float] = {}
        for line in found:
            key, _, v = line.rpartition(" ")
            info = known.get(key)
            if info is None or "_" in v:
                self._add_checked(line)
                last = ""
                continue
            try:
                value = float(v)
            except ValueError:
                self._add_checked(line)
                last = ""
                continue
            kind, name = info[0], info[1]
            if kind < _COUNTER:
                if value == value:
                    self._gauge(kind, name, info[3], value)
                continue
            if name != last:
                per = raw.setdefault(name, {})
                if kind == _BUCKET:
                    per_le = buckets.setdefault(name[:-7], {})
                last = name
            per[key] = value
            if value != value:  # NaN
                continue
            if kind == _BUCKET:
                le = info[2]
                per_le[le] = per_le.get(le, 0.0) + value
            else:
                sums[name] = sums.get(name, 0.0) + value
        for hist in [h for h, les in buckets.items() if not les]:  # every bucket NaN: no histogram, as before
            del buckets[hist]

    def _add_checked(self, line: str) -> None:
        """One line through the full grammar (SampleError when it is not Prometheus text); remembers its series."""
        end = _name_end(line)
        name = line[:end]
        key, value = split_sample(line, end)
        kind = _kind(name)
        le = le_of(key, end) if kind == _BUCKET else math.nan
        m = _ENGINE.search(key) if kind < _COUNTER else None
        if line.rpartition(" ")[0] == key:  # the plain `series value` form: the fast path can take it next time
            if len(_KNOWN) >= _KNOWN_MAX:
                _KNOWN.clear()
            _KNOWN[key] = (kind, name, le, m.group(1) if m else "")
        if kind >= _COUNTER:
            self.raw.setdefault(name, {})[key] = value
        if value != value:  # NaN
            return
        if kind == _BUCKET:
            self._bucket(name, le, value)
        elif kind >= _COUNTER:
            self.sums[name] = self.sums.get(name, 0.0) + value
        else:
            self._gauge(kind, name, m.group(1) if m else "", value)

    def _bucket(self, name: str, le: float, value: float) -> None:
        per = self.buckets.get(name[:-7])
        if per is None:
            per = self.buckets[name[:-7]] = {}
        per[le] = per.get(le, 0.0) + value

    def _gauge(self, kind: int, name: str, engine: str, value: float) -> None:
        per = self.engines.get(engine)
        if per is None:
            per = self.engines[engine] = {}
        if kind == _GAUGE_MAX:
            self.maxes[name] = max(self.maxes.get(name, -math.inf), value)
            per[name] = max(per[name], value) if name in per else value
        else:
            self.sums[name] = self.sums.get(name, 0.0) + value
            per[name] = per.get(name, 0.0) + value


def _one(i: int) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    return lambda seq: (seq[i],)


def _picker(idx: list[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """The items at `idx` of a sequence, as a tuple, gathered in C."""
    return operator.itemgetter(*idx) if len(idx) > 1 else _one(idx[0])


class _Plan:
    """Where each line of one page layout goes: the same series in the same order, every page of a steady server.

    Built once from the series `_Totals` has checked; a later page with that layout is added up without a Python
    step per line: its values are read with one `map(float)` and each total is one `reduce(add)` over its lines'
    values in page order, so the result is what `_Totals.add_lines` gives to the last digit (the tests compare
    both with prometheus_client). A page with a NaN, an odd value or any other layout takes `add_lines`.
    """

    __slots__ = ("sums", "maxes", "buckets", "raw", "engines")

    def __init__(self, keys: Sequence[SeriesKey]) -> None:
        sums: dict[str, list[int]] = {}
        maxes: dict[str, list[int]] = {}
        buckets: dict[str, dict[float, list[int]]] = {}
        raw: dict[str, list[int]] = {}
        engines: dict[str, dict[str, tuple[int, list[int]]]] = {}
        for i, key in enumerate(keys):
            kind, name, le, engine = _KNOWN[key]
            if kind < _COUNTER:
                (maxes if kind == _GAUGE_MAX else sums).setdefault(name, []).append(i)
                engines.setdefault(engine, {}).setdefault(name, (kind, []))[1].append(i)
                continue
            raw.setdefault(name, []).append(i)
            if kind == _BUCKET:
                buckets.setdefault(name[:-7], {}).setdefault(le, []).append(i)
            else:
                sums.setdefault(name, []).append(i)
        self.sums = [(n, _picker(ix)) for n, ix in sums.items()]
        self.maxes = [(n, _picker(ix)) for n, ix in maxes.items()]
        self.buckets = [(h, [(le, _picker(ix)) for le, ix in per.items()]) for h, per in buckets.items()]
        self.raw = [(n, _picker(ix)) for n, ix in raw.items()]
        self.engines = [(e, [(n, kind == _GAUGE_MAX, _picker(ix)) for n, (kind, ix) in per.items()])
                        for e, per in engines.items()]

    def totals(self, keys: Sequence[SeriesKey], values: list[float]) -> _Totals:
        t = _Totals()
        t.sums = {n: reduce(operator.add, pick(values), 0.0) for n, pick in self.sums}
        t.maxes = {n: max(pick(values)) for n, pick in self.maxes}
        t.buckets = {h: {le: reduce(operator.add, pick(values), 0.0) for le, pick in per} for h, per in self.buckets}
        t.raw = {n: dict(zip(pick(keys), pick(values), strict=True)) for n, pick in self.raw}
        t.engines = {e: {n: max(pick(values)) if is_max else reduce(operator.add, pick(values), 0.0)
                         for n, is_max, pick in per} for e, per in self.engines}
        return t


_PLANS: dict[tuple[SeriesKey, ...], _Plan] = {}
_PLANS_MAX = 8  # layouts of the servers this process reads (one per run; a few while a run changes shape)


def _scan(text: str) -> tuple[bool, _Totals]:
    """(whether the page had any vllm: sample, the selected samples added up); SampleError on a bad line.

    One regular expression finds the wanted lines, so the lines we do not read cost no Python at all; it runs
    only over the families we read (`_wanted_spans`), two thirds of a DP=8 page are never looked at. A page laid
    out as one read before is added up through that layout's `_Plan`."""
    if not text.startswith("#"):  # the lines are found by the newline before them: the first one too
        text = "\n" + text
    found: list[str] = []
    for start, end in _wanted_spans(text):
        found += _WANTED_LINE.findall(text, start, end)
    seen_vllm = "\nvllm:" in text
    split = [line.rpartition(" ") for line in found]
    keys = tuple(map(_FIRST, split))
    plan = _PLANS.get(keys)
    if plan is not None:
        vals = list(map(_THIRD, split))
        if "_" not in "".join(vals):  # Python's float reads "1_0"; Prometheus text does not
            try:
                values = list(map(float, vals))
            except ValueError:
                values = []
            if values and not any(map(math.isnan, values)):
                return seen_vllm, plan.totals(keys, values)
    totals = _Totals()
    totals.add_lines(found)
    if plan is None and keys and all(map(_KNOWN.__contains__, keys)):  # every line in the plain `series value` form
        try:
            plan = _Plan(keys)
        except KeyError:  # another thread's page just cleared the full cache: plan the next page
            return seen_vllm, totals
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        _PLANS[keys] = plan
    return seen_vllm, totals


def _wanted_spans(text: str) -> list[tuple[int, int]]:
    """Where the families we read are on a page: from each one's TYPE line to the next TYPE line.

    The exposition format keeps a family's samples together after its TYPE line (prometheus_client writes every
    page so, one API server or many). What comes before the first TYPE line is read too, and a page without TYPE
    lines is read whole."""
    marks = [(m.start(), m.group(1)) for m in _TYPE_LINE.finditer(text)]
    if not marks:
        return [(0, len(text))]
    ends = [i + 1 for i, _ in marks[1:]] + [len(text)]
    return [(0, marks[0][0] + 1)] + [(i, end) for (i, name), end in zip(marks, ends, strict=True)
                                     if name in _TYPED_FAMILIES]


def parse_text(text: str) -> ParsedPage:
    """Read the families lynxtop uses from exposition text; raises PageError naming the problem. Thread-safe.

    Only the selected lines are parsed (agent/promtext.py), so the cost follows the families read, not the page:
    a DP=8 page's ~3000 lines cost what its ~1000 selected lines cost.
    """
    try:
        seen_vllm, t = _scan(text)
    except SampleError as exc:
        raise PageError(f"not Prometheus text: {exc}") from None
    if not seen_vllm:
        raise PageError("no vllm:* metrics on the page (is this a vLLM server?)")
    page = ParsedPage()
    for key, candidates in COUNTERS.items():
        name = _present(candidates, t.sums)
        if name is not None:
            page.counters[key] = t.sums[name]
            page.series[("counter", key)] = t.raw.get(name, {})
    for table, values in ((GAUGES_SUM, t.sums), (GAUGES_MAX, t.maxes)):
        for key, candidates in table.items():
            name = _present(candidates, values)
            if name is not None:
                page.gauges[key] = values[name]
    for key, candidates in HISTOGRAMS.items():
        name = _present(candidates, t.buckets)
        if name is not None:
            _add_histogram(page, key, name, t.buckets[name], t.sums, t.raw)
    page.engines = _engine_gauges(t.engines)
    return page


def _engine_loads(per: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """The status' per-engine load, engines in numeric order ("10" after "9")."""
    def order(e: str) -> tuple[int, str]:
        return (int(e), "") if e.isdigit() else (1 << 30, e)

    return [{"engine": e, "running": _as_int(v.get("running")), "waiting": _as_int(v.get("waiting")),
             "kv_cache_usage_pct": None if v.get("kv_usage") is None else 100.0 * v["kv_usage"]}
            for e, v in sorted(per.items(), key=lambda kv: order(kv[0]))]


def _present(candidates: tuple[str, ...], values: dict[str, Any]) -> str | None:
    """The newest of a quantity's names that the page has."""
    return next((n for n in candidates if n in values), None)


def _engine_gauges(per: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per engine label: running, waiting and kv_usage, each from the newest name the page has (as the totals)."""
    out: dict[str, dict[str, float]] = {}
    for engine, vals in per.items():
        out[engine] = {}
        for key, candidates in (*GAUGES_SUM.items(), *GAUGES_MAX.items()):
            name = _present(candidates, vals)
            if name is not None:
                out[engine][key] = vals[name]
    return out


def _add_histogram(page: ParsedPage, key: str, name: str, per_le: dict[float, float], sums: dict[str, float],
                   raw: dict[str, dict[SeriesKey, float]]) -> None:
    bs = tuple(sorted(per_le.items()))
    if not math.isinf(bs[-1][0]):
        raise PageError(f"histogram {name} has no +Inf bucket")
    page.histograms[key] = HistogramSnapshot(
        buckets=bs, sum=sums.get(name + "_sum", 0.0), count=sums.get(name + "_count", bs[-1][1])
    )
    page.series[("bucket", key)] = raw.get(name + "_bucket", {})
    for part in ("sum", "count"):
        if name + "_" + part in raw:
            page.series[(part, key)] = raw[name + "_" + part]


class _SeriesCorrection:
    """Prometheus' counter correction per series, for a quantity the page gives summed over series (engines).

    Prometheus checks each series for a reset and sums afterwards (`sum(increase(x[1m]))`); summing first would
    miss one engine restarting while the total still grows, and take a scale-down (an engine's series gone) for a
    reset. `update` returns what to add to this page's sum so the sum only moves by Prometheus' increases: at a
    reset the series' previous value; for a series that vanished its last value (its increases stay in the window);
    for one that comes back, minus that value again unless it came back lower (then it is a reset).
    """

    __slots__ = ("_keys", "_vals", "_gone")

    def __init__(self) -> None:
        self._keys: list[SeriesKey] | None = None
        self._vals: list[float] = []
        self._gone: dict[SeriesKey, float] = {}

    def update(self, cur: dict[SeriesKey, float]) -> tuple[dict[SeriesKey, float] | None, bool]:
        """({series: correction} or None when nothing to correct, whether a series went down)."""
        keys = list(cur)
        vals = list(cur.values())
        prev_keys, prev_vals = self._keys, self._vals
        self._keys, self._vals = keys, vals
        if prev_keys is None:
            return None, False
        if keys == prev_keys:  # the same series in the same order: every tick of a steady server
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
        return fix or None, reset


def _num(text: str) -> float:
    """A label's number as written ("0.5", "+Inf"); NaN where it is not one."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def _le(series: SeriesKey) -> float:
    """The `le` bound of a bucket series' key (only read when a bucket needs a correction)."""
    m = _LE.search(series)
    return _num(m.group(1)) if m else math.nan


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
        while len(self._points) >= 2 and self._points[1][0] <= now - self.window_s:
            self._points.popleft()
        return reset

    def window_delta(self) -> float | None:
        if len(self._points) < 2:
            return None
        return self._points[-1][1] - self._points[0][1]

    def rate(self) -> float | None:
        if self.last_delta is None or not self.last_dt or self.last_dt <= 0:
            return None
        return self.last_delta / self.last_dt


def empty_row() -> dict[str, Any]:
    return {c: None for c in SERVING_COLUMNS}


class MetricsScraper:
    """Scrapes one vLLM server. After each call: `outage_started`/`outage_ended` (one event per outage),
    `reset_series` (the counters that went down on this page: one event per such page), `generation_tokens_total`
    and `requests_running` (for hang detection), `last_error`."""

    def __init__(self, url: str, window_s: float = 60.0, timeout_s: float = 2.0):
        base = url.rstrip("/")
        if base.endswith("/metrics"):
            base = base[: -len("/metrics")]
        self.base_url = base
        self.url = base + "/metrics"
        self.window_s = window_s
        self.timeout_s = timeout_s
        self.scrape_errors = 0
        self.last_error: str | None = None
        self.in_outage = False
        self.outage_started = False
        self.outage_ended = False
        self.outage_since: float | None = None
        self.resets = 0  # pages on which counters went down (server restarts behind the same URL), once per page
        self.reset_series: tuple[str, ...] = ()  # what went down on the last page read (empty: no reset)
        self.generation_tokens_total: float | None = None
        self.requests_running: int | None = None
        self.engines: list[dict[str, Any]] = []  # per data-parallel engine: running, waiting, KV % of the last page
        # the last page read and its sums corrected for resets: what agent/lifetime.py adds up over runs
        self.totals: tuple[ParsedPage, dict[str, float], dict[str, HistogramSnapshot]] | None = None
        self._counters: dict[str, _CounterWindow] = {}
        self._hists: dict[str, SlidingHistogram] = {}
        self._last_ok_t: float | None = None
        self._init_corrections()

    def _init_corrections(self) -> None:
        self._series: dict[tuple[str, str], _SeriesCorrection] = {}
        self._offsets: dict[tuple[str, str], float] = {}  # ("counter" | "sum" | "count", key) -> added to the sum
        self._bucket_offsets: dict[str, dict[float, float]] = {}  # histogram key -> le -> added to that bucket
        self._layouts: dict[str, tuple[float, ...]] = {}

    def reset(self) -> None:
        """Forget history (a new run): the next scrape only sets baselines."""
        self._counters.clear()
        self._hists.clear()
        self._last_ok_t = None
        self._init_corrections()
        self.reset_series = ()
        self.generation_tokens_total = None
        self.requests_running = None

    # ------------------------------------------------------------------------------------------ I/O

    async def scrape(self, session: aiohttp.ClientSession, now: float) -> dict[str, Any]:
        """GET /metrics and return the tick's serving row (run_id left None for the caller)."""
        body = await self._get(session)
        if isinstance(body, str):
            return self.failed(now, body)
        text = body.decode("utf-8", errors="replace")
        try:
            if len(text) <= INLINE_PARSE_CHARS:
                page = parse_text(text)  # ~1-2 ms at DP=8: less than a thread's hand-over and back costs
            else:
                page = await asyncio.to_thread(parse_text, text)  # a huge page must not hold the event loop
        except PageError as exc:
            return self.failed(now, f"malformed page at {self.url}: {exc}")
        return self._accept(page, now)

    async def _get(self, session: aiohttp.ClientSession) -> bytes | str:
        """The page's bytes, or why it could not be read (the failed row's error)."""
        try:
            async with session.get(self.url, headers=_PLAIN,
                                   timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as resp:
                if resp.status != 200:
                    return f"HTTP {resp.status} from {self.url}"
                if (resp.content_length or 0) > MAX_PAGE_BYTES:
                    return (f"page cut off: {resp.content_length} bytes announced, over the {MAX_PAGE_BYTES} "
                            f"byte limit, at {self.url}")
                if resp.content_length is not None:  # announced within the limit, and the parser keeps to it
                    return await resp.read()
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.content.iter_chunked(1 << 16):  # read(n) may stop early: loop to EOF
                    size += len(chunk)
                    if size > MAX_PAGE_BYTES:
                        return f"page cut off: larger than {MAX_PAGE_BYTES} bytes at {self.url}"
                    chunks.append(chunk)
                return b"".join(chunks)
        except TimeoutError:
            return f"page cut off: timed out after {self.timeout_s:g} s reading {self.url}"
        except aiohttp.ClientError as exc:
            return f"cannot read {self.url}: {exc or type(exc).__name__}"
        except OSError as exc:
            return f"cannot read {self.url}: {exc}"

    async def fetch_version(self, session: aiohttp.ClientSession) -> str | None:
        """vLLM's version from GET /version, or None when it cannot be read."""
        try:
            async with session.get(
                self.base_url + "/version", timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            ) as resp:
                if resp.status != 200:
                    return None
                data = await resp.json(content_type=None)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return None
        version = data.get("version") if isinstance(data, dict) else None
        return version if isinstance(version, str) and version else None

    # ------------------------------------------------------------------------------------------ rows

    def failed(self, now: float, error: str) -> dict[str, Any]:
        """The row of a tick whose page could not be read: NULL metrics, the error counted."""
        self.scrape_errors += 1
        self.last_error = error
        self.outage_started = not self.in_outage
        self.outage_ended = False
        if not self.in_outage:
            self.in_outage = True
            self.outage_since = now
        self.requests_running = None
        self.reset_series = ()
        self.engines = []
        row = empty_row()
        row["scrape_ok"] = 0
        row["scrape_errors"] = self.scrape_errors
        return row

    def parse_page(self, text: str, now: float) -> dict[str, Any]:
        """Turn one page into the tick's row; a malformed page gives a failed row (see `failed`)."""
        try:
            page = parse_text(text)
        except PageError as exc:
            return self.failed(now, f"malformed page at {self.url}: {exc}")
        return self._accept(page, now)

    def _accept(self, page: ParsedPage, now: float) -> dict[str, Any]:
        self.outage_ended = self.in_outage
        self.outage_started = False
        self.in_outage = False
        self.last_error = None
        return self._row(page, now)

    def outage_event(self, now: float | None = None) -> dict[str, Any] | None:
        """An event dict (kind, severity, message, details) when the last call began or ended an outage."""
        if self.outage_started:
            return {"kind": EventKind.SCRAPE_OUTAGE, "severity": "warning",
                    "message": f"vLLM metrics unreadable: {self.last_error}",
                    "details": {"url": self.url, "error": self.last_error}}
        if self.outage_ended:
            lasted = None if now is None or self.outage_since is None else round(now - self.outage_since, 1)
            msg = "vLLM metrics readable again" + (f" after {lasted:g} s" if lasted is not None else "")
            return {"kind": EventKind.SCRAPE_RECOVERED, "severity": "info", "message": msg,
                    "details": {"url": self.url, "outage_s": lasted}}
        return None

    def reset_event(self) -> dict[str, Any] | None:
        """An event dict when the last page showed a counter reset: one per page, however many series went down
        (a restart resets every series at once), so the event log says "restarted" once, not thirteen times."""
        if not self.reset_series:
            return None
        n = len(self.reset_series)
        return {"kind": EventKind.SCRAPE_COUNTER_RESET, "severity": "warning",
                "message": f"vLLM counters went down at {self.url} ({n} series): the server restarted behind the "
                           "agent or a proxy switched backends; the window keeps the increases from before",
                "details": {"url": self.url, "series": list(self.reset_series), "resets": self.resets}}

    def _corrected(self, page: ParsedPage) -> tuple[dict[str, float], dict[str, HistogramSnapshot], list[str]]:
        """The page's sums with Prometheus' per-series counter correction applied, and the keys that had a series
        go down on this page. Without any reset so far the page's own dicts are returned untouched."""
        self._check_layouts(page)
        went_down: list[str] = []
        for sk, cur in page.series.items():
            corr = self._series.get(sk)
            if corr is None:
                corr = self._series[sk] = _SeriesCorrection()
            fix, reset = corr.update(cur)
            if reset and sk[1] not in went_down:
                went_down.append(sk[1])
            if fix:
                self._book(sk, fix)
        if len(self._series) > len(page.series):  # a whole family vanished: it starts over if it comes back
            self._forget_vanished(page)
        if not (self._offsets or self._bucket_offsets):
            return page.counters, page.histograms, went_down
        off = self._offsets
        counters = {k: v + off.get(("counter", k), 0.0) for k, v in page.counters.items()}
        hists = {key: self._offset_histogram(key, snap) for key, snap in page.histograms.items()}
        return counters, hists, went_down

    def _check_layouts(self, page: ParsedPage) -> None:
        """A histogram with other buckets than before starts its window over: so do its corrections."""
        for key, snap in page.histograms.items():
            layout = tuple(map(_FIRST, snap.buckets))
            if self._layouts.get(key, layout) != layout:
                for kind in ("bucket", "sum", "count"):
                    self._series.pop((kind, key), None)
                    self._offsets.pop((kind, key), None)
                self._bucket_offsets.pop(key, None)
            self._layouts[key] = layout

    def _book(self, sk: tuple[str, str], fix: dict[SeriesKey, float]) -> None:
        """Add one page's per-series corrections to the offsets of the sum they belong to."""
        if sk[0] == "bucket":
            per = self._bucket_offsets.setdefault(sk[1], {})
            for series, x in fix.items():
                le = _le(series)
                per[le] = per.get(le, 0.0) + x
        else:
            self._offsets[sk] = self._offsets.get(sk, 0.0) + math.fsum(fix.values())

    def _forget_vanished(self, page: ParsedPage) -> None:
        for sk in [sk for sk in self._series if sk not in page.series]:
            del self._series[sk]
            self._offsets.pop(sk, None)
            if sk[0] == "bucket":
                self._bucket_offsets.pop(sk[1], None)
                self._layouts.pop(sk[1], None)

    def _offset_histogram(self, key: str, snap: HistogramSnapshot) -> HistogramSnapshot:
        off = self._offsets
        per = self._bucket_offsets.get(key)
        s_off, n_off = off.get(("sum", key), 0.0), off.get(("count", key), 0.0)
        if not (per or s_off or n_off):
            return snap
        per = per or {}
        return HistogramSnapshot(tuple((le, c + per.get(le, 0.0)) for le, c in snap.buckets),
                                 snap.sum + s_off, snap.count + n_off)

    def _row(self, page: ParsedPage, now: float) -> dict[str, Any]:
        row = empty_row()
        row["scrape_ok"] = 1
        row["scrape_errors"] = self.scrape_errors
        counters, hists, went_down = self._corrected(page)
        self.totals = (page, counters, hists)
        self._add_counters(counters, now, went_down)
        row["requests_per_s"] = self._rate("requests")
        row["prompt_tokens_per_s"] = self._rate("prompt_tokens")
        row["generation_tokens_per_s"] = self._rate("generation_tokens")
        row["requests_finished"] = _as_int(self._delta("requests"))
        row["prompt_tokens"] = _as_int(self._delta("prompt_tokens"))
        row["generation_tokens"] = _as_int(self._delta("generation_tokens"))
        row["preemptions"] = _as_int(self._delta("preemptions"))
        row["prefix_cache_hit_pct"] = self._ratio_pct("prefix_hits", "prefix_queries")
        row["spec_decode_acceptance_pct"] = self._ratio_pct("spec_accepted", "spec_drafted")
        running = page.gauges.get("running")
        row["requests_running"] = _as_int(running)
        row["requests_waiting"] = _as_int(page.gauges.get("waiting"))
        kv = page.gauges.get("kv_usage")
        row["kv_cache_usage_pct"] = None if kv is None else 100.0 * kv
        self.engines = _engine_loads(page.engines)

        self._add_histograms(hists, now, went_down)
        # One restart shows on every series at once: count the page, not the series.
        self.reset_series = tuple(went_down)
        if went_down:
            self.resets += 1
        self._latency_columns(row)
        self.generation_tokens_total = page.counters.get("generation_tokens")
        self.requests_running = _as_int(running)
        self._last_ok_t = now
        return row

    def _add_counters(self, counters: dict[str, float], now: float, went_down: list[str]) -> None:
        # A series that appears on a page we read before started from zero since then (vLLM creates some
        # label sets lazily); on the first page there is no baseline at all.
        for key, value in counters.items():
            cw = self._counters.get(key)
            if cw is None:
                cw = self._counters[key] = _CounterWindow(self.window_s, corrected=True)
                if self._last_ok_t is not None:
                    cw.add(self._last_ok_t, 0.0)
            if cw.add(now, value) and key not in went_down:
                went_down.append(key)
        for key in set(self._counters) - set(counters):
            del self._counters[key]  # the series vanished: start over if it comes back

    def _add_histograms(self, hists: dict[str, HistogramSnapshot], now: float, went_down: list[str]) -> None:
        for key, snap in hists.items():
            sh = self._hists.get(key)
            if sh is None:
                sh = self._hists[key] = SlidingHistogram(self.window_s, corrected=True)
                if self._last_ok_t is not None:
                    sh.add(self._last_ok_t, HistogramSnapshot.zero_like(snap))
            if sh.add(now, snap) and key not in went_down:
                went_down.append(key)
        for key in set(self._hists) - set(hists):
            del self._hists[key]

    def _latency_columns(self, row: dict[str, Any]) -> None:
        for series in LATENCY_SERIES:
            sh = self._hists.get(series)
            for stat, q in QUANTILES:
                value = None if sh is None else sh.quantile(q)
                row[f"{series}_{stat}_ms"] = None if value is None else value * 1000.0
            mean = None if sh is None else sh.mean()
            row[f"{series}_mean_ms"] = None if mean is None else mean * 1000.0

    def _delta(self, key: str) -> float | None:
        cw = self._counters.get(key)
        return None if cw is None else cw.last_delta

    def _rate(self, key: str) -> float | None:
        cw = self._counters.get(key)
        return None if cw is None else cw.rate()

    def _ratio_pct(self, num: str, den: str) -> float | None:
        n, d = self._counters.get(num), self._counters.get(den)
        if n is None or d is None:
            return None
        dn, dd = n.window_delta(), d.window_delta()
        if dn is None or not dd or dd <= 0:
            return None
        return max(0.0, min(100.0, 100.0 * dn / dd))


def _as_int(v: float | None) -> int | None:
    return None if v is None else int(round(v))
