"""One vLLM metrics page read into sums over engines: only the families lynxtop uses, within caps.

Owns the parse (text in, `ParsedPage` out, thread-safe) and its caches: the series already checked (`_KNOWN`)
and the layouts of pages seen before (`_PLANS`). Invariants: lines of families we do not read cost no Python
(one regular expression finds where the families we read are, the rest is never split); sums add the same floats
in page order as prometheus_client's parser would (tests/agent/io/test_io_promtext.py); a page over a cap raises
PageError before any cache keeps its keys.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Sequence
from functools import reduce
from itertools import repeat
from typing import Any

from lynxtop.agent.metrics.families import (
    BY_LABEL,
    COUNTER_NAMES,
    COUNTERS,
    GAUGE_NAMES,
    GAUGES_MAX,
    GAUGES_SUM,
    HIST_NAMES,
    HISTOGRAMS,
    MAX_NAMES,
    SUM_NAMES,
    TYPED_FAMILIES,
    by_label_name,
    sample_name,
)
from lynxtop.agent.metrics.histogram import HistogramSnapshot
from lynxtop.agent.metrics.promtext import SampleError, label_reader, le_of, split_sample, unescape

# Caps on what one page may hold, far above any real deployment (docs/sampling.md "Caps"): a server over one is
# refused, never followed into unbounded memory. A page over the first three gives no reading (an outage).
MAX_ENGINES = 1024  # distinct `engine` label values (vLLM's data-parallel ranks: 8-64 in practice)
MAX_SERIES = 65_536  # series of one family (engines x finished reasons, engines x buckets: ~300 at DP=8)
MAX_LABELS_CHARS = 2048  # one series' labels as written (vLLM's longest: ~200, with a long model path)
MAX_BUCKETS = 1000  # bucket bounds of one histogram (vLLM's have 10-30): over it that histogram is left out
HUGE = float(2 ** 63)  # a sample at or past this (or not finite) is no reading: no count a page gives gets there
# (nor is a counter's or a histogram's sample below 0: a count; a gauge may be negative, its column decides)


class PageError(ValueError):
    """The page is not a vLLM metrics page we can read; the message says why."""


SeriesKey = str  # one series: its sample line up to the value (name and labels, as the page spells them)


SeriesLists = tuple[tuple[SeriesKey, ...], Sequence[float]]  # a family's series and their values, in page order
_NO_SERIES: SeriesLists = ((), ())


class ParsedPage:
    """The values of one page we care about, summed over engines.

    `series` keeps each counter series behind those sums (per engine, per `le`), keyed by ("counter", key),
    ("bucket" | "sum" | "count", histogram key): Prometheus detects a counter reset per series, before summing.
    Values are the floats the page's lines were read as (NaN included: the reset correction holds that series).
    `series_lists` holds the same as (keys, values) pairs, what the reset correction reads: a page read through a
    plan gives them without a dict per family (the keys one tuple for every page), `series` is built on demand.
    """

    def __init__(self) -> None:
        self.counters: dict[str, float] = {}
        self.gauges: dict[str, float] = {}
        self.histograms: dict[str, HistogramSnapshot] = {}
        self.series_lists: dict[tuple[str, str], SeriesLists] = {}
        self._series: dict[tuple[str, str], dict[SeriesKey, float]] | None = None
        self.engines: dict[str, dict[str, float]] = {}  # engine label -> running / waiting / kv_usage
        self.bad_values = 0  # samples that were no reading (NaN, infinite, past 2**63, a negative count): left out
        self.bad_example = ""  # the first of them, as the page wrote it (cut short)
        self.refused: list[str] = []  # parts left out over a cap (a histogram with too many buckets)
        self.stale: set[str] = set()  # counters and histograms with a bad sample: this page adds nothing to them

    @property
    def series(self) -> dict[tuple[str, str], dict[SeriesKey, float]]:
        """Each family's series as a dict (built from `series_lists` when first asked for)."""
        if self._series is None:
            self._series = {sk: dict(zip(*kv, strict=True)) for sk, kv in self.series_lists.items()}
        return self._series


