"""A sample that is no reading (NaN, or a count below 0) costs its own figure on its own page, nothing more.

docs/sampling.md ("What a server may send"): such a sample is left out, the counter or histogram it belongs to
holds its last value on that page, and the rest of the page is read. What must hold around it: it is never kept
as a series' previous value (a restart behind it is still a reset, a series that vanishes after it leaves no NaN
in the corrected sums), a count below 0 is no reading on the full parse and the by-position read alike, a +Inf
bucket that is no reading leaves that histogram stale instead of failing the page, and no rate, per-tick count
or window bucket ever comes out negative.
"""

from __future__ import annotations

import math

import pytest

from lynxtop.agent.metrics.continuity import _CounterWindow, _SeriesCorrection
from lynxtop.agent.metrics.histogram import HistogramSnapshot, SlidingHistogram
from lynxtop.agent.metrics.layout import PageLayout
from lynxtop.agent.metrics.lifetime import ServingTotals
from lynxtop.agent.metrics.page import parse_text
from lynxtop.agent.metrics.scrape import MetricsScraper

GEN = "vllm:generation_tokens_total"
TTFT = "vllm:time_to_first_token_seconds"


def _gen_page(engines: dict[str, str]) -> str:
    """vllm:generation_tokens_total of each engine, its value as written."""
    out = [f"# HELP {GEN} Generation tokens.", f"# TYPE {GEN} counter"]
    out += [f'{GEN}{{engine="{e}",model_name="m"}} {v}' for e, v in engines.items()]
    return "\n".join(out) + "\n"


def _two_engines(gen0: str) -> str:
    """Engine 0's generated tokens as written; engine 1 idle at 1000."""
    return _gen_page({"0": gen0, "1": "1000.0"})


def test_a_series_that_vanishes_after_a_nan_page_leaves_the_sums_readable():
    """Its last good value is what it counted: the corrected sum stays a number, rates and lifetime totals go on."""
    s, totals = MetricsScraper("http://x:1/metrics"), ServingTotals()
    pages = [{"0": "100.0", "1": "100.0"}, {"0": "110.0", "1": "110.0"},
             {"0": "NaN", "1": "120.0"},  # engine 0 unreadable on one page
             {"1": "130.0"}, {"1": "140.0"}, {"1": "150.0"}]  # then gone (scaled down, or restarting)
    rows = []
    for now, p in enumerate(pages):
        rows.append(s.parse_page(_gen_page(p), now=float(now)))
        totals.observe(s)
    assert [r["generation_tokens_per_s"] for r in rows] == [None, 20.0, None, 10.0, 10.0, 10.0]
    assert rows[-1]["generation_tokens"] == 10
    assert totals.models["m"].counters["generation_tokens"] == 60.0  # 20 on the second page, then engine 1 alone
    assert s.bad_values == 1
    offsets = s._corrections.offsets
    assert offsets and all(math.isfinite(v) for v in offsets.values()), offsets


def test_a_restart_behind_a_nan_page_is_a_reset_not_a_negative_rate():
    """5100, NaN, 50: engine 0 restarted and counted 50 since; compared with 5100 held, not with NaN."""
    s = MetricsScraper("http://x:1/metrics")
    for now, v in enumerate(("5000.0", "5100.0", "NaN")):
        s.parse_page(_two_engines(v), now=float(now))
    row = s.parse_page(_two_engines("50.0"), now=3.0)
    assert row["generation_tokens_per_s"] == 25.0  # 50 over the 2 s since the last page it was read on
    assert row["generation_tokens"] == 50
    assert s.reset_series == ("generation_tokens",)


def test_a_restart_behind_a_nan_page_adds_up_as_prometheus_increase():
    """The agent-lifetime total across it is Prometheus' increase(): +100, then 50 counted since the restart, +10."""
    totals, s = ServingTotals(), MetricsScraper("http://x:1/metrics")
    for now, v in enumerate(("5000.0", "5100.0", "NaN", "50.0", "60.0")):
        s.parse_page(_two_engines(v), now=float(now))
        totals.observe(s)
    assert totals.models["m"].counters["generation_tokens"] == 160.0


def _finished_page(v: str) -> str:
    name = "vllm:request_success_total"
    return (f"# TYPE {name} counter\n{name}{{engine=\"0\",finished_reason=\"stop\",model_name=\"m\"}} {v}\n"
            f"{name}{{engine=\"1\",finished_reason=\"stop\",model_name=\"m\"}} 7.0\n")


def test_finished_requests_by_reason_hold_a_nan_series_and_see_the_restart_behind_it():
    """The lifetime count per finished_reason: the NaN page adds nothing, the restart after it adds what it counted."""
    totals, s = ServingTotals(), MetricsScraper("http://x:1/metrics")
    for now, v in enumerate(("5000.0", "5100.0", "NaN", "50.0", "60.0", "NaN", "NaN", "75.0")):
        s.parse_page(_finished_page(v), now=float(now))
        totals.observe(s)
    assert totals.models["m"].finished == {"stop": 175.0}  # 100, then 50, 10 and 15 after the restart


