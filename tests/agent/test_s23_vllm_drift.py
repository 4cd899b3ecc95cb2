"""vLLM version drift, read by the agent's real scraper: pages of vLLM 0.10 to 0.32 as the simulator writes them
(sim/metrics.py gates the renamed families by version), a server restarted into another version under one run,
other bucket bounds after such a restart, and a family the agent reads that a version does not serve.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import generate_latest

import lynxtop.sim.metrics as sim_metrics
from lynxtop.agent.metrics.scrape import MetricsScraper
from lynxtop.contract.events import EventKind
from lynxtop.sim.metrics import VllmMetrics


def engine(version: tuple[int, int], itl_buckets: tuple[float, ...] | None = None) -> VllmMetrics:
    """One simulated engine of that vLLM version (other ITL/TPOT bucket bounds where given)."""
    saved = sim_metrics.ITL_BUCKETS
    if itl_buckets is not None:
        sim_metrics.ITL_BUCKETS = itl_buckets
    try:
        return VllmMetrics(model_name="m", version=version, max_model_len=4096, spec_decode=False,
                           cache_info={"block_size": "16"})
    finally:
        sim_metrics.ITL_BUCKETS = saved


def finish(m: VllmMetrics, n: int, itl_s: float = 0.03) -> None:
    """`n` requests of 8 tokens, three decode steps of `itl_s` each."""
    for _ in range(n):
        m.on_step({"running": 1, "waiting": 0, "kv": 0.25, "gen": 8, "pq": 100, "ph": 50, "first": [(1, 0.05)],
                   "itl": [itl_s] * 3,
                   "fin": [{"reason": "length", "e2e_s": 0.9, "queue_s": 0.1, "inference_s": 0.8, "prefill_s": 0.1,
                            "decode_s": 0.7, "prompt_tokens": 100, "generation_tokens": 8, "max_tokens": 8,
                            "tpot_s": itl_s}]})


def text(m: VllmMetrics) -> str:
    return generate_latest(m.registry).decode()


@pytest.mark.parametrize("version", [(0, 10), (0, 11), (0, 12), (0, 13), (0, 32)])
def test_every_version_gives_the_same_figures(version):
    """Old names only (0.10), old and new (0.11-0.12: a deprecation window), new only (0.13+): the same row."""
    m = engine(version)
    s = MetricsScraper("http://127.0.0.1:8000")
    s.parse_page(text(m), 0.0)
    finish(m, 10)
    row = s.parse_page(text(m), 1.0)
    assert row["kv_cache_usage_pct"] == 25.0
    assert row["prefix_cache_hit_pct"] == 50.0
    assert row["requests_finished"] == 10 and row["generation_tokens"] == 80
    assert row["itl_p50_ms"] == pytest.approx(37.5) and row["itl_mean_ms"] == pytest.approx(30.0)
    # vLLM < 0.11 has no per-request TPOT histogram: that column stays empty, nothing made up
    assert (row["tpot_p50_ms"] is None) == (version < (0, 11))


@pytest.mark.parametrize("version", [(0, 10), (0, 11)])
def test_a_deprecation_window_counts_each_quantity_once(version):
    """0.11 prints ITL under both names and the KV/prefix families under both: read once, not summed twice."""
    m = engine(version)
    page = text(m)
    assert "vllm:gpu_cache_usage_perc" in page and "vllm:gpu_prefix_cache_hits_total" in page
    assert ("vllm:inter_token_latency_seconds_bucket" in page) == (version >= (0, 11))
    s = MetricsScraper("http://127.0.0.1:8000")
    s.parse_page(page, 0.0)
    finish(m, 10)
    s.parse_page(text(m), 1.0)
    assert s.totals is not None
    parsed, counters, hists = s.totals
    assert hists["itl"].count == 30  # 10 requests x 3 steps; 60 if both names were summed
    assert counters["prefix_hits"] == 500 and counters["prefix_queries"] == 1000
    assert parsed.gauges["kv_usage"] == 0.25


def test_a_restart_into_a_newer_version_keeps_the_window_across_the_rename():
    """0.10 (ITL as time_per_output_token_seconds) restarted as 0.13 (inter_token_latency_seconds) under one run:
    the observations before the restart stay in the window, the new ones add to them, none counted twice."""
    old = engine((0, 10))
    s = MetricsScraper("http://127.0.0.1:8000")
    s.parse_page(text(old), 0.0)
    finish(old, 10, itl_s=0.03)
    s.parse_page(text(old), 1.0)
    new = engine((0, 13))
    finish(new, 4, itl_s=0.3)
    row = s.parse_page(text(new), 2.0)
    assert s.totals is not None
    assert s.totals[2]["itl"].count == 42  # 30 before, 12 after
    assert row["itl_mean_ms"] == pytest.approx((30 * 30 + 12 * 300) / 42)
    assert row["requests_finished"] == 4
    assert any(ev["kind"] == "scrape.counter_reset" for ev in s.events(2.0))


def test_a_restart_with_other_buckets_takes_percentiles_from_the_new_buckets_only():
    """Two pages of one run with other ITL bounds: no difference is taken across layouts (it would be nonsense);
    the window starts over at the restart and its percentiles interpolate inside the new bounds."""
    old = engine((0, 13))
    s = MetricsScraper("http://127.0.0.1:8000")
    s.parse_page(text(old), 0.0)
    finish(old, 10, itl_s=0.03)
    before = s.parse_page(text(old), 1.0)
    assert before["itl_lowest_bucket_ms"] == 10.0
    new = engine((0, 32), itl_buckets=(0.02, 0.04, 0.06, 0.5, 1.0))
    finish(new, 4, itl_s=0.3)
    row = s.parse_page(text(new), 2.0)
    assert row["itl_mean_ms"] == pytest.approx(300.0)  # only the new process' 12 observations
    assert 60.0 < row["itl_p50_ms"] <= 500.0 and row["itl_lowest_bucket_ms"] == 20.0
    finish(new, 4, itl_s=0.3)
    again = s.parse_page(text(new), 3.0)
    assert again["itl_mean_ms"] == pytest.approx(300.0)


def test_a_v0_page_without_the_engine_label_is_read():
    """vLLM's V0 engine (0.8) wrote no `engine` label: the same sums, one engine named by no label."""
    m = engine((0, 10))
    strip = re.compile(r',engine="0"|engine="0",?')
    s = MetricsScraper("http://127.0.0.1:8000")
    s.parse_page(strip.sub("", text(m)), 0.0)
    finish(m, 10)
    page = strip.sub("", text(m))
    assert 'engine="' not in page
    row = s.parse_page(page, 1.0)
    assert row["scrape_ok"] == 1 and row["kv_cache_usage_pct"] == 25.0 and row["requests_finished"] == 10
    assert row["itl_p50_ms"] == pytest.approx(37.5)