_FIRST = operator.itemgetter(0)
_THIRD = operator.itemgetter(2)
# Label values as written (\" escapes kept), matched at a series' `{` and read pair by pair from there: no text
# inside another label's value (`model_name=",engine="`) is read as a label (agent/metrics/promtext.py)
_LE = label_reader("le")
_ENGINE = label_reader("engine")
_BY_LABEL_READERS = {family: label_reader(label) for family, (label, _values) in BY_LABEL.items()}
_ENGINE_LINES = label_reader("engine", lines=True)  # each line's, over a span of lines: one C findall
_ENGINES_CHUNK = 1 << 16  # characters of lines per findall in `_check_engines` (~1000 lines)
_WANTED_SAMPLES = SUM_NAMES | MAX_NAMES | frozenset(h + s for h in HIST_NAMES for s in ("_bucket", "_sum", "_count"))
_TYPE_LINE = re.compile(r"\n# TYPE ([^ \n]*)")
_BY_LENGTH = sorted(_WANTED_SAMPLES, key=len, reverse=True)
_PREFIXES: dict[str, tuple[str, ...]] = {}  # family ("" before any TYPE line) -> what a wanted line starts with


def _prefixes(family: str) -> tuple[str, ...]:
    """What a wanted sample line starts with: a wanted name and the character after it ("{", " " or tab), the
    family's own names first, so a line of the family is told by its first few `startswith` checks.

    Any wanted name is accepted in any span, as a page's stray sample is by prometheus_client; keyed by the TYPE
    names we read (TYPED_FAMILIES) and "", so bounded."""
    found = _PREFIXES.get(family)
    if found is None:
        own = [n for n in _BY_LENGTH if family and n.startswith(family)]
        found = tuple(n + sep for n in own + [n for n in _BY_LENGTH if n not in own] for sep in ("{", " ", "\t"))
        _PREFIXES[family] = found
    return found


def _wanted_lines(text: str, start: int, end: int, family: str) -> list[str]:
    """The wanted sample lines of one span (whose first line is the TYPE line or a comment, never a sample).

    One C split and one C `startswith` per line: a Python step per line only for the lines kept. A DP8 page's
    selection took 1.3 ms through one regular expression over the spans, 1.0 this way (issue 29.3)."""
    prefixes = _prefixes(family)
    return [line for line in text[start:end].split("\n") if line.startswith(prefixes)]


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
# as promtext's label cache: a server inventing label sets (a label that changes every scrape) cannot grow this
# further, while a DP=8 page's ~1,440 keys (~140k characters; ~360k with a long model path) fit 5 to 14 times
_KNOWN_MAX = 25_000
_KNOWN_CHARS_MAX = 2 << 20  # nor can long label sets (each up to MAX_LABELS_CHARS)
_known_chars = [0]  # characters of the keys in _KNOWN (a list: updated from the parsing thread too)


def _kind(name: str) -> int:
    if name in MAX_NAMES:
        return _GAUGE_MAX
    if name in GAUGE_NAMES:
        return _GAUGE_SUM
    if name in COUNTER_NAMES:
        return _COUNTER
    return _BUCKET if name.endswith("_bucket") else _PART


