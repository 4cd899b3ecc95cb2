"""The /health probe hears of a resume the watchdog found (session 22).

The scrape's hang detector was told of resumes (session 21); the /health probe only had its own gap rule (a gap
between probes longer than two periods plus PROBE_TIMEOUT_S). A pause shorter than that but longer than
hang_timeout_s (8 s with 10 s probes and hang_timeout_s 5) read, on resume, as a /health silent for 8 s: "the
server is frozen", restarted with restart_on_hang. Now the resume (Ticker.resumed -> ScrapeSource.resumed ->
HttpClient.resumes) starts the silence again from the resume; a server silent hang_timeout_s after it is still
judged frozen.

A real aiohttp server on loopback whose /health never answers, the real HttpClient, ScrapeSource and HealthProbe;
the probe's clock is the test's (the pause), its waits are real.
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from support.web_app import serving

from lynxtop.agent.sampling import ScrapeSource
from lynxtop.agent.serving.health import Health, HealthProbe, HttpClient

pytestmark = pytest.mark.timeout(90)


async def test_a_pause_told_is_not_a_silent_server_and_a_later_silence_still_is():
    async def health(_r: web.Request) -> web.Response:
        await asyncio.sleep(3600)
        return web.Response(status=200)

    app = web.Application()
    app.router.add_get("/health", health)
    http = HttpClient()
    now = [1000.0]
    try:
        async with serving(app) as url:
            src = ScrapeSource(http, lambda: None, window_s=60, timeout_s=2.0, hang_timeout_s=5.0,
                               on_new_run=lambda: None, on_verdict=lambda v: None)
            probe = HealthProbe(http, url, fail_threshold=100, hang_timeout_s=5.0, clock=lambda: now[0],
                                period_s=10.0)
            assert await probe.probe() is None  # in flight, slow so far
            now[0] += 8.0  # the agent stopped for 8 s: shorter than the probe's own gap rule (23 s)
            src.resumed(now[0])  # what the watchdog's thread tells on waking late
            v = await probe.probe()
            assert v is None or v.health is not Health.HUNG, v.reason
            now[0] += 6.0  # watched this time: silent longer than hang_timeout_s since the resume
            v = await probe.probe()
            assert v is not None and v.health is Health.HUNG and "frozen" in v.reason, v
            probe.close()
    finally:
        await http.close()
