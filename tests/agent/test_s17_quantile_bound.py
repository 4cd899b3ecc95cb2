"""A percentile that falls in its histogram's lowest bucket is only known to be at or below that bucket's bound.

Interpolating from 0 (as `histogram_quantile` does) made it up: with no queueing at all, vLLM's queue-time histogram
(lowest bound 0.3 s) read p50 150 ms and p99 297 ms. The agent keeps those numbers (Grafana computes the same ones)
and serves, beside them, the lowest bucket's bound of each series (`{series}_lowest_bucket_ms`), so every reader
can tell a bound from a figure; the SLA never judges a p99 it only knows as "below a bound over the threshold".
"""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.latency_pages import IDLE_FAST, QUEUEING, LatencyPage, scraped_row
from support.node import close_node, open_node, run_clock
from support.status import make_status
from support.web_app import serving

from lynxtop.agent.metrics.exporter import SnapshotCollector
from lynxtop.agent.metrics.scrape import MetricsScraper
from lynxtop.agent.metrics.sla import SlaTracker
from lynxtop.agent.sampling import ScrapeTarget
from lynxtop.contract.config import SlaConfig
from lynxtop.contract.quantile import fmt_quantile, quantile_bound
from lynxtop.contract.status import Status

pytestmark = pytest.mark.timeout(90)


async def test_the_served_status_carries_the_lowest_bucket_bound_of_a_page_with_nothing_queued(tmp_path, h):
    page = LatencyPage()
    hits = [0]

    async def metrics(_request: web.Request) -> web.Response:
        hits[0] += 1
        if hits[0] == 2:  # the requests finish between the first and the second scrape
            page.finish(40, IDLE_FAST)
        return web.Response(text=page.text())

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with serving(app) as url:
        node = open_node(h.write_config(tmp_path, 'sample_interval_s = 0.1\nscrape_interval_s = 0.2\n'
                                                  'fake_nvml = "h200x8"'))
        assert node.scrape_source is not None
        node.scrape_source.target = lambda: ScrapeTarget(url, None, "run-1")
        try:
            await run_clock(node, 20, until=lambda: node.status().serving_metrics.metric("queue_p50_ms") is not None)
            # the status as GET /v1/status serves it, read back as a client reads it
            st = Status.from_json(json.loads(json.dumps(node.status().to_json())))
        finally:
            close_node(node)
    m = st.serving_metrics.metric
    assert m("queue_mean_ms") == 0.0  # nothing queued
    assert m("queue_p50_ms") == pytest.approx(150.0) and m("queue_p99_ms") == pytest.approx(297.0)  # kept as before
    assert m("queue_lowest_bucket_ms") == 300.0 and m("e2e_lowest_bucket_ms") == 300.0
    assert m("ttft_lowest_bucket_ms") == 1.0 and m("tpot_lowest_bucket_ms") == 10.0
    assert quantile_bound(m("queue_p50_ms"), m("queue_lowest_bucket_ms")) == 300.0
    assert fmt_quantile(m("queue_p50_ms"), m("queue_lowest_bucket_ms")) == "<300 ms"
    assert fmt_quantile(m("queue_p99_ms"), m("queue_lowest_bucket_ms")) == "<300 ms"
    # the SLA's p99s carry the bound of the histogram they come from
    assert st.sla.ttft_lowest_bucket_ms == 1.0 and st.sla.tpot_lowest_bucket_ms == 10.0
    assert fmt_quantile(st.sla.ttft_p99_ms, st.sla.ttft_lowest_bucket_ms) == "<1.0 ms"


def test_real_queueing_keeps_the_interpolated_figure():
    row = scraped_row(QUEUEING)
    assert row["queue_lowest_bucket_ms"] == 300.0
    assert 500 < row["queue_p50_ms"] < 800 and quantile_bound(row["queue_p50_ms"], 300.0) is None
    assert fmt_quantile(row["queue_p50_ms"], row["queue_lowest_bucket_ms"]) == "650 ms"
    assert fmt_quantile(row["queue_p99_ms"], row["queue_lowest_bucket_ms"]) == "797 ms"
    # a series whose p50 is in the lowest bucket and p99 above it: the p50 is a bound, the p99 a figure
    page, scraper = LatencyPage(), MetricsScraper("http://127.0.0.1:8000")
    scraper.parse_page(page.text(), now=0.0)
    page.finish(90, IDLE_FAST)
    page.finish(10, QUEUEING)
    row = scraper.parse_page(page.text(), now=1.0)
    assert fmt_quantile(row["queue_p50_ms"], row["queue_lowest_bucket_ms"]) == "<300 ms"
    assert fmt_quantile(row["queue_p99_ms"], row["queue_lowest_bucket_ms"]) == "770 ms"


