"""Reads vLLM's Prometheus page once per tick and turns it into one `serving` row (contract/columns.py).

vLLM's page changes between versions (0.10 prints old and new names, later versions drop the old ones) and
carries one series per data-parallel engine, so everything is matched by exact sample name, summed over
labels (max for the KV-cache gauge), and percentiles come from bucket differences over a sliding window
(agent/metrics/histogram.py). The scraper keeps state between calls; the caller owns the clock (`now`, monotonic s).
"""

from __future__ import annotations

import asyncio
import json
import math
import operator
import re
from collections import deque
from collections.abc import Callable, Sequence
from functools import reduce
from typing import Any

import aiohttp

from lynxtop.agent.coalesce import Recurring
from lynxtop.agent.metrics.histogram import HistogramSnapshot, SlidingHistogram
from lynxtop.agent.metrics.promtext import SampleError, le_of, split_sample
from lynxtop.agent.serving.health import read_capped, version_of
from lynxtop.contract.columns import LATENCY_SERIES, SERVING_METRICS, names
from lynxtop.contract.events import EventKind

SERVING_COLUMNS = names(SERVING_METRICS)
# aiohttp asks for gzip by default; a server that honours it (prometheus_client's own ASGI app does; vLLM 0.32's
# instrumentator handler does not) would compress a DP=8 page (~0.3 MB) on its event loop for the agent to inflate.
_PLAIN = {"Accept-Encoding": "identity"}
INLINE_PARSE_CHARS = 1024 * 1024  # larger pages are parsed in a worker thread
MAX_PAGE_BYTES = 8 * 1024 * 1024  # a DP=8 page with two API servers is ~0.5 MiB; past this it is cut off unread
# Caps on what one page may hold, far above any real deployment (docs/sampling.md "Caps"): a server over one is
# refused, never followed into unbounded memory. A page over the first three gives no reading (an outage).
MAX_ENGINES = 1024  # distinct `engine` label values (vLLM's data-parallel ranks: 8-64 in practice)
MAX_SERIES = 65_536  # series of one family (engines x finished reasons, engines x buckets: ~300 at DP=8)
MAX_LABELS_CHARS = 2048  # one series' labels as written (vLLM's longest: ~200, with a long model path)
MAX_BUCKETS = 1000  # bucket bounds of one histogram (vLLM's have 10-30): over it that histogram is left out
MAX_GONE = 4096  # vanished series remembered per family (a server inventing label sets cannot grow this further)
_HUGE = float(2 ** 63)  # a sample at or past this (or not finite) is no reading: no count a page gives gets there
SETTLE_S = 10.0  # an outage ends once the page has been readable this long: a flapping page is one episode
QUIET_S = 60.0  # a counter reset, bad values or a refused part: repeats within this are the same episode

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
    "prefill": ("vllm:request_prefill_time_seconds",),
    "decode": ("vllm:request_decode_time_seconds",),
}
# Where a page lacks a phase's histogram, its mean is derived from two others: (phase, whole, part before it)
DERIVED_MEANS = (("prefill", "ttft", "queue"), ("decode", "e2e", "ttft"))
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
        self.bad_values = 0  # samples that were no reading (NaN, infinite, past 2**63): left out like NaN
        self.bad_example = ""  # the first of them, as the page wrote it (cut short)
        self.refused: list[str] = []  # parts left out over a cap (a histogram with too many buckets)
        self.stale: set[str] = set()  # counters and histograms with a bad sample: this page adds nothing to them


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
_KNOWN_CHARS_MAX = 16 << 20  # nor can long label sets (each up to MAX_LABELS_CHARS)
_known_chars = [0]  # characters of the keys in _KNOWN (a list: updated from the parsing thread too)


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
    was first seen (agent/metrics/promtext.py), and what it adds to is remembered. Any other line takes that full path.
    """

    __slots__ = ("sums", "maxes", "buckets", "raw", "engines", "bad", "bad_example", "bad_names", "refused")

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.maxes: dict[str, float] = {}
        self.buckets: dict[str, dict[float, float]] = {}
        self.raw: dict[str, dict[SeriesKey, float]] = {}  # counter and histogram series: value by series
        self.engines: dict[str, dict[str, float]] = {}  # engine label -> gauge sample name -> value
        self.bad = 0  # samples that are no reading (NaN, infinite, past 2**63)
        self.bad_example = ""
        self.bad_names: set[str] = set()  # the sample names they had: those sums are no reading on this page
        self.refused: list[str] = []  # families left out over a cap before they were read

    def _no_reading(self, key: SeriesKey, value: float) -> float:
        """Count a sample that is no reading; NaN stands for it from here on (skipped by every sum)."""
        if not self.bad:
            self.bad_example = f"{key[:120]} {value!r}"
        self.bad += 1
        self.bad_names.add(key[:_name_end(key)])
        return math.nan

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
            if not -_HUGE < value < _HUGE:  # NaN, infinite or past any count: no reading (counted)
                value = self._no_reading(key, value)
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
        if not -_HUGE < value < _HUGE:
            value = self._no_reading(key, value)
        kind = _kind(name)
        le = le_of(key, end) if kind == _BUCKET else math.nan
        m = _ENGINE.search(key) if kind < _COUNTER else None
        if line.rpartition(" ")[0] == key:  # the plain `series value` form: the fast path can take it next time
            if len(_KNOWN) >= _KNOWN_MAX or _known_chars[0] >= _KNOWN_CHARS_MAX:
                _KNOWN.clear()
                _known_chars[0] = 0
            _KNOWN[key] = (kind, name, le, m.group(1) if m else "")
            _known_chars[0] += len(key)
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
_PLAN_LINES_MAX = 50_000  # a DP=8 page has ~1000 lines we read; a larger one is read without a plan


def _scan(text: str) -> tuple[bool, _Totals]:
    """(whether the page had any vllm: sample, the selected samples added up); SampleError on a bad line.

    One regular expression finds the wanted lines, so the lines we do not read cost no Python at all; it runs
    only over the families we read (`_wanted_spans`), two thirds of a DP=8 page are never looked at. A page laid
    out as one read before is added up through that layout's `_Plan`."""
    if not text.startswith("#"):  # the lines are found by the newline before them: the first one too
        text = "\n" + text
    found: list[str] = []
    spans = _wanted_spans(text)
    if text.count("engine") > MAX_ENGINES:  # only then can there be too many: count them before any line is read
        _check_engines(text, spans)
    refused: list[str] = []
    for start, end in spans:
        lines = _WANTED_LINE.findall(text, start, end)
        found += _without_wide_histograms(lines, refused) if len(lines) > MAX_BUCKETS else lines
    seen_vllm = "\nvllm:" in text
    split = [line.rpartition(" ") for line in found]
    keys = tuple(map(_FIRST, split))
    longest = max(map(len, keys), default=0)
    if longest > MAX_LABELS_CHARS:  # checked before any cache keeps such a key
        raise PageError(f"a series' name and labels are {longest} characters, over the cap of {MAX_LABELS_CHARS}: "
                        f"{keys[[len(k) for k in keys].index(longest)][:80]!r}...")
    plan = _PLANS.get(keys)  # a layout is planned only within the caps: a known one needs no checks
    if plan is not None:
        vals = list(map(_THIRD, split))
        if "_" not in "".join(vals):  # Python's float reads "1_0"; Prometheus text does not
            try:
                values = list(map(float, vals))
            except ValueError:
                values = []
            if values and not any(map(math.isnan, values)) and min(values) > -_HUGE and max(values) < _HUGE:
                t = plan.totals(keys, values)
                t.refused = refused
                return seen_vllm, t
    totals = _Totals()
    totals.refused = refused
    totals.add_lines(found)
    _check_caps(totals)
    if (plan is None and keys and len(keys) <= _PLAN_LINES_MAX
            and all(map(_KNOWN.__contains__, keys))):  # every line in the plain `series value` form
        try:
            plan = _Plan(keys)
        except KeyError:  # another thread's page just cleared the full cache: plan the next page
            return seen_vllm, totals
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        _PLANS[keys] = plan
    return seen_vllm, totals


