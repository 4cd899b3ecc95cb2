"""GET /metrics is built once per change of what it shows, not once per scrape (issue 27: slowloris.py's scrapes
rendered the whole page on the event loop each time), and every change is still in the next GET."""

from __future__ import annotations

import itertools
from dataclasses import replace

import aiohttp
import pytest
from agent_io_helpers import FakeController
from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from lynxtop.agent.metrics.exporter import MetricsExporter, SnapshotCollector
from lynxtop.agent.metrics.histogram import HistogramSnapshot
from lynxtop.agent.metrics.lifetime import ModelTotals
from lynxtop.contract.status import ServingState

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


@pytest.fixture
async def cached(monkeypatch):
    """An exporter whose snapshot is a new object at every read (as the agent's status() is), with lifetime totals
    and listener counts; `builds` counts how often the GPU families were built (the page's largest part)."""
    builds = {"gpus": 0}
    orig = SnapshotCollector._gpus

    def counting(self, gpus):
        builds["gpus"] += 1
        return orig(self, gpus)

    monkeypatch.setattr(SnapshotCollector, "_gpus", counting)
    base = FakeController().status()
    base = replace(base, agent=replace(base.agent, connections={"metrics": {"open": 1, "max": 64, "refused": 0}},
                                       descriptors={"open": 40, "limit": 1024}))
    state = {"snapshot": base}
    clock = itertools.count(1)
    totals = {"m": ModelTotals(counters={"prompt_tokens": 10.0}, finished={"stop": 2.0},
                               histograms={"ttft": HistogramSnapshot(((0.1, 1.0), (float("inf"), 2.0)), 0.3, 2.0)})}
    def snapshot():  # the agent's clock and uptime move on every read; neither is on the page
        t = next(clock)
        st = state["snapshot"]
        return replace(st, ts_ms=t, agent=replace(st.agent, uptime_s=t / 10))

    exp = MetricsExporter("127.0.0.1:0", snapshot, log=lambda _: None, totals=lambda: totals)
    await exp.start()
    session = aiohttp.ClientSession()

    async def get(accept: str | None = None) -> bytes:
        headers = {"Accept": accept} if accept else {}
        async with session.get(f"http://127.0.0.1:{exp.bound_port}/metrics", headers=headers) as resp:
            assert resp.status == 200
            return await resp.read()

    yield exp, get, state, totals, builds
    await session.close()
    await exp.stop()


async def test_many_gets_between_two_changes_build_the_page_once(cached):
    exp, get, state, _, builds = cached
    bodies = {await get() for _ in range(5)}
    assert len(bodies) == 1
    assert builds["gpus"] == 1  # the old handler built every family on each of the 5 GETs
    state["snapshot"] = replace(state["snapshot"], gpus=state["snapshot"].gpus[:1])  # a tick: new GPU rows
    for _ in range(3):
        await get()
    assert builds["gpus"] == 2


async def test_each_change_between_ticks_is_in_the_next_get(cached):
    _, get, state, totals, _ = cached
    first = await get()
    assert b'lynxtop_serving_state{state="ready"} 1.0' in first
    st = state["snapshot"]
    state["snapshot"] = replace(st, serving=replace(st.serving, state=ServingState.DEGRADED))
    assert b'lynxtop_serving_state{state="degraded"} 1.0' in await get()
    totals["m"].counters["prompt_tokens"] += 5  # lifetime.py adds in place: same objects, new values
    assert b'lynxtop_serving_prompt_tokens_total{model_name="m"} 15.0' in await get()
    totals["m"].finished["length"] = 1.0
    assert b'finished_reason="length"' in await get()
    st = state["snapshot"]  # the listeners' counts move with every connection: built per GET
    state["snapshot"] = replace(st, agent=replace(st.agent, connections={"metrics": {"open": 7, "max": 64}},
                                                  descriptors={"open": 99, "limit": 1024}))
    body = await get()
    assert b'lynxtop_agent_connections{listener="metrics"} 7.0' in body
    assert b"lynxtop_agent_open_fds 99.0" in body


@pytest.mark.parametrize("accept", [None, OPENMETRICS])
async def test_the_cached_page_is_byte_for_byte_a_fresh_render(cached, accept):
    exp, get, _, _, _ = cached
    await get(accept)
    body = await get(accept)  # from the cache
    render = openmetrics_latest if accept else generate_latest
    assert body == render(exp.registry)  # the registry renders every family afresh
    assert body.count(b"# EOF") == (1 if accept else 0)
    assert b"lynxtop_agent_connections" in body and b"lynxtop_serving_ttft_seconds_bucket" in body


async def test_a_get_compares_no_gpu_by_value(monkeypatch):
    """The page is keyed by the identity of the status' tick part, as GET /v1/status's is (agent/status_view.py
    hands out the same objects until a tick): a GET never walks the GPUs' readings to compare them. It compared
    the whole status by value, every GPU of it, on every GET; GPUs that are new objects now make a new page."""
    from lynxtop.contract import status as status_mod

    base = FakeController().status()
    assert base.gpus
    exp = MetricsExporter("127.0.0.1:0", lambda: replace(base, gpus=tuple(replace(g) for g in base.gpus)),
                          log=lambda _: None)
    await exp.start()
    compared = []
    real_eq = status_mod.GpuStatus.__eq__
    monkeypatch.setattr(status_mod.GpuStatus, "__eq__", lambda a, b: compared.append(1) or real_eq(a, b))
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(3):
                async with session.get(f"http://127.0.0.1:{exp.bound_port}/metrics") as resp:
                    body = await resp.read()
        assert compared == []  # was one compare per GPU per GET
        assert body == generate_latest(exp.registry)
    finally:
        await exp.stop()
