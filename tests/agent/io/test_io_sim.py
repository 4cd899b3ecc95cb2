"""The scraper against the simulated vLLM server (a real process with vLLM's metric names), end to end."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import aiohttp
import pytest
from support.ports import free_port

from lynxtop.agent.metrics.scrape import MetricsScraper

MODEL = "deepseek-ai/DeepSeek-V4.1"


@pytest.fixture
async def sim_server(tmp_path):
    port = free_port()
    argv = [sys.executable, "-m", "lynxtop.sim", "serve", MODEL, "-tp", "8", "--port", str(port),
            "--sim-startup-seconds", "0.3", "--sim-state-dir", str(tmp_path / "sim")]
    log = open(tmp_path / "sim.log", "wb")  # noqa: SIM115 - closed below
    proc = await asyncio.create_subprocess_exec(*argv, stdout=log, stderr=log, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 60
            while True:
                try:
                    async with session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=1)) as r:
                        if r.status == 200:
                            break
                except (aiohttp.ClientError, TimeoutError):
                    pass
                assert proc.returncode is None, (tmp_path / "sim.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "simulated vLLM did not become ready"
                await asyncio.sleep(0.2)
        yield url
    finally:
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                await asyncio.wait_for(proc.wait(), wait)
                os.killpg(proc.pid, signal.SIGKILL)  # the group may outlive its leader
            except ProcessLookupError:
                break
            except TimeoutError:
                continue
        log.close()


async def test_scrape_simulated_vllm(sim_server):
    url = sim_server
    s = MetricsScraper(url, window_s=60, timeout_s=5)
    async with aiohttp.ClientSession() as session:
        version = await s.fetch_version(session)
        assert version is not None and "sim" in version
        first = await s.scrape(session, now=time.monotonic())
        assert first["scrape_ok"] == 1, s.last_error

        async def complete(i: int) -> int:
            body = {"model": MODEL, "prompt": f"request {i} " * 20, "max_tokens": 16}
            async with session.post(url + "/v1/completions", json=body) as r:
                assert r.status == 200
                return (await r.json())["usage"]["completion_tokens"]

        generated = sum(await asyncio.gather(*(complete(i) for i in range(6))))
        row = await s.scrape(session, now=time.monotonic())
    assert row["scrape_ok"] == 1
    assert row["generation_tokens"] == generated
    assert row["requests_finished"] == 6
    assert row["prompt_tokens"] > 0 and row["generation_tokens_per_s"] > 0
    assert row["ttft_p50_ms"] is not None and row["ttft_p99_ms"] >= row["ttft_p50_ms"] > 0
    assert row["e2e_mean_ms"] is not None and row["e2e_mean_ms"] > 0
    assert row["kv_cache_usage_pct"] is not None and 0 <= row["kv_cache_usage_pct"] <= 100
    assert s.generation_tokens_total >= generated
