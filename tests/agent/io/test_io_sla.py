"""SLA: one event per breach and per recovery (`sla.breach`, `sla.recovered`), with the worst values seen; state
for the status object."""

from __future__ import annotations

from agent_io_helpers import VllmPage

from lynxtop.agent.metrics.scrape import MetricsScraper
from lynxtop.agent.metrics.sla import MIN_REQUESTS, SlaTracker
from lynxtop.contract.config import SlaConfig
from lynxtop.contract.events import Event


def row(ttft=None, tpot=None, itl=None):
    # requests enough for a tail: no breach opens on fewer, nor on a count unknown (test_s25_sla_counts.py)
    return {"ttft_p99_ms": ttft, "tpot_p99_ms": tpot, "itl_p99_ms": itl, "requests_finished": MIN_REQUESTS}


def test_breach_and_recovery_events_carry_worst_values():
    sla = SlaTracker(SlaConfig(ttft_p99_ms=2000, tpot_p99_ms=150, window_s=60))
    assert sla.state().state == "unknown"
    assert sla.update(row(500, 40), 1_000) == []
    assert sla.state().state == "ok" and sla.state().since_ms == 1_000

    events = sla.update(row(3200, 40), 2_000)
    assert [e.kind for e in events] == ["sla.breach"]
    assert events[0].severity == "warning"
    assert "TTFT 3.20 s > 2.00 s" in events[0].message
    assert events[0].details["worst_ttft_p99_ms"] == 3200

    # still breached, worse, and TPOT joins: no new event, worst values tracked
    assert sla.update(row(5100, 180), 3_000) == []
    assert sla.update(row(4000, 160), 4_000) == []
    st = sla.state()
    assert st.state == "breach" and st.since_ms == 2_000
    assert st.breached == ("tpot", "ttft")
    assert st.worst_ttft_p99_ms == 5100 and st.worst_tpot_p99_ms == 180
    assert st.ttft_p99_ms == 4000 and st.ttft_threshold_ms == 2000 and st.window_s == 60

    events = sla.update(row(900, 60), 9_000)
    assert [e.kind for e in events] == ["sla.recovered"]
    ev = events[0]
    assert ev.details["worst_ttft_p99_ms"] == 5100 and ev.details["worst_tpot_p99_ms"] == 180
    assert ev.details["duration_s"] == 7.0
    assert "5.10 s" in ev.message and "180 ms" in ev.message
    assert sla.state().state == "ok" and sla.state().breached == ()


def test_no_data_is_unknown_and_ends_an_open_breach():
    sla = SlaTracker(SlaConfig())
    sla.update(row(None, 500), 0)
    assert sla.state().state == "breach"
    events = sla.update(None, 60_000)
    assert [e.kind for e in events] == ["sla.unknown"]
    assert "no latency data" in events[0].message
    assert sla.state().state == "unknown"
    assert sla.update(None, 61_000) == []


def test_itl_stands_in_for_tpot_on_old_vllm():
    sla = SlaTracker(SlaConfig(tpot_p99_ms=100))
    events = sla.update(row(100, None, itl=250), 0)
    assert events and "ITL (as TPOT) 250 ms > 100 ms" in events[0].message
    assert sla.state().tpot_source == "itl" and sla.state().tpot_p99_ms == 250


def test_thresholds_from_config_are_respected():
    sla = SlaTracker(SlaConfig(ttft_p99_ms=5000, tpot_p99_ms=300))
    assert sla.update(row(4999, 299), 0) == []
    assert sla.state().state == "ok"
    assert sla.update(row(5001, 10), 1) != []


def test_breach_stays_open_across_a_counter_reset_until_the_slow_requests_leave_the_window():
    """The issue's trial: TTFT p99 at 17.5 s, vLLM restarts behind the agent (same run, same URL) and serves
    nothing for a while, then fast requests. Real pages through the real scraper: the breach stays open while
    the window (60 s) still holds the slow requests' increases, and ends "back within thresholds" when they leave
    it. Before the fix the window started over at the reset and the breach closed at once, "no latency data"."""
    s = MetricsScraper("http://x:1", window_s=60)
    sla = SlaTracker(SlaConfig(ttft_p99_ms=2000, tpot_p99_ms=150, window_s=60))
    page = VllmPage(engines=2)
    events: list[tuple[int, Event]] = []
    for t in range(0, 150, 5):
        if t == 35:
            page = VllmPage(engines=2)  # restarted: every series from zero, nothing served yet
        elif 0 < t <= 30 or t >= 50:
            for e in (0, 1):
                for i in range(20):
                    page.ttft.labels(*page.lab(e)).observe(17.5 if t <= 30 and i < 4 else 0.05)
                    page.success.labels(*page.lab(e), "stop").inc()  # each a finished request
        events += [(t, ev) for ev in sla.update(s.parse_page(page.text(), now=float(t)), t * 1000)]
        if 5 <= t < 90:
            assert sla.state().state == "breach", t
    assert s.resets == 1
    assert [(t, ev.kind) for t, ev in events] == [(5, "sla.breach"), (90, "sla.recovered")]
    assert events[1][1].details["reason"] == "back within thresholds"
    assert events[1][1].details["duration_s"] == 85.0
    assert sla.state().state == "ok"


