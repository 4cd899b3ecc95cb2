"""The scraper's own line reader against prometheus_client, the reference parser: same numbers to the last digit.

Pages: two captured from a real vLLM 0.32 (CPU build, the tiny model of the real-vLLM stage; one plain, one with
`--data-parallel-size 2 --api-server-count 2`), a DP=8 page from the simulator's metric families, one the simulator
served with `-dp 8 --enable-expert-parallel` (eight API servers' multiprocess page, after 48 requests), and a page with
per-engine and per-model labels (two served models on one page). Every derived figure of a scrape sequence is
compared too, with the reference parser swapped in.
"""

from __future__ import annotations

import math
import random
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.vllm_pages import sim_page

from lynxtop.agent.metrics import families
from lynxtop.agent.metrics import page as page_mod
from lynxtop.agent.metrics import scrape as scrape_mod
from lynxtop.agent.metrics.histogram import HistogramSnapshot
from lynxtop.agent.metrics.scrape import MetricsScraper, PageError, parse_text

PAGES = Path(__file__).resolve().parent / "pages"


def reference_parse(text: str) -> page_mod.ParsedPage:
    """parse_text as it was: the selected lines through prometheus_client (the reference); a value that is no
    reading (NaN, infinite, past 2**63: issue 25.1) is left out of every sum and kept as NaN in its series."""
    relevant, seen = page_mod.relevant_lines(text)
    if not seen:
        raise PageError("no vllm:* metrics on the page (is this a vLLM server?)")
    sums: dict[str, float] = {}
    maxes: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    raw: dict[str, dict[str, float]] = {}
    try:
        for family in text_string_to_metric_families(relevant):
            for s in family.samples:
                value = float(s.value)
                if not -2.0 ** 63 < value < 2.0 ** 63:
                    continue
                if s.name in families.BY_LABEL:  # one sum per label value read (families.BY_LABEL)
                    name = families.by_label_name(s.name, s.labels.get(families.BY_LABEL[s.name][0]))
                    sums[name] = sums.get(name, 0.0) + value
                elif s.name in families.MAX_NAMES:
                    maxes[s.name] = max(maxes.get(s.name, -math.inf), value)
                elif s.name not in families.SUM_NAMES and s.name.endswith("_bucket"):
                    per = buckets.setdefault(s.name[:-7], {})
                    le = float(s.labels["le"])
                    per[le] = per.get(le, 0.0) + value
                else:
                    sums[s.name] = sums.get(s.name, 0.0) + value
    except Exception as exc:  # noqa: BLE001 - anything the reference refuses
        raise PageError(f"not Prometheus text: {exc}") from None
    for line in relevant.splitlines():  # each series' value, by its key as the page wrote it (string work)
        name = re.split(r"[{ \t]", line, maxsplit=1)[0]
        if name in families.SERIES_NAMES:
            cut = line.rfind("}") + 1 or len(name)
            value = float(line[cut:].split()[0])
            raw.setdefault(name, {})[line[:cut]] = value if -2.0 ** 63 < value < 2.0 ** 63 else math.nan
    page = page_mod.ParsedPage()
    for key, cands in families.COUNTERS.items():
        name = next((n for n in cands if n in sums), None)
        if name is not None:
            page.counters[key] = sums[name]
            page.series[("counter", key)] = raw.get(name, {})
    for table, values in ((families.GAUGES_SUM, sums), (families.GAUGES_MAX, maxes)):
        for key, cands in table.items():
            name = next((n for n in cands if n in values), None)
            if name is not None:
                page.gauges[key] = values[name]
    for key, cands in families.HISTOGRAMS.items():
        name = next((n for n in cands if n in buckets), None)
        if name is not None:
            bs = tuple(sorted(buckets[name].items()))
            page.histograms[key] = HistogramSnapshot(buckets=bs, sum=sums.get(name + "_sum", 0.0),
                                                     count=sums.get(name + "_count", bs[-1][1]))
            page.series[("bucket", key)] = raw.get(name + "_bucket", {})
            for part in ("sum", "count"):
                if name + "_" + part in raw:
                    page.series[(part, key)] = raw[name + "_" + part]
    page.series_lists = {sk: (tuple(per), tuple(per.values())) for sk, per in page.series.items()}  # as read
    return page


