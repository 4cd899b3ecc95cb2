r"""A label is read only where a label pair starts: no label value can pass for another label.

A label value may hold any text but a raw quote, a raw backslash or a newline: `,engine=`, `{le=` or `\",engine=\"`
are legal values. Reading `engine`, `le`, `model_name` or `finished_reason` by searching the series' text found such
text inside another label's value (`{model_name=",engine=",engine="0"}` read engine ",engine="), so an engine's load
went to a made-up engine, a valid histogram page was refused, the engine cap was dodged or tripped, and the lifetime
totals carried the wrong model and finish reason. Every figure here is checked against prometheus_client's parser
(the reference) on pages whose other labels hold such values, in any order, with spaces and a trailing comma.
"""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lynxtop.agent.metrics import page as page_mod
from lynxtop.agent.metrics import promtext
from lynxtop.agent.metrics.layout import PageLayout
from lynxtop.agent.metrics.lifetime import ServingTotals
from lynxtop.agent.metrics.page import PageError, parse_text
from lynxtop.agent.metrics.scrape import MetricsScraper


def crafted(name: str) -> list[str]:
    """Values (as a page writes them, between the quotes) that hold text a search for label `name` could find."""
    return [
        f",{name}=",
        f"{{{name}=",
        f", {name} = ",
        f',{name}=\\"9\\"',
        f'\\",{name}=\\"',
        "a\\\\",
        f'\\\\\\",{name}=',
        f"\\n,{name}=",
        f"x,{name}=\\\\",
    ]


def blocks(name: str, value: str) -> list[str]:
    """Label blocks giving label `name` the value `value` (as written) beside crafted values, in several layouts:
    before and after it, with spaces around `=` and `,`, with a trailing comma, two crafted labels."""
    out = []
    for i, v in enumerate(crafted(name)):
        out += [
            f'{{model_x="{v}",{name}="{value}"}}',
            f'{{ model_x = "{v}" , {name} = "{value}" }}',
            f'{{model_x="{v}",{name}="{value}",}}',
            f'{{{name}="{value}",model_x="{v}"}}',
            f'{{a{i}="{v}",b="{v}",{name}="{value}",c="{v}"}}',
        ]
    return out


def reference(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Each sample of `text` as prometheus_client reads it: (name, labels, value)."""
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


# ------------------------------------------------------------------------------------------ engines


def engine_page(n_blocks: list[str], scale: float = 1.0) -> str:
    """The three per-engine gauges, one series per block (engine written `e<n>`), values that tell them apart."""
    out = []
    for fam in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        out.append(f"# TYPE {fam} gauge\n")
        out += [f"{fam}{b} {scale * (n + 1) / 1000}\n" for n, b in enumerate(n_blocks)]
    return "".join(out)


def reference_engines(text: str) -> dict[str, dict[str, float]]:
    """Per engine label: running and waiting summed, kv_usage the max, from prometheus_client's reading."""
    keys = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting",
            "vllm:kv_cache_usage_perc": "kv_usage"}
    out: dict[str, dict[str, float]] = {}
    for name, labels, value in reference(text):
        per = out.setdefault(labels.get("engine", ""), {})
        key = keys[name]
        if key == "kv_usage":
            per[key] = max(per.get(key, -math.inf), value)
        else:
            per[key] = per.get(key, 0.0) + value
    return out


def test_each_engine_gets_its_own_load_whatever_its_other_labels_hold():
    """`{model_x=",engine=",engine="e0"}` is engine e0: its load is not put on an engine named ",engine="."""
    bs = [b.replace('"ENGINE"', f'"e{i}"') for i, b in enumerate(blocks("engine", "ENGINE"))]
    want = reference_engines(engine_page(bs))
    assert len(want) == len(bs)  # one engine per series: the reference reads them apart
    layout = PageLayout()
    for scale in (1.0, 2.0):  # the first page through the full parse, the next through its plan
        text = engine_page(bs, scale)
        want = reference_engines(text)
        assert parse_text(text).engines == want
        assert layout.parse(text).engines == want
    s = MetricsScraper("http://x:1/metrics")
    row = s.parse_page(engine_page(bs), now=0.0)
    assert row["scrape_ok"] == 1, s.last_error
    assert {e["engine"] for e in s.engines} == set(reference_engines(engine_page(bs)))


def test_an_engine_label_with_quotes_and_backslashes_is_read_at_its_pair():
    r"""Engine values holding `\"`, `\\` and `\n` beside crafted labels: read as prometheus_client reads them."""
    values = ['a\\"b', 'x\\\\y\\nz', ',engine=\\"', "\\\\"]
    bs = [f'{{model_x=",engine=",engine="{v}"}}' for v in values]
    text = engine_page(bs)
    want = reference_engines(text)
    assert set(want) == {'a"b', "x\\y\nz", ',engine="', "\\"}
    assert parse_text(text).engines == want