def test_no_bound_without_percentiles_nor_for_a_histogram_with_one_finite_bucket():
    row = scraped_row(IDLE_FAST, n=0)  # an idle window: no percentiles, no bound either
    assert row["queue_p50_ms"] is None and row["queue_lowest_bucket_ms"] is None
    # one finite bucket: a rank in +Inf also answers its bound, which is then a lower bound, never an upper one
    scraper = MetricsScraper("http://127.0.0.1:8000")
    lines = "\n".join(['# TYPE vllm:request_queue_time_seconds histogram',
                       'vllm:request_queue_time_seconds_bucket{le="0.3"} 0',
                       'vllm:request_queue_time_seconds_bucket{le="+Inf"} %d',
                       'vllm:request_queue_time_seconds_sum %d', 'vllm:request_queue_time_seconds_count %d', ""])
    scraper.parse_page(lines % (0, 0, 0), now=0.0)
    row = scraper.parse_page(lines % (10, 50, 10), now=1.0)
    assert row["queue_p99_ms"] == 300.0 and row["queue_lowest_bucket_ms"] is None


def test_a_p99_in_the_lowest_bucket_never_breaches_a_threshold_above_its_bound():
    row = scraped_row(IDLE_FAST)
    sla = SlaTracker(SlaConfig(ttft_p99_ms=1.0, tpot_p99_ms=10.0, window_s=60))  # thresholds at the bounds
    assert sla.update(row, 1000) == [] and sla.state().state == "ok"


def test_a_threshold_below_the_lowest_bound_cannot_judge_a_p99_in_that_bucket():
    """TPOT 4 ms against a 5 ms limit: vLLM's lowest TPOT bucket is 10 ms, and the interpolated 9.9 ms opened a
    breach of a server well within its limit. Such a p99 is not judged: the TTFT alone decides (ok here), and with
    neither judged the state is unknown, never a breach."""
    row = scraped_row(IDLE_FAST)
    assert row["tpot_p99_ms"] == pytest.approx(9.9)
    sla = SlaTracker(SlaConfig(ttft_p99_ms=2000, tpot_p99_ms=5.0, window_s=60))
    assert sla.update(row, 1000) == [] and sla.state().state == "ok"
    assert sla.state().tpot_p99_ms == pytest.approx(9.9) and sla.state().tpot_lowest_bucket_ms == 10.0
    sla = SlaTracker(SlaConfig(ttft_p99_ms=0.5, tpot_p99_ms=5.0, window_s=60))
    assert sla.update(row, 1000) == [] and sla.state().state == "unknown"
    # a breach on real figures that falls into the lowest bucket is no longer judged, not "recovered"
    slow = scraped_row({**IDLE_FAST, "tpot_s": 0.03})
    sla = SlaTracker(SlaConfig(ttft_p99_ms=0.5, tpot_p99_ms=5.0, window_s=60))
    assert [e.kind for e in sla.update(slow, 1000)] == ["sla.breach"]
    events = sla.update(row, 2000)
    assert [e.kind for e in events] == ["sla.unknown"] and "lowest bucket" in events[0].message
    assert sla.state().state == "unknown"


def test_the_exporter_gives_each_lowest_bound_beside_the_percentile_gauges():
    row = scraped_row(IDLE_FAST)
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(lambda: make_status(metrics=row)))
    page = {s.name: s.value for fam in text_string_to_metric_families(generate_latest(reg).decode())
            for s in fam.samples}
    assert page["lynxtop_serving_queue_p50_seconds"] == pytest.approx(0.15)
    assert page["lynxtop_serving_queue_lowest_bucket_seconds"] == pytest.approx(0.3)
    assert page["lynxtop_serving_ttft_lowest_bucket_seconds"] == pytest.approx(0.001)