def page_texts() -> dict[str, str]:
    return {
        "real-0.32": (PAGES / "vllm-0.32-cpu-tiny.txt").read_text(),
        "real-0.32-dp2-api2": (PAGES / "vllm-0.32-cpu-tiny-dp2-api2.txt").read_text(),
        "sim-dp8": sim_page(8, seed=1),
        "sim-dp8-ep-served": (PAGES / "sim-0.32-dp8-ep.txt").read_text(),  # as the simulator serves DP8+EP
        "sim-dp8-two-models": sim_page(8, seed=2, models=("deepseek-ai/DeepSeek-V4.1", "deepseek-v4-lora")),
    }


def same(a: page_mod.ParsedPage, b: page_mod.ParsedPage) -> None:
    assert a.counters == b.counters  # floats compared exactly: same additions in the same order
    assert a.gauges == b.gauges
    assert a.histograms == b.histograms
    assert a.series.keys() == b.series.keys()
    for k, series in a.series.items():  # NaN equals NaN here: the same value read from the same text
        assert list(series) == list(b.series[k])
        assert [repr(v) for v in series.values()] == [repr(v) for v in b.series[k].values()]


@pytest.mark.parametrize("name", list(page_texts()))
def test_selected_lines_read_by_hand_equal_prometheus_client(name):
    text = page_texts()[name]
    ours, ref = parse_text(text), reference_parse(text)
    same(ours, ref)
    assert ref.counters and ref.histograms and ref.gauges  # the page has what we read: not a vacuous equality
    assert {"ttft", "itl", "e2e", "queue"} <= set(ours.histograms)


def test_real_dp_page_gives_one_engine_entry_per_engine_label():
    page = parse_text((PAGES / "vllm-0.32-cpu-tiny-dp2-api2.txt").read_text())
    assert sorted(page.engines) == ["0", "1"]
    for vals in page.engines.values():
        assert set(vals) == {"running", "waiting", "deferred", "kv_usage"}  # deferred: waiting_by_reason
    assert sum(v["running"] for v in page.engines.values()) == page.gauges["running"]


def test_sim_dp8_engines_add_up_to_the_totals():
    page = parse_text(sim_page(8, seed=3))
    assert sorted(page.engines, key=int) == [str(e) for e in range(8)]
    assert math.fsum(v["waiting"] for v in page.engines.values()) == page.gauges["waiting"]
    assert max(v["kv_usage"] for v in page.engines.values()) == page.gauges["kv_usage"]


def _perturb(text: str, rng: random.Random) -> str:
    """The next page: every counter, bucket, sum and count of every engine grows (one engine restarts)."""
    out = []
    for line in text.splitlines():
        m = re.match(r"^(vllm:\S+?(?:_total|_bucket|_sum|_count)(?:\{[^}]*\})?) (\S+)$", line)
        if m and 'engine="3"' not in line:
            out.append(f"{m.group(1)} {float(m.group(2)) + rng.randint(0, 40) * 0.5}")
        elif m:
            out.append(f"{m.group(1)} {float(m.group(2)) * 0.25}")  # engine 3 restarted: below before
        else:
            out.append(line)
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("name", list(page_texts()))
def test_every_derived_figure_of_a_scrape_sequence_is_the_same(name, monkeypatch):
    rng = random.Random(7)
    pages = [page_texts()[name]]
    for _ in range(5):
        pages.append(_perturb(pages[-1], rng))
    ours = MetricsScraper("http://x:1", window_s=60.0)
    rows = [ours.parse_page(p, now=float(i)) for i, p in enumerate(pages)]
    monkeypatch.setattr(scrape_mod, "parse_text", reference_parse)
    monkeypatch.setattr(scrape_mod.PageLayout, "parse", lambda self, text: reference_parse(text))  # every page
    ref = MetricsScraper("http://x:1", window_s=60.0)
    ref_rows = [ref.parse_page(p, now=float(i)) for i, p in enumerate(pages)]
    assert rows == ref_rows
    assert ours.resets == 5 or name.startswith("real-0.32")  # engine 3's restarts were seen (one event: an episode)
    assert any(v not in (None, 0, 0.0) for v in rows[-1].values())