def _check_engines(text: str, spans: list[tuple[int, int]]) -> None:
    """PageError past MAX_ENGINES distinct `engine` label values (100k once took the agent to 290 MiB)."""
    seen: set[str] = set()
    for start, end in spans:
        for m in _ENGINE.finditer(text, start, end):
            seen.add(m.group(1))
            if len(seen) > MAX_ENGINES:
                raise PageError(f"more than {MAX_ENGINES} engine label values, over the cap of {MAX_ENGINES}")


def _without_wide_histograms(lines: list[str], refused: list[str]) -> list[str]:
    """`lines` less those of a histogram with more bucket bounds than MAX_BUCKETS (each named in `refused`), left
    out before any line is split or cached: 60k buckets once grew the window to ~925 MiB."""
    les: dict[str, set[str]] = {}
    for line in lines:
        cut = line.find("_bucket")
        if cut > 0:
            m = _LE.search(line, cut)
            if m:
                les.setdefault(line[:cut], set()).add(m.group(1))
    wide = [h for h, bounds in les.items() if len(bounds) > MAX_BUCKETS]
    if not wide:
        return lines
    refused += [f"histogram {h} has {len(les[h])} buckets, over the cap of {MAX_BUCKETS}: its latency columns "
                "stay empty" for h in wide]
    parts = tuple(h + part for h in wide for part in ("_bucket", "_sum", "_count"))
    return [line for line in lines if not line.startswith(parts)]


