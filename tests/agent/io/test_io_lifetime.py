"""The exporter's agent-lifetime counters and histograms (agent/metrics/lifetime.py) across vLLM restarts and new
runs, read back from the page the exporter serves, against the observations made on real prometheus_client
registries."""

from __future__ import annotations

import math

import pytest
from agent_io_helpers import TTFT_BUCKETS, FakeController, VllmPage
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lynxtop.agent.metrics.exporter import SnapshotCollector
from lynxtop.agent.metrics.lifetime import ServingTotals
from lynxtop.agent.metrics.scrape import MetricsScraper

MODEL = "deepseek-ai/DeepSeek-V4.1"


class Expected:
    """What the agent has seen happen since it started: TTFT observations, tokens, finished requests by reason."""

    def __init__(self) -> None:
        self.ttft: list[float] = []
        self.gen = 0.0
        self.finished: dict[str, float] = {}


def serve(page: VllmPage, want: Expected | None, n: int, ttft: float, reason: str = "stop") -> None:
    """`n` requests finish on each engine of `page`; counted in `want` unless it is None (before the agent saw)."""
    for e in range(len(page.engines)):
        lab = page.lab(e)
        for _ in range(n):
            page.ttft.labels(*lab).observe(ttft)
        page.gen.labels(*lab).inc(10 * n)
        page.success.labels(*lab, reason).inc(n)
        if want is not None:
            want.ttft += [ttft] * n
            want.gen += 10 * n
            want.finished[reason] = want.finished.get(reason, 0) + n


def exported(totals: ServingTotals) -> dict[tuple[str, tuple], float]:
    """The exporter's page with these totals, as Prometheus reads it."""
    reg = CollectorRegistry(auto_describe=False)
    status = FakeController().status()
    reg.register(SnapshotCollector(lambda: status, lambda: totals.models))
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def check(page: dict, want: Expected) -> None:
    m = (("model_name", MODEL),)
    for le in (*TTFT_BUCKETS, math.inf):
        got = page[("lynxtop_serving_ttft_seconds_bucket", (("le", "+Inf" if le == math.inf else str(float(le))),
                                                           *m))]
        assert got == sum(1 for x in want.ttft if x <= le), le
    assert page[("lynxtop_serving_ttft_seconds_count", m)] == len(want.ttft)
    assert page[("lynxtop_serving_ttft_seconds_sum", m)] == pytest.approx(sum(want.ttft))
    assert page[("lynxtop_serving_generation_tokens_total", m)] == want.gen
    for reason, n in want.finished.items():
        assert page[("lynxtop_serving_requests_total", (("finished_reason", reason), *m))] == n


def test_counts_go_on_across_vllm_restarts_and_new_runs():
    """An adopted server's earlier counts are not the agent's (baseline); a restart behind the same run and a new
    run's process both start from zero, and what they counted is added. Nothing exported ever goes down."""
    totals, want = ServingTotals(), Expected()
    pages: list[dict] = []

    def look(scraper: MetricsScraper, page: VllmPage, t: float) -> None:
        scraper.parse_page(page.text(), now=t)
        totals.observe(scraper)
        totals.observe(scraper)  # a tick without a new page adds nothing
        pages.append(exported(totals))
        check(pages[-1], want)

    adopted = VllmPage(engines=2)
    serve(adopted, None, 50, 3.0)  # counted by the server before this agent existed
    run1 = MetricsScraper("http://127.0.0.1:8000")
    look(run1, adopted, 0.0)
    assert pages[0][("lynxtop_serving_ttft_seconds_count", (("model_name", MODEL),))] == 0
    serve(adopted, want, 5, 0.03)
    look(run1, adopted, 1.0)
    restarted = VllmPage(engines=2)  # vLLM restarted behind the same run: every series from zero
    serve(restarted, want, 2, 0.3)  # below what the series counted before: a reset, 2 more
    look(run1, restarted, 2.0)
    serve(restarted, want, 1, 0.007, reason="length")
    look(run1, restarted, 3.0)
    run2 = MetricsScraper("http://127.0.0.1:8000")  # the supervisor started a new process: a new run
    second = VllmPage(engines=2)
    serve(second, want, 3, 1.7)  # finished before the new run's first scrape: still counted
    look(run2, second, 4.0)
    serve(second, want, 4, 0.05, reason="abort")
    look(run2, second, 5.0)
    for before, after in zip(pages, pages[1:], strict=False):
        for key, v in before.items():
            if key[0].startswith(("lynxtop_serving_ttft_seconds", "lynxtop_serving_requests_total",
                                  "lynxtop_serving_generation_tokens_total")):
                assert after[key] >= v, key


def test_each_model_has_its_own_series_and_other_buckets_start_over():
    totals = ServingTotals()
    first = VllmPage(engines=1, model="model-a")
    run1 = MetricsScraper("http://x:1")
    run1.parse_page(first.text(), now=0.0)
    totals.observe(run1)
    first.ttft.labels(*first.lab(0)).observe(0.2)
    run1.parse_page(first.text(), now=1.0)
    totals.observe(run1)
    other = VllmPage(engines=1, model="model-b")
    other.ttft.labels(*other.lab(0)).observe(0.02)
    run2 = MetricsScraper("http://x:1")
    run2.parse_page(other.text(), now=2.0)
    totals.observe(run2)
    page = exported(totals)
    assert page[("lynxtop_serving_ttft_seconds_count", (("model_name", "model-a"),))] == 1
    assert page[("lynxtop_serving_ttft_seconds_count", (("model_name", "model-b"),))] == 1
    assert page[("lynxtop_serving_ttft_seconds_bucket", (("le", "0.25"), ("model_name", "model-a")))] == 1
    assert page[("lynxtop_serving_ttft_seconds_bucket", (("le", "0.02"), ("model_name", "model-b")))] == 1


def test_nothing_before_the_first_page_and_the_page_still_served_when_totals_fail():
    assert not [k for k in exported(ServingTotals()) if k[0].startswith("lynxtop_serving_ttft_seconds")]

    def broken() -> dict:
        raise RuntimeError("boom")

    reg = CollectorRegistry(auto_describe=False)
    status = FakeController().status()
    reg.register(SnapshotCollector(lambda: status, broken))
    assert b"lynxtop_serving_ttft_p99_seconds" in generate_latest(reg)


def test_totals_nobody_reads_add_nothing_and_the_agent_keeps_them_only_with_its_exporter(tmp_path, h):
    """Without `[agent] metrics_listen` nothing reads the lifetime totals: the node's are not kept, so a scrape does
    not pay for them (issue 29.3); with the exporter they are kept and add up as above."""
    from support.node import close_node, open_node

    page = VllmPage(engines=2)
    serve(page, None, 5, 0.03)
    scraper = MetricsScraper("http://127.0.0.1:8000")
    scraper.parse_page(page.text(), now=0.0)
    serve(page, None, 5, 0.03)
    scraper.parse_page(page.text(), now=1.0)
    unread, kept = ServingTotals(kept=False), ServingTotals()
    for totals in (unread, kept):
        totals.observe(scraper)
    assert unread.models == {} and kept.models  # the same page: only the kept totals hold it

    for extra, want in (("", False), ('metrics_listen = "127.0.0.1:19464"', True)):
        d = tmp_path / ("with" if want else "without")
        d.mkdir()
        node = open_node(h.write_config(d, f'fake_nvml = "h200x8"\n{extra}'))
        try:
            totals = node.scrape_source.totals
            assert (totals is None or totals.kept) is want  # None: ScrapeSource makes kept ones at its first run
        finally:
            close_node(node)
