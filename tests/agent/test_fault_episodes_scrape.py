"""A `/metrics` page that never ends is cut off each time it is read, and reading it up to the cut-off is costly
(2.7 % -> 15.7 % of a core at 10 Hz when read at every scrape): while such pages go on, the scrapes back off
(doubling, capped), one outage event all the same; the first page read whole restores the scrape cadence.
A real HTTP server, the agent's node ticking at 10 Hz with a scrape every 0.5 s (cut off at 0.4 s)."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web
from support.node import close_node, open_node, run_clock
from support.vllm_pages import sim_page

from lynxtop.agent.node import Node
from lynxtop.agent.sampling import ScrapeTarget

pytestmark = pytest.mark.timeout(90)


class EndlessThenWhole:
    """/metrics streams without end while `endless`, else answers a whole DP=2 page; each GET's time is kept."""

    def __init__(self) -> None:
        self.page = sim_page(2, seed=3)
        self.endless = True
        self.gets: list[float] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        self.gets.append(time.monotonic())
        if not self.endless:
            return web.Response(text=self.page)
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        line = b'vllm:num_requests_running{engine="0"} 1\n' * 1000
        try:
            while True:  # until the agent hangs up (the cut-off)
                await resp.write(line)
                await asyncio.sleep(0.001)
        except (ConnectionResetError, RuntimeError):
            pass
        return resp

    async def __aenter__(self) -> EndlessThenWhole:
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


def _in(gets: list[float], start: float, end: float) -> int:
    return sum(start <= t < end for t in gets)


async def test_an_endless_page_is_scraped_less_and_less_and_a_whole_page_restores_the_cadence(tmp_path, h):
    async with EndlessThenWhole() as srv:
        node: Node = open_node(h.write_config(tmp_path, 'sample_interval_s = 0.1\nscrape_interval_s = 0.5\n'
                                                        'fake_nvml = "h200x8"'))
        assert node.scrape_source is not None
        node.scrape_source.target = lambda: ScrapeTarget(srv.url, None, "run-1")
        try:
            task = asyncio.create_task(run_clock(node, 20.0))
            t0 = time.monotonic()
            await asyncio.sleep(9.0)
            endless = list(srv.gets)
            srv.endless = False  # the server mends: the next scrape (backed off) reads it whole
            deadline = time.monotonic() + 30  # backed off up to 8 s, later on a loaded machine
            while len(srv.gets) <= len(endless) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert len(srv.gets) > len(endless), "no scrape after the page mended"
            mended = srv.gets[len(endless)]
            await asyncio.sleep(3.0)
            whole = srv.gets[len(endless):]
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            assert node.writer.flush(10)
            # at the scrape cadence it is 18 GETs in 9 s; backing off (1, 2, 4, 8 s after each cut-off) it is 4 or 5
            assert 3 <= len(endless) <= 5, [round(t - t0, 1) for t in endless]
            gaps = [b - a for a, b in zip(endless, endless[1:], strict=False)]
            assert all(b > a for a, b in zip(gaps, gaps[1:], strict=False)), gaps  # thinning out
            # the first whole page restores the cadence: a page every 0.5 s from then on
            assert _in(whole, mended + 0.1, mended + 3.0) >= 4, [round(t - mended, 2) for t in whole]
            events = h.db_rows(node.writer.path, "SELECT kind, message FROM events WHERE kind LIKE 'scrape.%' "
                                                 "ORDER BY id")
            assert events[0]["kind"] == "scrape.outage" and "cut off" in events[0]["message"], events
            assert sum(e["kind"] == "scrape.outage" for e in events) == 1, events  # one episode
            assert node.status().serving_metrics.metric("scrape_ok") == 1
        finally:
            close_node(node)