@pytest.mark.parametrize("line", [
    "vllm:num_requests_running 1 2 3 x",
    'vllm:num_requests_running{engine=0} 5',
    'vllm:num_requests_running{engine="0" 3',
    'vllm:num_requests_running{engine="0"}',
    'vllm:num_requests_running{engine="0"} 1_000',
    'vllm:num_requests_running{engine="0"} abc',
    'vllm:time_to_first_token_seconds_bucket{le="abc"} 1',
    'vllm:time_to_first_token_seconds_bucket{model_name="m"} 1',
])
def test_a_line_the_reference_refuses_is_refused(line):
    text = f"{line}\n"
    with pytest.raises(PageError):
        reference_parse(text)
    with pytest.raises(PageError, match="not Prometheus text"):
        parse_text(text)


@pytest.mark.parametrize("value", ["1_000", "abc", "1 2 3 x", "", "0x10"])
def test_a_known_series_with_a_bad_value_is_still_refused(value):
    parse_text('vllm:num_requests_running{engine="0"} 5\n')  # the series is known: its next line takes the short path
    text = f'vllm:num_requests_running{{engine="0"}} {value}\n'
    with pytest.raises(PageError):
        reference_parse(text)
    with pytest.raises(PageError, match="not Prometheus text"):
        parse_text(text)


def test_a_histogram_whose_buckets_are_all_nan_is_absent_as_in_the_reference():
    good = 'vllm:time_to_first_token_seconds_bucket{le="1.0"} 1\nvllm:time_to_first_token_seconds_bucket{le="+Inf"} 2\n'
    parse_text(good)  # known series: the NaN page below takes the short path
    text = good.replace(" 1\n", " NaN\n").replace(" 2\n", " NaN\n") + "vllm:num_requests_running 1\n"
    ours, ref = parse_text(text), reference_parse(text)
    same(ours, ref)
    assert "ttft" not in ours.histograms and ours.gauges == {"running": 1.0}


@pytest.mark.parametrize("line", [
    'vllm:num_requests_running{engine="0",model_name="a,b}c"} 4',
    'vllm:num_requests_running{engine="0", model_name="x\\"y"} 4 1700000000000',
    "vllm:num_requests_running 4e0",
    'vllm:num_requests_running{engine="0",} +Inf',
    "vllm:num_requests_running\t7",
])
def test_odd_but_valid_lines_read_the_same(line):
    text = f"{line}\n"
    assert parse_text(text).gauges == reference_parse(text).gauges


@pytest.mark.parametrize("shape", ["no comment lines", "samples before the first TYPE", "two pages in a row",
                                   "a TYPE line without its type"])
def test_only_the_families_read_are_scanned_and_odd_layouts_still_read_the_same(shape):
    page = sim_page(8, seed=4)
    if shape == "no comment lines":
        text = "".join(x + "\n" for x in page.splitlines() if not x.startswith("#"))
    elif shape == "samples before the first TYPE":
        text = 'vllm:num_requests_running{engine="9"} 3\n' + page
    elif shape == "a TYPE line without its type":
        text = page.replace("# TYPE vllm:num_requests_running gauge", "# TYPE vllm:num_requests_running")
    else:  # a proxy that concatenates two servers' pages: every family twice, each with its TYPE line
        text = page + sim_page(8, seed=5).replace('engine="', 'engine="1')
    same(parse_text(text), reference_parse(text))
    spans = page_mod._wanted_spans("\n" + text)
    covered = sum(end - start for start, end, _family in spans)
    if shape == "no comment lines":
        assert spans == [(0, len(text) + 1, "")]
    else:
        assert covered < 0.5 * len(text)  # the regular expression never sees most of the page


@pytest.mark.parametrize("name", list(page_texts()))
def test_a_page_laid_out_as_the_last_is_added_up_by_its_plan_to_the_last_digit(name, monkeypatch):
    first = page_texts()[name]
    page_mod._PLANS.clear()
    parse_text(first)  # line by line; its layout is planned
    assert len(page_mod._PLANS) == 1
    nxt = _perturb(first, random.Random(11))

    def no_line_by_line(self, found):
        raise AssertionError("a page of a planned layout was read line by line")

    with monkeypatch.context() as m:
        m.setattr(page_mod._Totals, "add_lines", no_line_by_line)
        ours = parse_text(nxt)
    same(ours, reference_parse(nxt))
    page_mod._PLANS.clear()
    by_line = parse_text(nxt)
    same(ours, by_line)
    assert ours.engines == by_line.engines and ours.engines  # the per-engine gauges too (the reference has none)
    assert ours.counters != parse_text(first).counters  # the values moved: not the first page's totals again