# ------------------------------------------------------------------------------------------ engine cap


def test_a_page_past_the_engine_cap_is_refused_whatever_its_other_labels_hold():
    """1100 engines, each series with `model_x=",engine="` before its engine: over MAX_ENGINES, refused (a
    search read one engine ",engine=" and let the page through)."""
    n = page_mod.MAX_ENGINES + 76
    text = "# TYPE vllm:num_requests_running gauge\n" + "".join(
        f'vllm:num_requests_running{{cap_x=",engine=",engine="{e}"}} 1\n' for e in range(n))
    assert len({labels["engine"] for _, labels, _ in reference(text)}) == n
    page_mod._PLANS.clear()
    with pytest.raises(PageError, match="engine label values"):
        parse_text(text)
    # refused before its lines were read: no cache keeps its keys (docs/sampling.md "Caps")
    assert not any(k.startswith('vllm:num_requests_running{cap_x=') for k in page_mod._KNOWN)


def test_one_engine_is_not_taken_for_many_by_its_other_labels():
    """One engine, 1100 series told apart by a label named after a crafted one: one engine, read (a search
    counted each `,b<n>=` as an engine and refused the page)."""
    n = page_mod.MAX_ENGINES + 76
    text = "# TYPE vllm:num_requests_running gauge\n" + "".join(
        f'vllm:num_requests_running{{a=",engine=",b{i}="x",engine="0"}} 1\n' for i in range(n))
    assert {labels["engine"] for _, labels, _ in reference(text)} == {"0"}
    page_mod._PLANS.clear()
    page = parse_text(text)
    assert page.engines == {"0": {"running": float(n)}}
    assert page.gauges["running"] == float(n)


# ------------------------------------------------------------------------------------------ le


BOUNDS = ("0.01", "0.1", "1.0", "+Inf")


def hist_page(lead: str, counts: dict[str, tuple[float, ...]], name: str = "vllm:time_to_first_token_seconds") -> str:
    """A histogram whose bucket lines put `lead` (labels as written, crafted) before `le`; per engine its
    cumulative counts for BOUNDS."""
    out = [f"# TYPE {name} histogram\n"]
    for e, cs in counts.items():
        for le, c in zip(BOUNDS, cs, strict=True):
            out.append(f'{name}_bucket{{{lead}engine="{e}",le="{le}"}} {c}\n')
        out.append(f'{name}_count{{{lead}engine="{e}"}} {cs[-1]}\n')
        out.append(f'{name}_sum{{{lead}engine="{e}"}} {cs[-1] / 2}\n')
    return "".join(out)


def reference_buckets(text: str) -> tuple[tuple[float, float], ...]:
    per: dict[float, float] = {}
    for name, labels, value in reference(text):
        if name.endswith("_bucket"):
            le = float(labels["le"])
            per[le] = per.get(le, 0.0) + value
    return tuple(sorted(per.items()))


LEADS = [f'model_x="{v}",' for v in crafted("le")] + [f' model_x = "{v}" , ' for v in crafted("le")]


@pytest.mark.parametrize("lead", LEADS)
def test_histogram_buckets_are_read_by_their_le_pair(lead: str):
    """`{model_x=",le=",engine="0",le="0.1"}` is the 0.1 bucket: the page is read, each bucket where it belongs
    (a search read le ",le=", not a number, and refused the whole page)."""
    text = hist_page(lead, {"0": (1, 2, 3, 4), "1": (0, 5, 5, 7)})
    want = reference_buckets(text)
    assert want == ((0.01, 1.0), (0.1, 7.0), (1.0, 8.0), (math.inf, 11.0))
    assert parse_text(text).histograms["ttft"].buckets == want
    assert PageLayout().parse(text).histograms["ttft"].buckets == want


def test_a_histogram_past_the_bucket_cap_is_left_out_whatever_its_other_labels_hold():
    """1001 bounds, each line with `model_x=",le="` before `le`: that histogram is left out over MAX_BUCKETS, the
    rest of the page read (a search read one bound ",le=" for all of them)."""
    n = page_mod.MAX_BUCKETS + 1
    name = "vllm:time_to_first_token_seconds"
    text = (f"# TYPE {name} histogram\n"
            + "".join(f'{name}_bucket{{model_x=",le=",le="{i}.0"}} {i}\n' for i in range(n))
            + f'{name}_bucket{{model_x=",le=",le="+Inf"}} {n}\n'
            + "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n")
    page = parse_text(text)
    assert "ttft" not in page.histograms
    assert any("buckets, over the cap" in r for r in page.refused), page.refused
    assert page.gauges["running"] == 3.0
    # left out before its lines were read: no cache keeps its keys (docs/sampling.md "Caps")
    assert not any(k.startswith(f'{name}_bucket{{model_x=",le=",le="') for k in page_mod._KNOWN)