class _Totals:
    """The selected samples of one page, added up as Prometheus' `sum by ()` / `max by ()` would.

    Lines are read in page order, so every sum adds the same floats in the same order as prometheus_client's
    parser did (same result to the last digit); NaN samples are skipped, as before. A line of a series seen
    before (`name{labels} value`, the same labels) costs a split and a float: its labels were checked when it
    was first seen (agent/metrics/promtext.py), and what it adds to is remembered. Any other line takes that full path.
    """

    __slots__ = ("sums", "maxes", "buckets", "raw", "lists", "engines", "bad", "bad_example", "bad_names", "refused",
                 "plan")

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.maxes: dict[str, float] = {}
        self.buckets: dict[str, dict[float, float]] = {}
        self.raw: dict[str, dict[SeriesKey, float]] = {}  # counter and histogram series: value by series
        self.lists: dict[str, SeriesLists] | None = None  # the same as (keys, values), from a plan
        self.plan: _Plan | None = None  # the plan that added them up
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
            # NaN, infinite, past any count, or a count below 0: no reading (counted)
            if not -HUGE < value < HUGE or (value < 0.0 and kind >= _COUNTER):
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
        kind = _kind(name)
        if not -HUGE < value < HUGE or (value < 0.0 and kind >= _COUNTER):
            value = self._no_reading(key, value)
        le = le_of(key, end) if kind == _BUCKET else math.nan
        m = _ENGINE.match(key, end) if kind < _COUNTER else None
        if name in _BY_LABEL_READERS:  # one sum per label value read (families.py BY_LABEL), kept with the series
            label = _BY_LABEL_READERS[name].match(key, end)
            name = by_label_name(name, unescape(label.group(1)) if label else None)
        if line.rpartition(" ")[0] == key:  # the plain `series value` form: the fast path can take it next time
            if len(_KNOWN) >= _KNOWN_MAX or _known_chars[0] >= _KNOWN_CHARS_MAX:
                _KNOWN.clear()
                _known_chars[0] = 0
            _KNOWN[key] = (kind, name, le, unescape(m.group(1)) if m else "")
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
            self._gauge(kind, name, unescape(m.group(1)) if m else "", value)

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


def _one(i: Any) -> Callable[[Any], tuple[Any, ...]]:
    return lambda seq: (seq[i],)


def _none(seq: Any) -> tuple[Any, ...]:
    return ()


def picker(idx: Sequence[Any]) -> Callable[[Any], tuple[Any, ...]]:
    """The items at `idx` (indices of a sequence, keys of a dict), always as a tuple, gathered in C: what
    `operator.itemgetter` gives for two or more, also for one (a 1-tuple) and none (an empty tuple)."""
    return operator.itemgetter(*idx) if len(idx) > 1 else _one(idx[0]) if idx else _none


_CHAIN = 32  # _Plan.totals: maps chained at most this deep (each next() of the outer one recurses in C)