def _ttft_page(b1: str, binf: str, count: str, total: str) -> str:
    """Engine 0's TTFT histogram as written (le=0.1, then le=1.0 and +Inf alike); engine 1 idle at 100 requests."""
    out = [f"# HELP {TTFT} TTFT.", f"# TYPE {TTFT} histogram"]
    for e, (x1, xinf, c, sm) in (("0", (b1, binf, count, total)), ("1", ("100.0", "100.0", "100.0", "1.0"))):
        out.append(f'{TTFT}_bucket{{engine="{e}",le="0.1",model_name="m"}} {x1}')
        out.append(f'{TTFT}_bucket{{engine="{e}",le="1.0",model_name="m"}} {xinf}')
        out.append(f'{TTFT}_bucket{{engine="{e}",le="+Inf",model_name="m"}} {xinf}')
        out.append(f'{TTFT}_count{{engine="{e}",model_name="m"}} {c}')
        out.append(f'{TTFT}_sum{{engine="{e}",model_name="m"}} {sm}')
    out += ["# TYPE vllm:num_requests_running gauge", 'vllm:num_requests_running{engine="0",model_name="m"} 1.0']
    return "\n".join(out) + "\n"


def test_a_restart_behind_a_nan_histogram_page_keeps_the_percentiles_true():
    """Every request took <= 0.1 s: over the window 10 before the restart and 10 after, p99 99 ms (no false breach
    from a bucket delta gone negative, pinned at the top bucket)."""
    s = MetricsScraper("http://x:1/metrics")
    s.parse_page(_ttft_page("1000.0", "1000.0", "1000.0", "50.0"), now=0.0)
    s.parse_page(_ttft_page("1010.0", "1010.0", "1010.0", "50.5"), now=1.0)
    s.parse_page(_ttft_page("NaN", "NaN", "NaN", "NaN"), now=2.0)  # engine 0 unreadable on this page
    row = s.parse_page(_ttft_page("10.0", "10.0", "10.0", "0.5"), now=3.0)  # restarted: 10 new requests
    assert row["ttft_p50_ms"] == pytest.approx(50.0) and row["ttft_p99_ms"] == pytest.approx(99.0)
    assert row["ttft_mean_ms"] == pytest.approx(50.0)  # (0.5 + 0.5) s over 20 requests


