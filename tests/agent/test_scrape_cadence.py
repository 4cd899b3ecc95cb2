"""The scrape at its own cadence and its limits: GPUs at 10 Hz with /metrics at 1 Hz, a page slower than the tick
or larger than the limit is cut off with one event, never holds sampling back and never grows memory; the status
carries each data-parallel engine's load."""

from __future__ import annotations

import asyncio
import tracemalloc

import aiohttp
import pytest
from aiohttp import web
from support.node import close_node, open_node, run_clock
from support.vllm_pages import sim_page

from lynxtop.agent.metrics import fetch as fetch_mod
from lynxtop.agent.metrics.scrape import MetricsScraper
from lynxtop.agent.node import Node
from lynxtop.agent.sampling import ScrapeTarget

pytestmark = pytest.mark.timeout(90)


class VllmStandIn:
    """A real HTTP server with a DP=8 page; `delay_s` holds each /metrics answer, `huge` streams without end."""

    def __init__(self) -> None:
        self.page = sim_page(8, seed=5)
        self.delay_s = 0.0
        self.huge: str | None = None  # "stream": chunks until the client hangs up; "announced": Content-Length only
        self.hits = 0
        self.encodings: list[str] = []  # the Accept-Encoding of each scrape
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        self.hits += 1
        self.encodings.append(request.headers.get("Accept-Encoding", ""))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.huge == "announced":
            resp = web.StreamResponse(headers={"Content-Length": str(64 << 20)})
            await resp.prepare(request)
            await resp.write(b"vllm:num_requests_running 1\n")
            return resp
        if self.huge == "stream":
            resp = web.StreamResponse()
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            chunk = b'vllm:num_requests_running{engine="0"} 1\n' * 4096
            try:
                for _ in range(2048):  # 320 MiB if nobody cuts it off
                    await resp.write(chunk)
            except (ConnectionResetError, RuntimeError):
                pass
            return resp
        return web.Response(text=self.page)

    async def __aenter__(self) -> VllmStandIn:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


def _node(tmp_path, h, url: str, scrape_interval_s: float) -> Node:
    node = open_node(h.write_config(tmp_path, f'sample_interval_s = 0.1\nscrape_interval_s = {scrape_interval_s}\n'
                                              'fake_nvml = "h200x8"'))
    assert node.scrape_source is not None
    node.scrape_source.target = lambda: ScrapeTarget(url, None, "run-1")  # serving, as the supervisor would say
    return node


async def _run_clock(node: Node, seconds: float) -> None:
    await run_clock(node, seconds)


def _count(h, node: Node, sql: str) -> int:
    node.writer.flush()
    return h.db_rows(node.writer.path, sql)[0]["n"]


async def test_gpus_at_10_hz_and_metrics_at_1_hz(tmp_path, h):
    async with VllmStandIn() as srv:
        node = _node(tmp_path, h, srv.url, 1.0)
        try:
            await _run_clock(node, 3.4)
            assert node.ticker.ticks >= 24, (node.ticker.ticks, node.ticker.missed_ticks)
            assert 3 <= srv.hits <= 5, srv.hits  # one page a second, not one a tick
            assert 3 <= _count(h, node, "SELECT count(*) AS n FROM serving_samples") <= 5
            assert _count(h, node, "SELECT count(DISTINCT ts_ms) AS n FROM gpu_samples") >= 20
            st = node.status()
            assert st.serving_metrics.metric("scrape_ok") == 1  # ticks between scrapes keep the last page
            assert [e.engine for e in st.engines] == [str(i) for i in range(8)]
            assert sum(e.running for e in st.engines) == st.serving_metrics.metric("requests_running")
            assert max(e.kv_cache_usage_pct for e in st.engines) == st.serving_metrics.metric("kv_cache_usage_pct")
            assert st.to_json()["engines"][0].keys() == {"engine", "running", "waiting", "kv_cache_usage_pct"}
        finally:
            close_node(node)


async def test_page_slower_than_the_tick_is_cut_off_with_one_event_and_sampling_goes_on(tmp_path, h):
    async with VllmStandIn() as srv:
        srv.delay_s = 5.0
        node = _node(tmp_path, h, srv.url, 0.5)  # cut off at 0.4 s
        try:
            await _run_clock(node, 3.0)
            t = node.ticker
            assert t.ticks >= 22 and t.failed_ticks == 0, (t.ticks, t.missed_ticks)
            assert _count(h, node, "SELECT count(DISTINCT ts_ms) AS n FROM host_samples") >= 22
            events = h.db_rows(node.writer.path, "SELECT kind, message FROM events WHERE kind LIKE 'scrape.%'")
            assert [e["kind"] for e in events] == ["scrape.outage"], events  # one event for the episode
            assert "cut off" in events[0]["message"] and "timed out after 0.4 s" in events[0]["message"]
            failed = _count(h, node, "SELECT count(*) AS n FROM serving_samples WHERE scrape_ok = 0")
            assert 2 <= failed <= 3, failed  # cut off at 0.4 s, then backed off 1 s, 2 s (docs/sampling.md)
            assert node.status().engines == ()
        finally:
            close_node(node)


async def test_the_page_is_asked_for_uncompressed():
    async with VllmStandIn() as srv, aiohttp.ClientSession() as session:
        s = MetricsScraper(srv.url)
        assert (await s.scrape(session, now=0.0))["scrape_ok"] == 1
        assert srv.encodings == ["identity"]  # a server honouring gzip would compress ~0.3 MB a tick


@pytest.mark.parametrize("mode", ["stream", "announced"])
async def test_huge_page_is_cut_off_at_the_limit_without_growing_memory(mode, monkeypatch):
    monkeypatch.setattr(fetch_mod, "MAX_PAGE_BYTES", 4 << 20)
    async with VllmStandIn() as srv, aiohttp.ClientSession() as session:
        srv.huge = mode
        s = MetricsScraper(srv.url, timeout_s=20)
        tracemalloc.start()
        try:
            row = await s.scrape(session, now=0.0)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert row["scrape_ok"] == 0 and "cut off" in s.last_error
        assert peak < (4 << 20) + (2 << 20), peak  # what was read up to the limit, never the page
        ev = s.outage_event(0.0)
        assert ev is not None and "cut off" in ev["message"]
        s.failed(1.0, "again")
        assert s.outage_event(1.0) is None  # still the same episode: no second event