class _Plan:
    """Where each line of one page layout goes: the same series in the same order, every page of a steady server.

    Built once from the series `_Totals` has checked; a later page with that layout is added up without a Python
    step per line or per sum: every sum (a counter's, a histogram bucket's over engines, an engine's gauge) is a
    group of lines, and the groups of one size k are added up together by k C `map(add)` over their j-th lines
    (fewer groups than k: one `reduce` each), so each sum is ((0.0 + first) + second) + ... in page order, what
    `_Totals.add_lines` gives to the last digit
    (the tests compare both with prometheus_client). Each family's series come as (keys, values) pairs, the
    keys one tuple for every page. A page with a NaN, an odd value or any other layout takes `add_lines`.
    """

    __slots__ = ("_steps", "_alone", "_maxes", "_sums", "_buckets", "_engines", "_lists", "_max_names", "_pick_maxes",
                 "shape", "shaped")

    def __init__(self, keys: tuple[SeriesKey, ...]) -> None:
        groups: dict[tuple[Any, ...], list[int]] = {}  # what a sum adds up -> its lines, in page order
        maxes: dict[tuple[Any, ...], list[int]] = {}  # the same for a max
        sums: list[str] = []
        buckets: dict[str, list[float]] = {}
        engines: dict[str, dict[str, tuple[Any, ...]]] = {}
        raw: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            kind, name, le, engine = _KNOWN[key]
            if kind < _COUNTER:
                if kind == _GAUGE_MAX:
                    maxes.setdefault(("max", name), []).append(i)
                    maxes.setdefault(("engine", engine, name), []).append(i)
                    engines.setdefault(engine, {}).setdefault(name, ("engine", engine, name))
                    continue
                engines.setdefault(engine, {}).setdefault(name, ("engine", engine, name))
                groups.setdefault(("engine", engine, name), []).append(i)
            else:
                raw.setdefault(name, []).append(i)
            if kind == _BUCKET:
                les = buckets.setdefault(name[:-7], [])
                if ("bucket", name[:-7], le) not in groups:
                    les.append(le)
                groups.setdefault(("bucket", name[:-7], le), []).append(i)
            else:
                if ("sum", name) not in groups:
                    sums.append(name)
                groups.setdefault(("sum", name), []).append(i)
        by_size: dict[int, list[tuple[Any, ...]]] = {}
        for what, ix in groups.items():
            by_size.setdefault(len(ix), []).append(what)
        # fewer sums than lines each (one family's 40 series): one `reduce` a sum, not a `map` a line rank
        ranked = [(size, whats) for size, whats in sorted(by_size.items()) if len(whats) >= size]
        alone = [what for size, whats in sorted(by_size.items()) if len(whats) < size for what in whats]
        order = [what for _, whats in ranked for what in whats] + alone  # the sums' place in `totals`' list
        self._steps = [(len(whats), [picker([groups[w][j] for w in whats]) for j in range(size)])
                       for size, whats in ranked]
        self._alone = [picker(groups[w]) for w in alone]
        self._maxes = [picker(ix) for ix in maxes.values()]  # after the sums, in that list
        at = {what: n for n, what in enumerate([*order, *maxes])}
        self._sums = (tuple(sums), picker([at[("sum", n)] for n in sums]))
        self._max_names = tuple(n for _, n in [w for w in maxes if w[0] == "max"])
        self._pick_maxes = picker([at[w] for w in maxes if w[0] == "max"])
        self._buckets = [(h, tuple(les), picker([at[("bucket", h, le)] for le in les])) for h, les in buckets.items()]
        self._engines = [(e, tuple(per), picker([at[w] for w in per.values()])) for e, per in engines.items()]
        self.shape: _Shape | None = None  # what `_page_of` reads each quantity from: found on the plan's first page
        self.shaped = False  # looked for (None then: the plan's pages are read by name)
        self._lists: list[tuple[str, tuple[SeriesKey, ...], Callable[[Sequence[Any]], tuple[Any, ...]], bool]] = []
        for name, ix in raw.items():
            series = picker(ix)(keys)
            self._lists.append((name, series, picker(ix), len(set(series)) == len(series)))

    def totals(self, values: list[float]) -> _Totals:
        out: list[float] = []
        for width, steps in self._steps:
            # each sum added up in page order, 0.0 first, as before; chained maps build no list per step (a DP=8
            # page: 8 engines' 172 sums), only the sums themselves; a list each _CHAIN steps bounds the nesting
            acc: Any = repeat(0.0, width)
            for k, step in enumerate(steps, 1):
                acc = map(operator.add, acc, step(values))
                if not k % _CHAIN:
                    acc = list(acc)
            out += acc
        out += [reduce(operator.add, pick(values), 0.0) for pick in self._alone]
        out += [max(pick(values)) for pick in self._maxes]
        t = _Totals()
        names, pick = self._sums
        t.sums = dict(zip(names, pick(out), strict=True))
        t.maxes = dict(zip(self._max_names, self._pick_maxes(out), strict=True))
        t.buckets = {h: dict(zip(les, pick(out), strict=True)) for h, les, pick in self._buckets}
        t.engines = {e: dict(zip(names, pick(out), strict=True)) for e, names, pick in self._engines}
        t.lists = {n: (series, pick(values)) if unique else _as_lists(dict(zip(series, pick(values), strict=True)))
                   for n, series, pick, unique in self._lists}
        t.plan = self
        return t