def _check_caps(t: _Totals) -> None:
    """PageError when a page has more engines, or more series in one family, than any real deployment."""
    if len(t.engines) > MAX_ENGINES:
        raise PageError(f"{len(t.engines)} engine label values, over the cap of {MAX_ENGINES}")
    for name, per in t.raw.items():
        if len(per) > MAX_SERIES:
            raise PageError(f"{len(per)} series of {name}, over the cap of {MAX_SERIES}")


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

    Only the selected lines are parsed (agent/metrics/promtext.py), so the cost follows the families read, not the page:
    a DP=8 page's ~3000 lines cost what its ~1000 selected lines cost.
    """
    try:
        seen_vllm, t = _scan(text)
    except SampleError as exc:
        raise PageError(f"not Prometheus text: {exc}") from None
    if not seen_vllm:
        raise PageError("no vllm:* metrics on the page (is this a vLLM server?)")
    page = ParsedPage()
    page.refused = list(t.refused)
    bad = t.bad_names
    for key, candidates in COUNTERS.items():
        name = _present(candidates, t.sums)  # every sample no reading: absent, as a family of NaN always was
        if name is not None:
            page.counters[key] = t.sums[name]
            page.series[("counter", key)] = t.raw.get(name, {})
            if name in bad:
                page.stale.add(key)
    for table, values in ((GAUGES_SUM, t.sums), (GAUGES_MAX, t.maxes)):
        for key, candidates in table.items():
            name = _present(candidates, values)
            if name is not None and name not in bad:  # one engine's bad gauge: the sum is no reading either
                page.gauges[key] = values[name]
    for key, candidates in HISTOGRAMS.items():
        name = _present(candidates, t.buckets)
        if name is None:
            continue
        if len(t.buckets[name]) > MAX_BUCKETS:  # its window would hold every bucket of every scrape
            page.refused.append(f"histogram {name} has {len(t.buckets[name])} buckets, over the cap of "
                                f"{MAX_BUCKETS}: its latency columns stay empty")
            continue
        _add_histogram(page, key, name, t.buckets[name], t.sums, t.raw)
        if bad and any(name + part in bad for part in ("_bucket", "_sum", "_count")):
            page.stale.add(key)
    page.engines = _engine_gauges(t.engines)
    page.bad_values, page.bad_example = t.bad, t.bad_example
    return page


def _engine_loads(per: dict[str, dict[str, float]]) -> tuple[list[dict[str, Any]], int]:
    """The status' per-engine load, engines in numeric order ("10" after "9"), each value checked as its column
    is (`_checked`); and how many were no reading."""
    def order(e: str) -> tuple[int, str]:
        return (int(e[:18]), e) if e.isdigit() else (1 << 63, e)

    out: list[dict[str, Any]] = []
    bad = 0
    for e, v in sorted(per.items(), key=lambda kv: order(kv[0])):
        row = {"requests_running": v.get("running"), "requests_waiting": v.get("waiting"),
               "kv_cache_usage_pct": None if v.get("kv_usage") is None else 100.0 * v["kv_usage"]}
        bad += len(_checked(row))
        out.append({"engine": e, "running": row["requests_running"], "waiting": row["requests_waiting"],
                    "kv_cache_usage_pct": row["kv_cache_usage_pct"]})
    return out, bad


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
        while len(gone) > MAX_GONE:  # labels that change every scrape: forget the oldest (it comes back as new)
            del gone[next(iter(gone))]
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
        if self.last_delta is None or not self.last_dt or self.last_dt <= 0:
            return None
        return self.last_delta / self.last_dt


def empty_row() -> dict[str, Any]:
    return {c: None for c in SERVING_COLUMNS}


class MetricsScraper:
    """Scrapes one vLLM server. After each call: `outage_started`/`outage_ended` (one event per outage episode),
    `reset_series` (the counters that went down on this page), `generation_tokens_total` and `requests_running`
    (for hang detection), `last_error`; `events(now)` gives what to record, each trouble once per episode.

    An outage ends once the page has been readable for `settle_s`: a page that flaps (500, 200, 500) is one
    outage and one recovery, with the count of failed scrapes, not an event per scrape."""

    def __init__(self, url: str, window_s: float = 60.0, timeout_s: float = 2.0, settle_s: float = SETTLE_S):
        base = url.rstrip("/")
        if base.endswith("/metrics"):
            base = base[: -len("/metrics")]
        self.base_url = base
        self.url = base + "/metrics"
        self.window_s = window_s
        self.timeout_s = timeout_s
        self.scrape_errors = 0
        self.bad_values = 0  # values of read pages that were no reading, since this scraper started
        self.last_error: str | None = None
        self.in_outage = False
        self.outage_started = False
        self.outage_ended = False
        self.outage_since: float | None = None
        self.settle_s = settle_s
        self._readable_since: float | None = None  # first readable page of an outage not over yet
        self._outage_failures = 0  # failed scrapes of the open outage episode
        self._outage_flaps = 0  # times the page came back and failed again within that episode
        self._reset_ep = Recurring(QUIET_S)
        self._reset_opened = False  # the last page opened a reset episode: its event is due
        self._bad_ep = Recurring(QUIET_S)
        self._refused_ep: dict[str, Recurring] = {}  # per refused part
        self._notes: list[dict[str, Any]] = []  # events due besides the outage and reset ones
        self.resets = 0  # pages on which counters went down (server restarts behind the same URL), once per page
        self.reset_series: tuple[str, ...] = ()  # what went down on the last page read (empty: no reset)
        self.generation_tokens_total: float | None = None
        self.requests_running: int | None = None
        self.engines: list[dict[str, Any]] = []  # per data-parallel engine: running, waiting, KV % of the last page
        # the last page read and its sums corrected for resets: what agent/metrics/lifetime.py adds up over runs
        self.totals: tuple[ParsedPage, dict[str, float], dict[str, HistogramSnapshot]] | None = None
        self._counters: dict[str, _CounterWindow] = {}
        self._hists: dict[str, SlidingHistogram] = {}
        self._last_ok_t: float | None = None
        self._stale: set[str] = set()  # counters and histograms the page being read adds nothing to
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
        """vLLM's version from GET /version, or None when it cannot be read (or is not one: agent/serving/health.py)."""
        try:
            async with session.get(
                self.base_url + "/version", timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            ) as resp:
                if resp.status != 200:
                    return None
                body = await read_capped(resp)
            data = None if body is None else json.loads(body)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return None
        return version_of(data)

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
            self._outage_failures = self._outage_flaps = 0
        elif self._readable_since is not None:  # back for a while, failing again: the same episode
            self._outage_flaps += 1
        self._readable_since = None
        self._outage_failures += 1
        self._close_episodes(now)
        self._reset_opened = False
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
        self.outage_started = self.outage_ended = False
        if self.in_outage:
            if self._readable_since is None:
                self._readable_since = now
            if now - self._readable_since >= self.settle_s:  # readable long enough: the episode is over
                self.in_outage = False
                self.outage_ended = True
        self.last_error = None
        self._close_episodes(now)
        for what in page.refused:
            ep = self._refused_ep.setdefault(what.split(" has ")[0], Recurring(QUIET_S))
            if ep.hit(now):
                self._notes.append({"kind": EventKind.SCRAPE_OVER_LIMIT, "severity": "warning",
                                    "message": f"vLLM page at {self.url}: {what} (docs/sampling.md, Caps)",
                                    "details": {"url": self.url, "refused": what}})
        return self._row(page, now)

    def _close_episodes(self, now: float) -> None:
        """The closing event of each repeated trouble whose episode just ended (nothing for a single one)."""
        done = self._reset_ep.close(now)
        if done is not None:
            self._notes.append({"kind": EventKind.SCRAPE_COUNTER_RESET, "severity": "warning",
                                "message": f"vLLM counters went down on {done.times} pages in {done.span_s:g} s at "
                                           f"{self.url}: a proxy alternating between backends, or a server "
                                           "restarting over and over; one event for the episode",
                                "details": {"url": self.url, "pages": done.times, "resets": self.resets,
                                            "span_s": done.span_s}})
        done = self._bad_ep.close(now)
        if done is not None:
            self._notes.append(self._bad_event(f"{done.items} values on {done.times} pages in {done.span_s:g} s "
                                               "were no reading", {"pages": done.times, "values": done.items,
                                                                    "span_s": done.span_s}))
        for ep in self._refused_ep.values():
            ep.close(now)  # a refusal is told once per episode; its repeats need no second event

    def _bad_event(self, what: str, details: dict[str, Any]) -> dict[str, Any]:
        return {"kind": EventKind.SCRAPE_BAD_VALUE, "severity": "warning",
                "message": f"vLLM page at {self.url}: {what} (not finite, or outside their column's range); "
                           f"stored as no reading, {self.bad_values} in all",
                "details": {"url": self.url, "bad_values": self.bad_values, **details}}

    def events(self, now: float) -> list[dict[str, Any]]:
        """What the last call gave to record: outage or recovery, counter reset, bad values, refused parts, and
        the closing count of an episode that repeated; each trouble once per episode."""
        out = [ev for ev in (self.outage_event(now), self.reset_event()) if ev is not None]
        out += self._notes
        self._notes = []
        return out

    def outage_event(self, now: float | None = None) -> dict[str, Any] | None:
        """An event dict (kind, severity, message, details) when the last call began or ended an outage."""
        if self.outage_started:
            return {"kind": EventKind.SCRAPE_OUTAGE, "severity": "warning",
                    "message": f"vLLM metrics unreadable: {self.last_error}",
                    "details": {"url": self.url, "error": self.last_error}}
        if self.outage_ended:
            end = self._readable_since if self._readable_since is not None else now
            lasted = None if end is None or self.outage_since is None else round(end - self.outage_since, 1)
            msg = "vLLM metrics readable again" + (f" after {lasted:g} s" if lasted is not None else "")
            if self._outage_flaps:
                msg += (f"; the page flapped: {self._outage_failures} failed scrapes, back and failing again "
                        f"{self._outage_flaps} times")
            return {"kind": EventKind.SCRAPE_RECOVERED, "severity": "info", "message": msg,
                    "details": {"url": self.url, "outage_s": lasted, "failed_scrapes": self._outage_failures,
                                "flaps": self._outage_flaps}}
        return None

    def reset_event(self) -> dict[str, Any] | None:
        """An event dict when the last page showed a counter reset and opened an episode: one per page, however
        many series went down (a restart resets every series at once), and none for the repeats of an episode
        (a proxy alternating between backends): those are counted in the episode's closing event."""
        if not self.reset_series or not self._reset_opened:
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
        self._stale = page.stale
        if page.stale:
            counters, hists = self._held(page.stale, counters, hists)
        self.totals = (page, counters, hists)
        self._add_counters(counters, now, went_down)
        row["requests_per_s"] = self._rate("requests")
        row["prompt_tokens_per_s"] = self._rate("prompt_tokens")
        row["generation_tokens_per_s"] = self._rate("generation_tokens")
        row["requests_finished"] = self._delta("requests")  # INTEGER columns: made ints by _checked
        row["prompt_tokens"] = self._delta("prompt_tokens")
        row["generation_tokens"] = self._delta("generation_tokens")
        row["preemptions"] = self._delta("preemptions")
        row["prefix_cache_hit_pct"] = self._ratio_pct("prefix_hits", "prefix_queries")
        row["spec_decode_acceptance_pct"] = self._ratio_pct("spec_accepted", "spec_drafted")
        row["requests_running"] = page.gauges.get("running")
        row["requests_waiting"] = page.gauges.get("waiting")
        kv = page.gauges.get("kv_usage")
        row["kv_cache_usage_pct"] = None if kv is None else 100.0 * kv
        self.engines, bad_engines = _engine_loads(page.engines)

        self._add_histograms(hists, now, went_down)
        # One restart shows on every series at once: count the page, not the series.
        self.reset_series = tuple(went_down)
        self._reset_opened = False
        if went_down:
            self.resets += 1
            self._reset_opened = self._reset_ep.hit(now)
        self._latency_columns(row)
        bad_columns = _checked(row)
        self._count_bad(page, bad_columns, bad_engines, now)
        self.generation_tokens_total = page.counters.get("generation_tokens")
        self.requests_running = row["requests_running"]
        self._last_ok_t = now
        return row

    def _count_bad(self, page: ParsedPage, columns: list[str], engines: int, now: float) -> None:
        """Bad values of this page (samples, row columns, per-engine loads): counted, and told once per episode."""
        n = page.bad_values + len(columns) + engines
        if not n:
            return
        self.bad_values += n
        if self._bad_ep.hit(now, n):
            what = [f"sample {page.bad_example}"] if page.bad_values else []
            what += [f"column {c}" for c in columns[:3]] + ([f"{engines} per-engine values"] if engines else [])
            self._notes.append(self._bad_event(f"{n} values were no reading ({', '.join(what)})",
                                               {"values": n, "example": page.bad_example or None,
                                                "columns": columns}))

    def _held(self, stale: set[str], counters: dict[str, float], hists: dict[str, HistogramSnapshot]
              ) -> tuple[dict[str, float], dict[str, HistogramSnapshot]]:
        """A counter or histogram with a bad sample on this page holds its last value: no increase is made up
        (an engine's series left out of the sum would look like a drop, then a jump), and the window stays."""
        counters, hists = dict(counters), dict(hists)
        for key in stale:
            cw, sh = self._counters.get(key), self._hists.get(key)
            if key in counters:
                if cw is not None and cw.last_value is not None:
                    counters[key] = cw.last_value
                else:
                    del counters[key]
            if key in hists:
                if sh is not None and sh.last is not None:
                    hists[key] = sh.last
                else:
                    del hists[key]
        return counters, hists

    def _add_counters(self, counters: dict[str, float], now: float, went_down: list[str]) -> None:
        # A series that appears on a page we read before started from zero since then (vLLM creates some
        # label sets lazily); on the first page there is no baseline at all.
        for key, value in counters.items():
            if key in self._stale:
                continue  # held at its last value: nothing to add
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
            if key in self._stale:
                continue
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
        derived = [phase for phase, _, _ in DERIVED_MEANS if phase not in self._hists]
        for phase, whole, part in DERIVED_MEANS:
            if phase in derived:  # a difference of means is a mean; percentiles do not subtract, so stay None
                w, b = row[f"{whole}_mean_ms"], row[f"{part}_mean_ms"]
                row[f"{phase}_mean_ms"] = None if w is None or b is None else max(w - b, 0.0)
        row["phase_times_derived"] = 1 if derived else 0

    def _delta(self, key: str) -> float | None:
        cw = None if key in self._stale else self._counters.get(key)
        return None if cw is None else cw.last_delta

    def _rate(self, key: str) -> float | None:
        cw = None if key in self._stale else self._counters.get(key)
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
    """A count as the store keeps it (INTEGER: int64); None for no reading, a non-finite or out-of-range one."""
    if v is None or not 0.0 <= v < _HUGE:  # NaN fails the comparison too
        return None
    return int(round(v))


_OURS = frozenset(("run_id", "scrape_ok", "scrape_errors"))  # the agent's own columns, not the page's
_INT_COLUMNS = frozenset(n for n, typ, _ in SERVING_METRICS if typ == "INTEGER")


def _checked(row: dict[str, Any]) -> list[str]:
    """Make a row's page values fit their columns (contract/columns.py): an INTEGER one a count in int64, a
    REAL one finite, a percentage 0-100; any other becomes NULL. Returns the columns that did not fit."""
    bad: list[str] = []
    for col, v in row.items():
        if v is None or col in _OURS:
            continue
        if col in _INT_COLUMNS:
            row[col] = _as_int(v)
            ok = row[col] is not None
        else:
            ok = math.isfinite(v) and (not col.endswith("_pct") or 0.0 <= v <= 100.0)
            if not ok:
                row[col] = None
        if not ok:
            bad.append(col)
    return bad