# ------------------------------------------------------------------------------ a family a version does not serve


async def _serve(page: list[str], version: str, hits: dict[str, int]) -> tuple[web.AppRunner, str]:
    """A real HTTP server with vLLM's /metrics (the page's current text) and /version (its GETs counted)."""

    async def metrics(_req: web.Request) -> web.Response:
        return web.Response(text=page[0], content_type="text/plain")

    async def ver(_req: web.Request) -> web.Response:
        hits["version"] += 1
        return web.json_response({"version": version})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/version", ver)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def _not_served_told(events: list[dict[str, Any]]) -> list[str]:
    """The scrape.not_served events' messages (each is one journal line, through the agent's event sink)."""
    return [e["message"] for e in events if e["kind"] == EventKind.SCRAPE_NOT_SERVED]


def test_a_family_this_version_does_not_serve_is_named_once_with_the_version(caplog):
    """vLLM 0.10 has no per-request TPOT histogram: the operator is told, once, which family is missing, which
    columns stay empty and which vLLM version serves the page, not left with a silent blank every scrape."""
    caplog.set_level(logging.WARNING, logger="lynxtop")

    async def go() -> tuple[dict[str, str], list[str], list[dict[str, Any]], int]:
        m = engine((0, 10))
        page = [text(m)]
        hits = {"version": 0}
        runner, url = await _serve(page, "0.10.2", hits)
        try:
            s = MetricsScraper(url + "/metrics")
            async with aiohttp.ClientSession() as session:
                for t in range(4):
                    finish(m, 2)
                    page[0] = text(m)
                    row = await s.scrape(session, float(t))
                    assert row["scrape_ok"] == 1
            s.close()
            return s.not_served, _not_served_told(s.events(4.0)), [], hits["version"]
        finally:
            await runner.cleanup()

    not_served, logs, _, version_gets = asyncio.run(go())
    assert set(not_served) == {"tpot"}  # everything else 0.10 serves under its old names
    msg = not_served["tpot"]
    assert "vllm:request_time_per_output_token_seconds" in msg and "0.10.2" in msg and "tpot_p99_ms" in msg
    assert len(logs) == 1 and "0.10.2" in logs[0]  # once, not every scrape
    assert version_gets == 1  # /version read once, to name the version


def test_a_family_gone_after_a_restart_into_another_version_is_told_then(caplog):
    """A family served on the first pages, then gone (restarted into a version without it): told when it goes,
    once; a page with every family tells nothing."""
    caplog.set_level(logging.WARNING, logger="lynxtop")
    s = MetricsScraper("http://127.0.0.1:8000")
    full = engine((0, 32))
    for t in range(3):
        finish(full, 2)
        s.parse_page(text(full), float(t))
    assert s.not_served == {} and _not_served_told(s.events(3.0)) == []
    s.vllm_version = "0.10.2"
    old = engine((0, 10))
    for t in range(3, 6):
        finish(old, 2)
        s.parse_page(text(old), float(t))
    assert set(s.not_served) == {"tpot"} and len(_not_served_told(s.events(6.0))) == 1
    # back on a version that serves it: no longer named
    for t in range(6, 8):
        finish(full, 2)
        s.parse_page(text(full), float(t))
    assert s.not_served == {}


def test_a_data_parallel_page_in_a_deprecation_window_reads_each_engine_once():
    """DP=2 on 0.11: each engine's KV usage under both names; per engine and in total it is read once (max)."""
    m = VllmMetrics(model_name="m", version=(0, 11), max_model_len=4096, spec_decode=False,
                    cache_info={"block_size": "16"}, engines=2)
    m.set_gauges(3, 1, 0.2, 0)
    m.set_gauges(5, 0, 0.6, 1)
    page = text(m)
    assert page.count('vllm:gpu_cache_usage_perc{engine="1"') == 1
    s = MetricsScraper("http://127.0.0.1:8000")
    row = s.parse_page(page, 0.0)
    assert row["kv_cache_usage_pct"] == pytest.approx(60.0) and row["requests_running"] == 8
    assert [(e["engine"], e["running"], e["kv_cache_usage_pct"]) for e in s.engines] == [
        ("0", 3, pytest.approx(20.0)), ("1", 5, pytest.approx(60.0))]
    assert s.not_served == {}