class _Shape:
    """Which name each quantity of a plan's pages is read from, and how its histogram's buckets are ordered: what
    `_page_of` finds by name on every page, the same for every page of one plan (values aside). Found once, on
    the plan's first page without a bad value or a part left out; `fill` then builds each page from it."""

    __slots__ = ("counters", "gauges", "histograms", "engines")

    def __init__(self, t: _Totals) -> None:
        self.counters = [(key, name) for key, cands in COUNTERS.items()
                         if (name := _present(cands, t.sums)) is not None]
        self.gauges = [(key, name, values is t.maxes) for table, values in ((GAUGES_SUM, t.sums), (GAUGES_MAX, t.maxes))
                       for key, cands in table.items() if (name := _present(cands, values)) is not None]
        self.histograms: list[tuple[str, str, bool]] = []
        for key, cands in HISTOGRAMS.items():
            name = _present(cands, t.buckets)
            if name is not None:
                les = list(t.buckets[name])
                # bounds already increasing (and no NaN): the page's order is the sorted one, no sort a page
                self.histograms.append((key, name, all(map(operator.lt, les, les[1:]))))
        self.engines = [(e, [(key, name) for key, cands in (*GAUGES_SUM.items(), *GAUGES_MAX.items())
                             if (name := _present(cands, vals)) is not None]) for e, vals in t.engines.items()]

    @staticmethod
    def of(t: _Totals) -> _Shape | None:
        """The shape of `t`'s page, or None where `_page_of` reads it otherwise (a bad value, a part left out, a
        histogram too wide or without its +Inf bucket): such a page takes the reading by name."""
        if t.bad_names or t.refused or any(len(per) > MAX_BUCKETS or not any(map(math.isinf, per))
                                           for per in t.buckets.values()):
            return None
        return _Shape(t)

    def fill(self, t: _Totals, lists: dict[str, SeriesLists]) -> ParsedPage:
        """The page `_page_of` makes of `t` (tests/agent/io/test_io_layout.py compares both on every page)."""
        page = ParsedPage()
        sums, buckets, series = t.sums, t.buckets, page.series_lists
        for key, name in self.counters:
            page.counters[key] = sums[name]
            series[("counter", key)] = lists.get(name, _NO_SERIES)
        page.gauges = {key: (t.maxes if is_max else sums)[name] for key, name, is_max in self.gauges}
        for key, name, ordered in self.histograms:
            per_le = buckets[name]
            bs = tuple(per_le.items()) if ordered else tuple(sorted(per_le.items()))
            if not math.isinf(bs[-1][0]):
                raise PageError(f"histogram {name} has no +Inf bucket")
            page.histograms[key] = HistogramSnapshot(buckets=bs, sum=sums.get(name + "_sum", 0.0),
                                                     count=sums.get(name + "_count", bs[-1][1]))
            series[("bucket", key)] = lists.get(name + "_bucket", _NO_SERIES)
            for part in ("_sum", "_count"):
                if name + part in lists:
                    series[(part[1:], key)] = lists[name + part]
        engines = t.engines
        page.engines = {e: {key: engines[e][name] for key, name in spec} for e, spec in self.engines}
        return page


def _as_lists(per: dict[SeriesKey, float]) -> tuple[tuple[SeriesKey, ...], tuple[float, ...]]:
    """A family's series as (keys, values): a series written twice keeps its first place and last value."""
    return tuple(per), tuple(per.values())


_PLANS: dict[tuple[SeriesKey, ...], _Plan] = {}
_PLANS_MAX = 8  # layouts of the servers this process reads (one per run; a few while a run changes shape)
_PLAN_LINES_MAX = 50_000  # a DP=8 page has ~1000 lines we read; a larger one is read without a plan


