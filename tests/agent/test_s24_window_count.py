"""The status says how many observations the window's percentiles come from, beside them.

A window holding one request shows a p99 (Prometheus' histogram_quantile does the same): "TTFT p99 2.4 s" at 3 a.m.
read as a tail when it is one request. The status the agent serves carries, per latency series, the `_count`
increase of its histogram over the window (`serving.window_counts`: requests; ITL's: inter-token intervals) and the
window (`serving.window_s`), and the SLA says how many finished requests it judged (`sla.window_requests`).

Real parts: the sampling path's ScrapeSource and the agent's scraper reading the simulator's vLLM 0.32 page from a
real HTTP server; the status built as StatusView builds it (the supervisor's serving status, then the scraper's
figures for the row the ticker holds); the SLA tracker over the same rows; the JSON round trip the dashboard reads.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from support.latency_pages import QUEUEING, LatencyPage
from support.web_app import metrics_app, serving

from lynxtop.agent.metrics.sla import SlaTracker
from lynxtop.agent.sampling import ScrapeSource, ScrapeTarget, Tick
from lynxtop.agent.serving.health import HttpClient
from lynxtop.agent.status_view import with_window_counts
from lynxtop.contract.config import SlaConfig
from lynxtop.contract.records import RecordError
from lynxtop.contract.status import ServingState, ServingStatus, SlaState, SlaStatus, Status

pytestmark = pytest.mark.timeout(120)

SLOW = {**QUEUEING, "ttft_s": 5.0}  # TTFT 5 s: past a 2 s limit


async def _scrape(src: ScrapeSource, lp: LatencyPage, page: list[str], t: float) -> dict[str, Any]:
    page[0] = lp.text()
    rows, _ = await src.sample(Tick(ts_ms=int(t * 1000), t0=t, deadline=time.monotonic() + 20, root=None, run_id=None))
    return rows["serving_row"]


def _status(src: ScrapeSource, row: dict[str, Any] | None, run_id: int = 1, token: str = "run-1") -> ServingStatus:
    """The run's serving status as StatusView builds it: the supervisor's (ready, this run), then the window's
    counts of the row the ticker holds (`row`)."""
    return with_window_counts(ServingStatus(state=ServingState.READY, run_id=run_id), src, token, row)


def test_a_window_of_one_request_says_one_and_more_say_more():
    """One request in the window: its percentiles are there and the status says 1 beside them (TTFT, TPOT, E2E,
    queue; ITL counts its 3 inter-token intervals), through the JSON the dashboard reads; 30 more: 31; a row that is
    not the one the counts belong to (a failed scrape's, an older one) or another run: none said."""
    sla = SlaTracker(SlaConfig(ttft_p99_ms=2000, tpot_p99_ms=150, window_s=60))

    async def go() -> dict[str, Any]:
        lp, page, http = LatencyPage(), [""], HttpClient()
        out: dict[str, Any] = {}
        try:
            async with serving(metrics_app(page)) as url:
                target = [ScrapeTarget(url + "/metrics", 1, "run-1")]
                src = ScrapeSource(http, lambda: target[0], window_s=60, timeout_s=5.0, hang_timeout_s=600.0,
                                   on_new_run=lambda: None, on_verdict=lambda v: None)
                await _scrape(src, lp, page, 1000.0)  # the baseline
                lp.finish(1, SLOW)
                one = await _scrape(src, lp, page, 1001.0)
                sla.update(one, 1_001_000)
                out["one"], out["one_row"], out["one_sla"] = _status(src, one), one, sla.state()
                out["other_run"] = _status(src, one, run_id=2, token="run-2")
                lp.finish(30, SLOW)
                many = await _scrape(src, lp, page, 1002.0)
                sla.update(many, 1_002_000)
                out["many"], out["many_sla"] = _status(src, many), sla.state()
                out["stale_row"] = _status(src, one)  # the ticker still holds the previous page's row
                page[0] = "garbage{ 1"  # a malformed page: a failed row, no percentiles
                rows, _ = await src.sample(Tick(ts_ms=1_003_000, t0=1003.0, deadline=time.monotonic() + 20,
                                                root=None, run_id=None))
                out["failed_row"] = rows["serving_row"]
                out["failed"] = _status(src, rows["serving_row"])
                src.close()
        finally:
            await http.close()
        return out

    out = asyncio.run(go())
    one: ServingStatus = out["one"]
    assert out["one_row"]["ttft_p99_ms"] is not None and out["one_row"]["e2e_p99_ms"] is not None  # a p99 of one
    assert one.window_counts == {"ttft": 1, "itl": 3, "tpot": 1, "e2e": 1, "queue": 1, "prefill": 1, "decode": 1}, \
        one.window_counts
    assert one.window_s == 60.0
    assert one.window_count("ttft") == 1 and one.window_count("nonesuch") is None
    back = Status.from_json(Status(serving=one).to_json()).serving
    assert back.window_counts == one.window_counts and back.window_s == 60.0
    many: ServingStatus = out["many"]
    assert many.window_count("ttft") == 31 and many.window_count("e2e") == 31 and many.window_count("itl") == 93
    assert out["other_run"].window_counts == {} and out["other_run"].window_s is None
    assert out["stale_row"].window_counts == {}, "counts of a newer page beside an older page's percentiles"
    assert out["failed_row"]["scrape_ok"] == 0 and out["failed"].window_counts == {}
    # the SLA: one slow request is no breach (too few for a tail) and the status says how many it judged
    one_sla: SlaStatus = out["one_sla"]
    assert one_sla.state == SlaState.UNKNOWN and one_sla.ttft_p99_ms is not None and one_sla.ttft_p99_ms > 2000
    assert one_sla.window_requests == 1
    assert SlaStatus.from_json(one_sla.to_json()).window_requests == 1
    many_sla: SlaStatus = out["many_sla"]
    assert many_sla.state == SlaState.BREACH and many_sla.window_requests == 31


def test_the_window_empties_to_zero_once_its_requests_age_out():
    """Requests older than the window are out of it: the count reads 0, the percentiles none."""

    async def go() -> tuple[dict[str, Any], ServingStatus]:
        lp, page, http = LatencyPage(), [""], HttpClient()
        try:
            async with serving(metrics_app(page)) as url:
                src = ScrapeSource(http, lambda: ScrapeTarget(url + "/metrics", 1, "run-1"), window_s=60,
                                   timeout_s=5.0, hang_timeout_s=600.0, on_new_run=lambda: None,
                                   on_verdict=lambda v: None)
                await _scrape(src, lp, page, 1000.0)
                lp.finish(5, QUEUEING)
                await _scrape(src, lp, page, 1001.0)
                await _scrape(src, lp, page, 1070.0)
                row = await _scrape(src, lp, page, 1071.0)
                st = _status(src, row)
                src.close()
                return row, st
        finally:
            await http.close()

    row, st = asyncio.run(go())
    assert row["ttft_p99_ms"] is None
    assert st.window_count("ttft") == 0 and st.window_count("e2e") == 0


def test_an_older_agents_status_has_no_counts_and_odd_values_are_dropped():
    """No field (an agent older than it): no counts, no window; a count that is no count is left out (never shown
    as one); a field of another JSON type is an agent this version cannot read, named."""
    old = Status.from_json({"serving": {"state": "ready"}, "sla": {"state": "ok"}})
    assert old.serving.window_counts == {} and old.serving.window_s is None and old.sla.window_requests is None
    assert old.serving.window_count("ttft") is None
    odd = ServingStatus.from_json({"state": "ready", "window_counts": {"ttft": "12", "e2e": -1, "tpot": True,
                                                                       "itl": 3.0, "queue": 2.5, "decode": 1e400,
                                                                       "prefill": 7, "ttft_x": 2**64,
                                                                       "e2e_x": 2.0**60}})
    assert odd.window_counts == {"itl": 3, "prefill": 7}, odd.window_counts
    with pytest.raises(RecordError, match="window_counts"):
        ServingStatus.from_json({"state": "ready", "window_counts": [1, 2]})