def test_unreadable_page_while_vllm_restarts_holds_the_breach_for_one_window():
    """vLLM restarts behind the agent the usual way: /metrics refuses for a few scrapes, then comes back with every
    counter reset. The breach is held through the failed scrapes (the window still holds the slow requests) and
    ends once, "back within thresholds", when they leave the window. An outage longer than the window ends it
    with "no latency data". Before the fix the first failed scrape closed the breach and the reset reopened it."""
    s = MetricsScraper("http://x:1", window_s=60)
    sla = SlaTracker(SlaConfig(ttft_p99_ms=2000, tpot_p99_ms=150, window_s=60))
    page = VllmPage(engines=2)
    events: list[tuple[int, Event]] = []
    for t in range(0, 150, 5):
        if 35 <= t <= 45:
            row = s.failed(float(t), "cannot read http://x:1/metrics: connection refused")
            page = VllmPage(engines=2)
        else:
            if t > 0:
                for e in (0, 1):
                    for i in range(20):
                        page.ttft.labels(*page.lab(e)).observe(17.5 if t <= 30 and i < 4 else 0.05)
                        page.success.labels(*page.lab(e), "stop").inc()  # each a finished request
                    page.success.labels(*page.lab(e), "stop").inc()  # each a finished request
            row = s.parse_page(page.text(), now=float(t))
        events += [(t, ev) for ev in sla.update(row, t * 1000)]
        if 5 <= t < 90:
            assert sla.state().state == "breach", t
    assert s.resets == 1
    assert [(t, ev.kind) for t, ev in events] == [(5, "sla.breach"), (90, "sla.recovered")]
    assert events[1][1].details["reason"] == "back within thresholds"

    # an outage that outlasts the window: the breach ends "no latency data" one window after the last reading
    sla = SlaTracker(SlaConfig(ttft_p99_ms=2000, window_s=60))
    assert [e.kind for e in sla.update({"ttft_p99_ms": 9000.0, "requests_finished": MIN_REQUESTS}, 0)] == ["sla.breach"]
    failed = {"scrape_ok": 0, "ttft_p99_ms": None, "tpot_p99_ms": None}
    assert all(sla.update(failed, ms) == [] for ms in range(5_000, 60_000, 5_000))
    assert sla.state().state == "breach"
    events = sla.update(failed, 60_000)
    assert [e.kind for e in events] == ["sla.unknown"] and "no latency data" in events[0].message
    # a missing row (serving not ready) still ends it at once, as before
    sla.update({"ttft_p99_ms": 9000.0, "requests_finished": MIN_REQUESTS}, 0)
    assert [e.kind for e in sla.update(None, 1_000)] == ["sla.unknown"]


def test_a_p99_over_too_few_requests_opens_no_breach_until_the_window_holds_enough():
    # the first requests after READY pay for warm-up: a p99 over three of them is one slow request, not a tail
    sla = SlaTracker(SlaConfig(ttft_p99_ms=2000, window_s=60))
    slow = {"ttft_p99_ms": 9000, "tpot_p99_ms": 40, "requests_finished": 1}
    assert [sla.update(slow, ts) for ts in (1_000, 2_000, 3_000)] == [[], [], []]
    assert sla.state().state == "unknown" and sla.requests_in_window() == 3
    events = sla.update({**slow, "requests_finished": MIN_REQUESTS}, 4_000)
    assert [e.kind for e in events] == ["sla.breach"] and sla.state().state == "breach"
    # an open breach is still judged on few requests: it ends when the p99 is back under the limit
    assert [e.kind for e in sla.update({**slow, "ttft_p99_ms": 500, "requests_finished": 0}, 5_000)] == [
        "sla.recovered"]


def test_requests_leave_the_count_with_the_window():
    sla = SlaTracker(SlaConfig(window_s=60))
    sla.update({"ttft_p99_ms": 100, "requests_finished": 50}, 0)
    sla.update({"ttft_p99_ms": 100, "requests_finished": 2}, 30_000)
    assert sla.requests_in_window() == 52
    sla.update({"ttft_p99_ms": 100, "requests_finished": 1}, 61_000)
    assert sla.requests_in_window() == 3


def test_the_count_kept_as_rows_come_and_go_is_the_window_sum_over_any_rows_and_a_reset():
    # the sum is kept as rows enter and leave (no walk over the window each row): it must always be the walk's
    import random

    rng = random.Random(29)
    sla = SlaTracker(SlaConfig(window_s=5))
    seen: list[tuple[int, int]] = []
    ts = 0
    for step in range(600):
        ts += rng.choice((0, 300, 1000, 2500, 7000))
        n = rng.choice((0, 1, 3, 250, None, -1, True, 2.0))  # only non-negative ints count
        sla.update({"ttft_p99_ms": 100, "requests_finished": n}, ts)
        if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
            seen.append((ts, n))
        seen = [(t, k) for t, k in seen if t > ts - 5000]
        assert sla.requests_in_window() == (sum(k for _, k in seen) if seen else None), step
        if step == 300:
            sla.reset()
            seen = []
            assert sla.requests_in_window() is None