def _scan(text: str) -> tuple[bool, _Totals]:
    """(whether the page had any vllm: sample, the selected samples added up); SampleError on a bad line.

    Only the spans of the families we read (`_wanted_spans`) are split into lines, each kept by one C
    `startswith` (`_wanted_lines`): the lines we do not read cost no Python, two thirds of a DP=8 page are never
    split. A page laid
    out as one read before is added up through that layout's `_Plan`."""
    if not text.startswith("#"):  # the lines are found by the newline before them: the first one too
        text = "\n" + text
    found: list[str] = []
    spans = _wanted_spans(text)
    refused: list[str] = []
    for start, end, family in spans:
        lines = _wanted_lines(text, start, end, family)
        found += _without_wide_histograms(lines, refused) if len(lines) > MAX_BUCKETS else lines
    seen_vllm = "\nvllm:" in text
    unplannable = len(found) > _PLAN_LINES_MAX
    if unplannable and text.count("engine") > MAX_ENGINES:  # never planned: count before its lines are split
        _check_engines(text, spans)
    split = [line.rpartition(" ") for line in found]
    keys = tuple(map(_FIRST, split))
    longest = max(map(len, keys), default=0)
    if longest > MAX_LABELS_CHARS:  # checked before any cache keeps such a key
        raise PageError(f"a series' name and labels are {longest} characters, over the cap of {MAX_LABELS_CHARS}: "
                        f"{keys[[len(k) for k in keys].index(longest)][:80]!r}...")
    plan = _PLANS.get(keys)  # a layout is planned only within the caps: a known one needs no checks
    # Past MAX_ENGINES "engine"s, count the distinct values before any line is read into a cache or a sum. A
    # planned layout has the same series, so the same engines: a DP=8 page of eight API servers has ~2800 "engine"
    # and the exact count was half of its parse.
    if (plan is None or refused) and not unplannable and text.count("engine") > MAX_ENGINES:
        _check_engines(text, spans)
    if plan is not None:
        vals = list(map(_THIRD, split))
        if "_" not in "".join(vals):  # Python's float reads "1_0"; Prometheus text does not
            try:
                values = list(map(float, vals))
            except ValueError:
                values = []
            # no NaN, none past 2**63, none below 0 (a negative gauge is read by `add_lines` too, as it reads it)
            if values and not any(map(math.isnan, values)) and min(values) >= 0.0 and max(values) < HUGE:
                t = plan.totals(values)
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


def _check_engines(text: str, spans: list[tuple[int, int, str]]) -> None:
    """PageError past MAX_ENGINES distinct `engine` label values (100k once took the agent to 290 MiB).

    Each line's engine is read at its pair (`_ENGINE_LINES`, what `_add_checked` reads), a chunk of lines per C
    `findall`: ~1.2 ms for the 2800 "engine" of a DP=8 page of eight API servers (1.8 by a search per match),
    and a page far over the cap is refused after its first chunk, never listed whole."""
    seen: set[str] = set()
    for start, end, _family in spans:  # a span and each chunk start at a newline: `^` finds their first line
        while start < end:
            cut = text.find("\n", min(start + _ENGINES_CHUNK, end), end)
            cut = end if cut < 0 else cut
            seen.update(_ENGINE_LINES.findall(text, start, cut))
            if len(seen) > MAX_ENGINES:
                raise PageError(f"more than {MAX_ENGINES} engine label values, over the cap of {MAX_ENGINES}")
            start = cut


def _without_wide_histograms(lines: list[str], refused: list[str]) -> list[str]:
    """`lines` less those of a histogram with more bucket bounds than MAX_BUCKETS (each named in `refused`), left
    out before any line is split or cached: 60k buckets once grew the window to ~925 MiB."""
    les: dict[str, set[str]] = {}
    for line in lines:
        cut = line.find("{")  # where a `name{labels} value` line's labels start (a name has no "{")
        if cut > 7 and line.endswith("_bucket", 0, cut):
            m = _LE.match(line, cut)
            if m:
                les.setdefault(line[:cut - 7], set()).add(m.group(1))
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


def _wanted_spans(text: str) -> list[tuple[int, int, str]]:
    """Where the families we read are on a page: (start, end, family) from each one's TYPE line to the next TYPE
    line; family "" for what comes before the first TYPE line, which is read too, as a page without TYPE lines is.

    The exposition format keeps a family's samples together after its TYPE line (prometheus_client writes every
    page so, one API server or many)."""
    marks = [(m.start(), m.group(1)) for m in _TYPE_LINE.finditer(text)]
    if not marks:
        return [(0, len(text), "")]
    ends = [i + 1 for i, _ in marks[1:]] + [len(text)]
    return [(0, marks[0][0] + 1, "")] + [(i, end, name) for (i, name), end in zip(marks, ends, strict=True)
                                         if name in TYPED_FAMILIES]