def test_a_bucket_reset_is_corrected_at_its_own_le():
    """An engine's buckets go down (its vLLM restarted): each bucket's correction is added at its own bound,
    as on the same pages without crafted labels (a search put the correction at bound NaN: lost)."""
    before = {"0": (1.0, 2.0, 3.0, 4.0), "1": (5.0, 6.0, 7.0, 8.0)}
    after = {"0": (2.0, 3.0, 4.0, 5.0), "1": (0.0, 1.0, 1.0, 1.0)}  # engine 1 restarted
    got = []
    for lead in ('model_x=",le=",', 'model_x="plain",'):
        s = MetricsScraper("http://x:1/metrics")
        for now, counts in enumerate((before, after)):
            row = s.parse_page(hist_page(lead, counts), now=float(now))
            assert row["scrape_ok"] == 1, s.last_error
        assert s.totals is not None
        got.append(s.totals[2]["ttft"].buckets)
    assert got[0] == got[1] == ((0.01, 7.0), (0.1, 10.0), (1.0, 12.0), (math.inf, 14.0))


# ------------------------------------------------------------------------------------------ model, reason


def lifetime_page(lead: str, v: float) -> str:
    """A counter and request_success_total whose `model_name` and `finished_reason` come after crafted labels."""
    return ("# TYPE vllm:generation_tokens_total counter\n"
            f'vllm:generation_tokens_total{{{lead}engine="0",model_name="m"}} {v}\n'
            "# TYPE vllm:request_success_total counter\n"
            f'vllm:request_success_total{{{lead}engine="0",finished_reason="stop",model_name="m"}} {v}\n'
            f'vllm:request_success_total{{{lead}engine="0",finished_reason="length",model_name="m"}} {2 * v}\n')


LIFETIME_LEADS = [f'x="{v}",' for v in crafted("model_name") + crafted("finished_reason")]


@pytest.mark.parametrize("lead", LIFETIME_LEADS)
def test_lifetime_totals_read_model_and_finished_reason_at_their_pairs(lead: str):
    """The exporter's lifetime totals are keyed by the model and finish reason prometheus_client reads, whatever
    the labels before them hold (a search read `,model_name=` as the model, `,finished_reason=` as the reason)."""
    labels = [lab for name, lab, _ in reference(lifetime_page(lead, 1.0)) if name == "vllm:request_success_total"]
    assert {lab["model_name"] for lab in labels} == {"m"}
    assert {lab["finished_reason"] for lab in labels} == {"stop", "length"}
    s, totals = MetricsScraper("http://x:1/metrics"), ServingTotals()
    for now, v in enumerate((1.0, 5.0)):
        row = s.parse_page(lifetime_page(lead, v), now=float(now))
        assert row["scrape_ok"] == 1, s.last_error
        totals.observe(s)
    assert list(totals.models) == ["m"]
    assert totals.models["m"].finished == {"stop": 4.0, "length": 8.0}
    assert totals.models["m"].counters["generation_tokens"] == 4.0


# ------------------------------------------------------------------------------------------ differential


def differential_blocks() -> list[str]:
    out = []
    for name in ("engine", "le", "model_name", "finished_reason"):
        for value in ("0", "", ',engine=\\"1\\"', "\\\\", "a\\nb", "+Inf", f",{name}="):
            out += blocks(name, value)
    out += ["{}", '{a="1"}', '{a="1",}', '{ a = "1" }', '{a="1",\tb="2"}', '{a="",b=""}', '{a="}",b="{"}']
    return out


def test_the_label_parse_agrees_with_prometheus_client():
    """Every label of ~1300 crafted blocks, read by the agent's pair walk and by its per-label readers: what
    prometheus_client's parser reads, value for value (escapes read once)."""
    checked = 0
    for block in differential_blocks():
        ((_, want, _),) = reference(f"vllm:x{block} 1\n")
        key = f"vllm:x{block}"
        assert promtext.labels_of(key) == want, block
        for name in ("engine", "le", "model_name", "finished_reason", "model_x", "a", "b", "c", "a0"):
            assert promtext.label_value(key, name) == want.get(name), (block, name)
        checked += 1
    assert checked > 1000


@pytest.mark.parametrize("block", ['{a="1" b="2"}', '{a="1",,}', '{a=1}', '{a="1"', '{"a"="1"}', '{a="x"y"}'])
def test_labels_that_are_not_prometheus_text_are_refused_by_the_pair_walk(block: str):
    with pytest.raises(promtext.SampleError):
        promtext.labels_of(f"vllm:x{block}")
