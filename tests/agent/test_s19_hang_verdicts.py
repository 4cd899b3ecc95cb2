"""Hang and /health verdicts without false positives (session 19 audit, High 1, Medium 3, Low 6).

A hung verdict restarts the server with `restart_on_hang` (a 20-minute reload), so it must mean what it says:
- a /health that answers 200, only later than the probe's 3 s, is slow (degraded), not frozen;
- a silent /health while the engine's counters move is not a frozen server;
- time the agent did not watch (SIGSTOP, a VM pause: CLOCK_MONOTONIC jumps on resume) is not stall time;
- scrapes that fail now and then pause the hang clock, they do not keep restarting it.
Real aiohttp servers on loopback, the real HttpClient, HealthProbe, ScrapeSource and HangDetector.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time

import pytest
from aiohttp import web
from support.ports import free_port
from support.web_app import serving

from lynxtop.agent.sampling import ScrapeSource, ScrapeTarget, Tick
from lynxtop.agent.serving import procs
from lynxtop.agent.serving.health import PROBE_TIMEOUT_S, HangDetector, Health, HealthProbe, HttpClient
from lynxtop.agent.serving.watch import stopped_members

pytestmark = pytest.mark.timeout(90)


def page(gen: float, kv: float, running: int = 12) -> str:
    lab = 'engine="0",model_name="m"'
    return "".join([
        "# TYPE vllm:num_requests_running gauge\n", f"vllm:num_requests_running{{{lab}}} {running}\n",
        "# TYPE vllm:num_requests_waiting gauge\n", f"vllm:num_requests_waiting{{{lab}}} 0\n",
        "# TYPE vllm:kv_cache_usage_perc gauge\n", f"vllm:kv_cache_usage_perc{{{lab}}} {kv}\n",
        "# TYPE vllm:prompt_tokens counter\n", f"vllm:prompt_tokens_total{{{lab}}} 5000\n",
        "# TYPE vllm:generation_tokens counter\n", f"vllm:generation_tokens_total{{{lab}}} {gen}\n",
    ])


async def test_a_slow_200_is_degraded_as_slow_never_hung():
    answered = 0

    async def health(_r: web.Request) -> web.Response:
        nonlocal answered
        await asyncio.sleep(PROBE_TIMEOUT_S + 0.7)  # a busy API server: late, but it answers 200
        answered += 1
        return web.Response(status=200)

    app = web.Application()
    app.router.add_get("/health", health)
    http = HttpClient()
    verdicts = []
    try:
        async with serving(app) as url:
            probe = HealthProbe(http, url, fail_threshold=2, hang_timeout_s=6, period_s=1.0)
            end = time.monotonic() + 16
            while time.monotonic() < end:
                v = await probe.probe()
                if v is not None:
                    verdicts.append(v)
                await asyncio.sleep(1.0)
            probe.close()
    finally:
        await http.close()
    assert answered >= 2
    assert not [v for v in verdicts if v.health is Health.HUNG], [v.reason for v in verdicts]
    slow = [v for v in verdicts if v.health is Health.UNHEALTHY]
    assert slow and slow[0].condition == "health", [v.reason for v in verdicts]
    assert any("slow to answer" in v.reason for v in slow), [v.reason for v in slow]


async def test_a_silent_health_is_still_frozen_but_not_while_the_engine_moves():
    """/health never answers. While the scrape (same HttpClient) sees tokens flow, it is only degraded; once the
    counters stand still as well, hang_timeout_s later it is a frozen server (restarted with restart_on_hang)."""
    state = {"gen": 100.0, "kv": 0.3, "moving": True}

    async def health(_r: web.Request) -> web.Response:
        await asyncio.sleep(3600)
        return web.Response(status=200)

    async def metrics(_r: web.Request) -> web.Response:
        if state["moving"]:
            state["gen"] += 50
            state["kv"] += 0.001
        return web.Response(text=page(state["gen"], state["kv"]), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    http = HttpClient()
    verdicts: list = []
    try:
        async with serving(app) as url:
            target = ScrapeTarget(url + "/metrics", 1, "token")
            src = ScrapeSource(http, lambda: target, window_s=60, timeout_s=2.0, hang_timeout_s=600.0,
                               on_new_run=lambda: None, on_verdict=lambda v: None)
            stop = asyncio.Event()

            async def scraping() -> None:
                while not stop.is_set():
                    t = time.monotonic()
                    await src.sample(Tick(ts_ms=int(time.time() * 1000), t0=t, deadline=t + 2, root=None,
                                          run_id=1))
                    await asyncio.sleep(0.5)

            scraper = asyncio.create_task(scraping())
            probe = HealthProbe(http, url, fail_threshold=2, hang_timeout_s=4, period_s=1.0)
            try:
                end = time.monotonic() + 11  # moving: /health silent for ~11 s, longer than hang_timeout_s
                while time.monotonic() < end:
                    v = await probe.probe()
                    if v is not None:
                        verdicts.append(v)
                assert not [v for v in verdicts if v.health is Health.HUNG], [v.reason for v in verdicts]
                assert http.engine_moved_at is not None
                assert any("engine moving" in v.reason for v in verdicts if v.health is Health.UNHEALTHY), \
                    [v.reason for v in verdicts]
                state["moving"] = False  # the whole server frozen: nothing moves any more
                stopped = time.monotonic()
                hung = None
                while hung is None and time.monotonic() < stopped + 40:
                    v = await probe.probe()
                    if v is not None and v.health is Health.HUNG:
                        hung = v
                assert hung is not None and hung.condition == "unresponsive" and "frozen" in hung.reason
                assert time.monotonic() - stopped >= 4 - 0.6  # a whole hang_timeout_s after the engine stopped
            finally:
                stop.set()
                await scraper
                probe.close()
                src.close()
    finally:
        await http.close()


async def test_an_unwatched_gap_restarts_the_silence_of_health():
    """Nothing listens (no answer at once); the probe's clock jumps 300 s between two probes (the agent was
    stopped): not frozen on resume; a whole hang_timeout_s watched afterwards is."""
    clock = {"t": 1000.0}
    http = HttpClient()
    try:
        probe = HealthProbe(http, f"http://127.0.0.1:{free_port()}", fail_threshold=3, hang_timeout_s=10,
                            clock=lambda: clock["t"], period_s=1.0)
        assert (await probe.probe()) is None
        clock["t"] += 300.0  # stopped for 5 minutes
        for _ in range(9):  # 9 s watched: not yet
            v = await probe.probe()
            assert v is None or v.health is not Health.HUNG, v.reason
            clock["t"] += 1.0
        clock["t"] += 1.0
        v = await probe.probe()
        assert v is not None and v.health is Health.HUNG, v
        probe.close()
    finally:
        await http.close()


async def test_a_vm_pause_is_no_stall_but_a_hang_after_it_is_judged():
    state = {"gen": 100.0, "kv": 0.30}

    async def metrics(_r: web.Request) -> web.Response:
        return web.Response(text=page(state["gen"], state["kv"]), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    verdicts: list = []
    http = HttpClient()
    try:
        async with serving(app) as url:
            target = ScrapeTarget(url + "/metrics", 1, "token")
            src = ScrapeSource(http, lambda: target, window_s=60, timeout_s=2.0, hang_timeout_s=60.0,
                               on_new_run=lambda: None, on_verdict=verdicts.append)

            async def scrape(t: float) -> None:
                rows, _ = await src.sample(Tick(ts_ms=int(t * 1000), t0=t, deadline=time.monotonic() + 5,
                                                root=None, run_id=1))
                assert rows["serving_row"]["scrape_ok"] == 1

            try:
                t = 1000.0
                for _ in range(10):  # busy decoding
                    state["gen"] += 86
                    state["kv"] += 0.001
                    await scrape(t)
                    t += 1.0
                t += 120.0  # agent and vLLM paused for two minutes
                await scrape(t)  # the page as before the pause
                assert not [v for v in verdicts if v.health is Health.HUNG], [v.reason for v in verdicts]
                for _ in range(59):  # now really stuck: 59 s watched is not yet a hang
                    t += 1.0
                    await scrape(t)
                assert not [v for v in verdicts if v.health is Health.HUNG], [v.reason for v in verdicts]
                t += 1.0
                await scrape(t)
                hung = [v for v in verdicts if v.health is Health.HUNG]
                assert len(hung) == 1 and "for 60 s" in hung[0].reason, [v.reason for v in hung]
            finally:
                src.close()
    finally:
        await http.close()


def test_failed_scrapes_pause_the_hang_clock_instead_of_restarting_it():
    """A scrape cut off every third time: the stall seen between good readings adds up to a hang (before, each
    failure restarted the clock and a real hang was never judged); the failed spans add nothing."""
    hang = HangDetector(10, slack_s=1)
    assert hang.observe(2, 100.0, now=0).health is Health.PROGRESSING
    t, verdict = 0.0, None
    while (verdict is None or verdict.health is not Health.HUNG) and t < 60:
        t += 1.0
        if int(t) % 3 == 0:
            assert hang.observe(None, None, now=t) is None  # cut off
            continue
        verdict = hang.observe(2, 100.0, now=t)
    assert verdict is not None and verdict.health is Health.HUNG, (t, verdict)
    assert t > 10  # the failed spans (and the one after each) added nothing: more than 10 s of wall time
    assert verdict.reason.endswith("for 10 s")


def test_an_unwatched_gap_between_readings_counts_nothing_and_resumed_is_a_gap():
    hang = HangDetector(10, slack_s=1)
    hang.observe(1, 5.0, now=0)
    assert hang.observe(1, 5.0, now=4) is None
    assert hang.observe(1, 5.0, now=200) is None  # 196 s unwatched: not counted
    hang.resumed(201)
    assert hang.observe(1, 5.0, now=203) is None  # after a resume: the next reading starts counting
    assert hang.observe(1, 5.0, now=207) is None  # 4 + 4 = 8 s
    assert hang.observe(1, 5.0, now=209).health is Health.HUNG  # 10 s watched


def test_a_hang_names_the_runs_stopped_processes():
    """Low 5: a frozen server's hang says which of the run's processes are stopped (state T), by pid and name;
    a running one, or a pid whose start time differs (reused: someone else), is not named."""
    child = subprocess.Popen(["sleep", "60"])
    try:
        ticks = procs.stat(child.pid).start_ticks
        assert stopped_members({child.pid: ticks}) is None  # running
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 20
        while procs.stat(child.pid).state not in ("T", "t") and time.monotonic() < deadline:
            time.sleep(0.05)
        why = stopped_members({child.pid: ticks, 1: -1})
        assert why is not None and why.startswith(f"process {child.pid} (sleep) stopped (state T"), why
        assert stopped_members({child.pid: ticks + 1}) is None  # the pid is someone else's now
        os.kill(child.pid, signal.SIGCONT)
    finally:
        child.kill()
        child.wait()