def _one_engine_ttft(inf_value: str) -> str:
    return (f"# TYPE {TTFT} histogram\n"
            f'{TTFT}_bucket{{engine="0",le="0.1",model_name="m"}} 3.0\n'
            f'{TTFT}_bucket{{engine="0",le="1.0",model_name="m"}} 5.0\n'
            f'{TTFT}_bucket{{engine="0",le="+Inf",model_name="m"}} {inf_value}\n'
            f'{TTFT}_count{{engine="0",model_name="m"}} 5.0\n'
            f'{TTFT}_sum{{engine="0",model_name="m"}} 1.5\n'
            "# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n')


@pytest.mark.parametrize("inf_value", ["NaN", "+Inf", "-Inf", "1e300", "-1.0"])
def test_a_plus_inf_bucket_that_is_no_reading_leaves_its_histogram_stale_not_the_page_failed(inf_value):
    """One engine, its +Inf bucket no reading: the page is read (no outage), that histogram held at its last value;
    a histogram without any +Inf bucket line is still a malformed page."""
    s = MetricsScraper("http://x:1/metrics")
    assert s.parse_page(_one_engine_ttft("5.0"), now=0.0)["scrape_ok"] == 1
    row = s.parse_page(_one_engine_ttft(inf_value), now=1.0)
    assert row["scrape_ok"] == 1 and not s.in_outage, s.last_error
    assert row["requests_running"] == 3 and s.bad_values == 1
    page = parse_text(_one_engine_ttft(inf_value))
    assert "ttft" in page.stale and page.bad_values == 1
    assert s.parse_page(_one_engine_ttft("6.0"), now=2.0)["ttft_p99_ms"] is not None  # the window went on
    gone = "\n".join(ln for ln in _one_engine_ttft("5.0").splitlines() if 'le="+Inf"' not in ln) + "\n"
    assert s.parse_page(gone, now=3.0)["scrape_ok"] == 0 and "no +Inf bucket" in (s.last_error or "")


@pytest.mark.parametrize("value", ["-5.0", "-1e-300", "-0.5"])
def test_a_count_below_zero_is_no_reading_on_the_full_parse_and_by_position(value):
    """A counter's sample below 0 is no reading (docs/reliability.md): held, counted, no negative rate, no jump in
    the lifetime total; the page read by position is the full parse's (the fast path leaves it to it)."""
    s, totals = MetricsScraper("http://x:1/metrics"), ServingTotals()
    rows = []
    for now, v in enumerate(("5000.0", "5100.0", value, "5200.0")):
        rows.append(s.parse_page(_two_engines(v), now=float(now)))
        totals.observe(s)
    assert rows[2]["scrape_ok"] == 1 and rows[2]["generation_tokens_per_s"] is None
    assert rows[2]["generation_tokens"] is None and s.bad_values == 1
    assert rows[3]["generation_tokens_per_s"] == 50.0 and s.reset_series == ()
    assert totals.models["m"].counters["generation_tokens"] == 200.0
    layout = PageLayout()
    layout.parse(_two_engines("5100.0"))
    assert layout._known(_two_engines("5150.0")) is not None  # laid out as learnt: read by position
    assert layout._known(_two_engines(value)) is None  # ... but not with a count below 0
    page, full = layout.parse(_two_engines(value)), parse_text(_two_engines(value))
    assert page.stale == full.stale == {"generation_tokens"} and page.bad_values == full.bad_values == 1
    assert page.counters == full.counters == {"generation_tokens": 1000.0}


def test_a_gauge_below_zero_is_still_read_as_the_page_gives_it():
    """Only counts are refused below 0: a gauge is read (its column decides: a negative count of requests is NULL)."""
    text = "# TYPE vllm:num_requests_running gauge\n" + 'vllm:num_requests_running{engine="0"} -3.0\n'
    layout = PageLayout()
    layout.parse(text)
    page = layout.parse(text)
    assert page.gauges == parse_text(text).gauges == {"running": -3.0} and page.bad_values == 0


def test_a_series_correction_never_keeps_nan():
    """NaN is never a previous value nor what is added: held at the last good one, left out if it had none."""
    c = _SeriesCorrection()
    assert c.update({"a": 5100.0, "b": 1.0}) == (None, False)
    assert c.update({"a": math.nan, "b": 2.0, "new": math.nan}) == (None, False)
    assert c.update({"b": 3.0}) == ({"a": 5100.0}, False)  # a vanished: what it counted stays counted
    assert c.update({"a": math.nan, "b": 4.0}) == (None, False)  # still gone: nothing to take back
    assert c.update({"a": 50.0, "b": 5.0}) == (None, True)  # back lower: a reset, its 5100 stays added
    assert c.update({"a": math.nan, "b": 6.0}) == (None, False)
    assert c.update({"a": 40.0, "b": 7.0}) == ({"a": 50.0}, True)  # behind the NaN page: compared with 50


def test_a_counter_window_gives_no_negative_rate_or_count():
    """A corrected sum that still went down (a correction missed): no rate and no per-tick count, never below 0."""
    cw = _CounterWindow(60.0, corrected=True)
    cw.add(0.0, 6100.0)
    cw.add(1.0, 1050.0)
    assert cw.last_delta == -5050.0 and cw.rate() is None
    cw.add(2.0, 1060.0)
    assert cw.rate() == 10.0


def test_a_latency_window_never_counts_below_zero():
    """A corrected histogram that still went down: its window's counts are at least 0, no percentile pinned at the
    top bucket and no negative mean."""
    les = (0.1, 1.0, math.inf)
    sh = SlidingHistogram(60.0, corrected=True)
    sh.add(0.0, HistogramSnapshot(tuple(zip(les, (2000.0, 2000.0, 2000.0), strict=True)), 100.0, 2000.0))
    sh.add(1.0, HistogramSnapshot(tuple(zip(les, (1010.0, 1020.0, 1020.0), strict=True)), 50.0, 1020.0))
    window = sh.window()
    assert window is not None and window.buckets == ((0.1, 0.0), (1.0, 0.0), (math.inf, 0.0))
    assert window.count == 0.0
    assert sh.quantile(0.99) is None and sh.mean() is None


def test_a_counter_stale_on_the_first_page_takes_no_zero_baseline_when_first_read():
    """The first page's only sample of a counter is NaN: the next page that reads it finds its total there all
    along (a bad sample hid it), not counted from zero since the first page (it was one tick of 5,000 tokens)."""
    s, totals = MetricsScraper("http://x:1/metrics"), ServingTotals()
    rows = []
    for now, value in enumerate(["NaN", "5000.0", "5010.0", "5030.0"]):
        rows.append(s.parse_page(_gen_page({"0": value}), now=float(now)))
        totals.observe(s)
    assert [r["generation_tokens_per_s"] for r in rows] == [None, None, 10.0, 20.0]
    assert [r["generation_tokens"] for r in rows] == [None, None, 10, 20]
    assert totals.models["m"].counters["generation_tokens"] == 30.0


def test_a_counter_whose_every_sample_is_nan_on_a_page_is_held_not_gone():
    """One engine, one NaN page: the counter is held over that page, not dropped and read again from zero (which
    counted its whole total, 110 tokens, as the next tick's)."""
    s, totals = MetricsScraper("http://x:1/metrics"), ServingTotals()
    rows = []
    for now, value in enumerate(["100.0", "NaN", "110.0", "120.0"]):
        rows.append(s.parse_page(_gen_page({"0": value}), now=float(now)))
        totals.observe(s)
    rates = [r["generation_tokens_per_s"] for r in rows]
    assert rates[0] is None and rates[1] is None and rates[3] == 10.0, rates
    assert rates[2] is not None and rates[2] <= 10.0, rates
    assert rows[2]["generation_tokens"] == 10
    assert totals.models["m"].counters["generation_tokens"] == 20.0