def parse_text(text: str) -> ParsedPage:
    """Read the families lynxtop uses from exposition text; raises PageError naming the problem. Thread-safe.

    Only the selected lines are parsed (agent/metrics/promtext.py), so the cost follows the families read, not the page:
    a DP=8 page's ~3000 lines cost what its ~1000 selected lines cost.
    """
    try:
        seen_vllm, t = _scan(text)
    except SampleError as exc:
        raise PageError(f"not Prometheus text: {exc}") from None
    return _page_of(seen_vllm, t)


def _page_of(seen_vllm: bool, t: _Totals) -> ParsedPage:
    """The page's quantities from its added-up samples (also for agent/metrics/layout.py's known layouts)."""
    if not seen_vllm:
        raise PageError("no vllm:* metrics on the page (is this a vLLM server?)")
    raw = t.lists if t.lists is not None else {n: _as_lists(per) for n, per in t.raw.items()}
    plan = t.plan
    if plan is not None and not (t.bad_names or t.refused):  # a plan's page: each quantity where it was
        if not plan.shaped:
            plan.shape, plan.shaped = _Shape.of(t), True
        if plan.shape is not None:
            return plan.shape.fill(t, raw)
    page = ParsedPage()
    page.refused = list(t.refused)
    bad = t.bad_names
    for key, candidates in COUNTERS.items():
        name = _present(candidates, t.sums)  # every sample no reading: absent from the sums, and stale
        if name is not None:
            page.counters[key] = t.sums[name]
            page.series_lists[("counter", key)] = raw.get(name, _NO_SERIES)
            if name in bad:
                page.stale.add(key)
        elif bad and any(n in bad for n in candidates):  # held, not gone: gone, it would come back from zero
            page.stale.add(key)
    for table, values in ((GAUGES_SUM, t.sums), (GAUGES_MAX, t.maxes)):
        for key, candidates in table.items():
            name = _present(candidates, values)
            # one engine's bad gauge: the sum is no reading either
            if name is not None and sample_name(name) not in bad:
                page.gauges[key] = values[name]
    for key, candidates in HISTOGRAMS.items():
        name = _present(candidates, t.buckets)
        if name is None:
            if bad and any(n + part in bad for n in candidates for part in ("_bucket", "_sum", "_count")):
                page.stale.add(key)
            continue
        if len(t.buckets[name]) > MAX_BUCKETS:  # its window would hold every bucket of every scrape
            page.refused.append(f"histogram {name} has {len(t.buckets[name])} buckets, over the cap of "
                                f"{MAX_BUCKETS}: its latency columns stay empty")
            continue
        _add_histogram(page, key, name, t.buckets[name], t.sums, raw, name + "_bucket" in bad)
        if bad and any(name + part in bad for part in ("_bucket", "_sum", "_count")):
            page.stale.add(key)
    page.engines = _engine_gauges(t.engines)
    page.bad_values, page.bad_example = t.bad, t.bad_example
    return page


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
                   raw: dict[str, SeriesLists], bad_bucket: bool) -> None:
    """The histogram into `page`; PageError without a +Inf bucket, unless its +Inf samples were no reading
    (`bad_bucket`: a bucket sample was, so the page holds it stale): then that bucket is NaN, the layout kept."""
    bs = tuple(sorted(per_le.items()))
    if not math.isinf(bs[-1][0]):
        if not bad_bucket:
            raise PageError(f"histogram {name} has no +Inf bucket")
        bs += ((math.inf, math.nan),)
    page.histograms[key] = HistogramSnapshot(
        buckets=bs, sum=sums.get(name + "_sum", 0.0), count=sums.get(name + "_count", bs[-1][1])
    )
    page.series_lists[("bucket", key)] = raw.get(name + "_bucket", _NO_SERIES)
    for part in ("sum", "count"):
        if name + "_" + part in raw:
            page.series_lists[(part, key)] = raw[name + "_" + part]

