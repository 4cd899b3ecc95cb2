"""Hang and /health verdicts (agent/serving/health.py) and the samplers' one event path (agent/sampling.py)."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web
from support.web_app import serving

from lynxtop.agent.metrics.sla import SlaTracker
from lynxtop.agent.sampling import EventCollector, SlaSource, Tick, as_event, sample_stages
from lynxtop.agent.serving.health import HangDetector, Health, HealthProbe, HttpClient
from lynxtop.contract.config import SlaConfig
from lynxtop.contract.events import EventKind, Severity

pytestmark = pytest.mark.timeout(30)


def test_hang_needs_pending_requests_and_no_tokens_for_the_timeout():
    hang = HangDetector(10)
    assert hang.observe(2, 100.0, now=0).health is Health.PROGRESSING
    assert hang.observe(2, 100.0, now=9.9) is None
    v = hang.observe(2, 100.0, now=10)
    assert v.health is Health.HUNG and v.bad and v.condition == "hang"
    assert v.reason == "hang: 2 requests running and no token generated for 10 s"
    assert hang.observe(2, 100.0, now=30) is None  # told once per hang
    assert hang.observe(2, 101.0, now=31).health is Health.PROGRESSING


def test_requests_only_waiting_are_a_hang_and_an_idle_server_is_not():
    hang = HangDetector(10)
    hang.observe(0, 5.0, waiting=3, now=0)
    v = hang.observe(0, 5.0, waiting=3, now=10)
    assert v is not None and v.health is Health.HUNG and "0 requests running, 3 waiting" in v.reason
    idle = HangDetector(10)
    idle.observe(0, 5.0, waiting=0, now=0)
    assert idle.observe(0, 5.0, waiting=0, now=100).health is Health.PROGRESSING


def test_a_gap_in_the_readings_restarts_the_hang_clock():
    hang = HangDetector(10)
    hang.observe(1, 5.0, now=0)
    assert hang.observe(None, None, now=5) is None
    hang.observe(1, 5.0, now=20)  # back: the clock starts here, not at 0
    assert hang.observe(1, 5.0, now=29) is None
    assert hang.observe(1, 5.0, now=30).health is Health.HUNG


async def test_health_probe_is_unhealthy_after_the_threshold_and_healthy_again():
    status = {"code": 503}

    async def health(_request):
        return web.Response(status=status["code"])

    app = web.Application()
    app.router.add_get("/health", health)
    async with serving(app) as url:
        http = HttpClient()
        try:
            probe = HealthProbe(http, url, fail_threshold=2)
            assert await probe.probe() is None
            v = await probe.probe()
            assert v.health is Health.UNHEALTHY and v.condition == "health" and "HTTP 503, 2 times" in v.reason
            status["code"] = 200
            assert (await probe.probe()).health is Health.HEALTHY and await probe.ok()
        finally:
            await http.close()


def test_sampler_events_take_the_dotted_kinds():
    collect = EventCollector()
    collect("gpu_lost", "critical", "GPU 3 fell off the bus", {"gpu": 3})  # the GPU sampler's older names
    collect("xid", "error", "XID 79", None)
    events = collect.drain()
    assert [(e.kind, e.severity) for e in events] == [(EventKind.GPU_LOST, Severity.CRITICAL),
                                                      (EventKind.GPU_XID, Severity.ERROR)]
    assert all(e.ts_ms is not None for e in events) and collect.drain() == []
    ev = as_event({"kind": "scrape_outage", "severity": "warning", "message": "down", "details": {}}, run_id=7)
    assert ev.kind is EventKind.SCRAPE_OUTAGE and ev.run_id == 7 and ev.ts_ms is None


async def test_stages_keep_the_events_of_a_failed_tick_and_the_sla_sees_the_scraped_row():
    class Scrape:
        async def sample(self, tick):
            row = {"ttft_p99_ms": 9000.0, "requests_finished": 20}  # enough requests for a tail
            return {"serving_row": row}, [as_event({"kind": "scrape_recovered", "severity": "info",
                                                    "message": "up"})]

    class Broken:
        async def sample(self, tick):
            await asyncio.sleep(0)
            raise OSError("EMFILE")

    tick = Tick(ts_ms=1000, t0=0.0, deadline=1.0, root=None, run_id=4)
    sla = SlaSource(SlaTracker(SlaConfig(ttft_p99_ms=2000)))
    assert await sample_stages([[Scrape()], [sla]], tick) is None
    assert [e.kind for e in tick.events] == [EventKind.SCRAPE_RECOVERED, EventKind.SLA_BREACH]
    assert tick.events[1].run_id == 4 and tick.events[1].ts_ms == 1000
    tick = Tick(ts_ms=2000, t0=0.0, deadline=1.0, root=None, run_id=4)
    err = await sample_stages([[Scrape(), Broken()], [sla]], tick)
    assert isinstance(err, OSError) and [e.kind for e in tick.events] == [EventKind.SCRAPE_RECOVERED]


async def test_a_scraped_tick_reads_its_target_once():
    # the target is the supervisor's serving status, built whole to say whether it serves: sample_now, which
    # leaves a due scrape to sample, hands its read on to that tick's sample instead of a second read
    from support.ports import free_port

    from lynxtop.agent.sampling import NOT_NOW, ScrapeSource, ScrapeTarget

    class Http:
        def session(self):  # noqa: ANN202 - a plain http:// page is read over the scraper's own connection
            return None

    reads = []
    target = ScrapeTarget(f"http://127.0.0.1:{free_port()}/metrics", 3, "token")

    def read_target() -> ScrapeTarget:
        reads.append(1)
        return target

    src = ScrapeSource(Http(), read_target, window_s=60, timeout_s=1.0, hang_timeout_s=30,
                       on_new_run=lambda: None, on_verdict=lambda v: None, interval_s=1.0)
    now = time.monotonic()
    tick = Tick(ts_ms=1000, t0=now, deadline=now + 1.0, root=None, run_id=3)
    assert src.sample_now(tick) is NOT_NOW
    rows, _ = await src.sample(tick)
    assert rows["serving_row"]["scrape_ok"] == 0 and rows["serving_row"]["run_id"] == 3  # nobody listens
    assert len(reads) == 1
    other = Tick(ts_ms=1100, t0=tick.t0 + 1.5, deadline=tick.t0 + 2.5, root=None, run_id=3)
    assert src.sample_now(other) is NOT_NOW  # due again
    await src.sample(Tick(ts_ms=1200, t0=tick.t0 + 1.6, deadline=tick.t0 + 2.6, root=None, run_id=3))
    assert len(reads) == 3  # a tick that sample_now did not see reads its own
    src.close()