def test_a_planned_layout_is_not_searched_for_engine_labels_again(monkeypatch):
    """Issue 29.3: the DP8+EP page the simulator serves (eight API servers) writes "engine" ~2800 times, past
    MAX_ENGINES, so every scrape counted its distinct engine values: half of the parse. A page laid out as a planned
    one has the same series, so the same engines (checked when it was planned); a new layout is still counted."""
    first = page_texts()["sim-dp8-ep-served"]
    assert first.count("engine") > page_mod.MAX_ENGINES  # the count applies to this page
    counted: list[int] = []
    real = page_mod._check_engines

    def counting(text: str, spans: list[tuple[int, int]]) -> None:
        counted.append(1)
        real(text, spans)

    monkeypatch.setattr(page_mod, "_check_engines", counting)
    page_mod._PLANS.clear()
    parse_text(first)
    assert counted == [1]  # a layout seen first is counted
    nxt = _perturb(first, random.Random(5))
    ours = parse_text(nxt)
    assert counted == [1]  # its next page is not
    same(ours, reference_parse(nxt))
    other = first.replace('engine="7"', 'engine="8"')  # another layout: counted again
    parse_text(other)
    assert counted == [1, 1]


@pytest.mark.parametrize("value", ["NaN", "1_000", "abc", "+Inf"])
def test_a_planned_layout_with_an_odd_value_reads_as_the_reference_does(value):
    page = sim_page(8, seed=6)
    page_mod._PLANS.clear()
    parse_text(page)
    assert page_mod._PLANS
    line = next(x for x in page.splitlines() if x.startswith("vllm:e2e_request_latency_seconds_sum{"))
    text = page.replace(line, f"{line.rpartition(' ')[0]} {value}")
    try:
        ref = reference_parse(text)
    except PageError:
        with pytest.raises(PageError, match="not Prometheus text"):
            parse_text(text)
        return
    same(parse_text(text), ref)


def _unused_families(seed: int) -> str:
    """Families lynxtop does not read, named to look like those it does: a wanted name with a suffix
    (`_created`, `_by_reason`, `_bucket` of a gauge), a prefix of one, and one of another exporter."""
    rng = random.Random(seed)
    out = []
    for name, kind in (("vllm:num_requests_running_by_reason", "gauge"), ("vllm:prompt_tokens", "gauge"),
                       ("vllm:time_to_first_token_seconds_created", "gauge"), ("vllm:kv_cache_usage_perc_max", "gauge"),
                       ("process_cpu_seconds", "counter"), ("vllm:request_success_created", "gauge")):
        out.append(f"# HELP {name} not read by lynxtop\n# TYPE {name} {kind}\n")
        sample = name + ("_total" if kind == "counter" else "")
        out += [f'{sample}{{engine="{e}"}} {rng.randint(0, 999)}\n' for e in range(8)]
    return "".join(out)


@pytest.mark.parametrize("where", ["first", "between", "last"])
def test_a_page_with_unused_families_parses_to_the_same_rows(where):
    """Lines of families not read are skipped at the line level, wherever they sit, and change nothing read."""
    page = sim_page(8, seed=6)
    extra = _unused_families(7)
    if where == "first":
        text = extra + page
    elif where == "last":
        text = page + extra
    else:  # after the family of the running gauge, before the next one
        cut = page.index("# HELP", page.index("# TYPE vllm:num_requests_running gauge"))
        text = page[:cut] + extra + page[cut:]
    plain, padded = parse_text(page), parse_text(text)
    same(padded, plain)
    assert padded.engines == plain.engines
    assert plain.counters and plain.histograms and "running" in plain.gauges  # not a vacuous equality
    same(padded, reference_parse(text))


def test_the_wanted_lines_are_selected_without_a_regular_expression_step_per_line(monkeypatch):
    """Selection splits only the spans of families read and keeps a line by C `startswith`: the regular expression
    over every wanted line (1.3 ms of a DP8 page's 3 ms parse) is gone; the TYPE-line search alone remains."""
    calls = []

    class Spy:
        def __init__(self, pattern):
            self._p = pattern

        def findall(self, *args):
            calls.append(self._p.pattern)
            return self._p.findall(*args)

        def finditer(self, *args):
            return self._p.finditer(*args)

    for name in ("_WANTED_LINE", "_TYPE_LINE"):
        if hasattr(page_mod, name):
            monkeypatch.setattr(page_mod, name, Spy(getattr(page_mod, name)))
    page = parse_text(sim_page(8, seed=8))
    assert page.histograms and page.counters
    assert calls == []
