"""GET /v1/status encodes the part a tick changes once per tick for every poller; any change is in the next GET.

A real agent Node (fake NVML, 8 H200s, a real SQLite store) ticks in the test's loop and answers on a real unix
socket through the real ApiServer; the ticks are counted, never timed (issue 29.3).
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from prometheus_client import generate_latest
from support.node import close_node, open_node, run_clock

from lynxtop.agent import status_view as status_view_mod
from lynxtop.agent.api.routes import ApiServer, _dumps, strict_dumps
from lynxtop.agent.metrics.exporter import MetricsExporter
from lynxtop.contract import status as status_mod
from lynxtop.contract.client import AsyncAgentClient
from lynxtop.contract.status import ServingState, Status, join_json

pytestmark = pytest.mark.timeout(90)


def _config(tmp_path) -> str:
    path = tmp_path / "config.toml"
    path.write_text(f"""
[agent]
database = "{tmp_path / 'state' / 'lynxtop.db'}"
socket = "{tmp_path / 'run' / 'agent.sock'}"
sample_interval_s = 0.1
fake_nvml = "h200x8"

[[profile]]
name = "alpha"
executable = "/bin/true"
model = "deepseek-ai/DeepSeek-V4.1"
port = 18000
""")
    return str(path)


class _Served:
    """The node's controller on the real API server, and a client of its socket."""

    def __init__(self, node, tmp_path):
        self.path = tmp_path / "api.sock"
        self.server = ApiServer(node.controller, self.path)
        self.client = AsyncAgentClient(tmp_path / "api.sock", timeout_s=10)

    async def get(self) -> dict:
        return await self.client.request("GET", "/v1/status")

    async def raw(self) -> bytes:
        """The whole HTTP answer, head and body, as the socket carries it."""
        reader, writer = await asyncio.open_unix_connection(str(self.path))
        writer.write(b"GET /v1/status HTTP/1.1\r\nHost: lynxtop-agent\r\nConnection: close\r\n\r\n")
        try:
            return await asyncio.wait_for(reader.read(), 10)
        finally:
            writer.close()


def _tick_part(wire: dict) -> dict:
    return {k: wire[k] for k in ("gpus", "host", "serving_metrics", "engines")}


async def test_pollers_between_ticks_share_one_encoding_of_the_tick_part(tmp_path, monkeypatch):
    node = open_node(_config(tmp_path))
    api = _Served(node, tmp_path)
    await api.server.start()
    try:
        await run_clock(node, 30, until=lambda: node.ticker.ticks >= 2)  # the clock is stopped from here on
        encoded = []
        real = status_mod.GpuStatus.to_json
        monkeypatch.setattr(status_mod.GpuStatus, "to_json", lambda self: encoded.append(self.index) or real(self))
        answers = [await api.get() for _ in range(5)]
        assert len(encoded) == 8  # each GPU once for the five pollers: was 40
        expected = node.status().to_json()
        for wire in answers:
            assert _tick_part(wire) == json.loads(json.dumps(_tick_part(expected)))
            assert len(wire["gpus"]) == 8 and wire["gpus"][0]["mem_total_bytes"]
        assert [list(w) for w in answers] == [list(expected)] * 5  # the keys in to_json's order
    finally:
        await api.server.stop()
        close_node(node)


async def test_a_tick_an_xid_and_a_state_change_are_each_in_the_next_get(tmp_path):
    node = open_node(_config(tmp_path))
    api = _Served(node, tmp_path)
    await api.server.start()
    try:
        await run_clock(node, 30, until=lambda: node.ticker.ticks >= 2)
        first = await api.get()
        assert _tick_part(first) == json.loads(json.dumps(_tick_part(node.status().to_json())))

        ticks = node.ticker.ticks  # a tick: its rows are in the next answer
        await run_clock(node, 30, until=lambda: node.ticker.ticks > ticks)
        after_tick = await api.get()
        assert _tick_part(after_tick) == json.loads(json.dumps(_tick_part(node.status().to_json())))
        assert after_tick["host"] != first["host"] or after_tick["gpus"] != first["gpus"]

        node._count_xid(3)  # counted in place as the XID poll reads it, no tick
        assert [g["xid_errors"] for g in (await api.get())["gpus"]] == [0, 0, 0, 1, 0, 0, 0, 0]

        node.supervisor.runs.set_state(ServingState.BACKOFF, "a test's failure")  # no tick either
        serving = (await api.get())["serving"]
        assert (serving["state"], serving["reason"]) == ("backoff", "a test's failure")
    finally:
        await api.server.stop()
        close_node(node)


async def test_the_answer_is_the_status_json_to_the_byte(tmp_path):
    """The joined text is json.dumps of the whole status: same bytes, same content type as before."""
    node = open_node(_config(tmp_path))
    api = _Served(node, tmp_path)
    await api.server.start()
    try:
        await run_clock(node, 30, until=lambda: node.ticker.ticks >= 2)
        raw = await api.raw()
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        assert b"content-type: application/json; charset=utf-8" in head.lower()
        wire = json.loads(body)
        assert body.decode() == _dumps(Status.from_json(wire).to_json())
        st = Status.from_json(wire)
        assert join_json(_dumps(st.head_json()), _dumps(st.tick_json())) == _dumps(st.to_json())
    finally:
        await api.server.stop()
        close_node(node)


async def test_the_exporters_status_for_remote_dashboards_shares_the_encoding_too(tmp_path, monkeypatch):
    """The read-only TCP endpoint's GET /v1/status (the head's cluster view polls every node's) answers the same
    text as the socket, its tick part encoded once for both."""
    node = open_node(_config(tmp_path))
    api = _Served(node, tmp_path)
    exporter = MetricsExporter("127.0.0.1:0", node.status, status_body=lambda: node.status_body(strict_dumps))
    await api.server.start()
    await exporter.start()
    try:
        await run_clock(node, 30, until=lambda: node.ticker.ticks >= 2)
        encoded = []
        real = status_mod.GpuStatus.to_json
        monkeypatch.setattr(status_mod.GpuStatus, "to_json", lambda self: encoded.append(self.index) or real(self))
        remote = AsyncAgentClient(f"http://127.0.0.1:{exporter.bound_port}", timeout_s=10)
        over_tcp = [await remote.request("GET", "/v1/status") for _ in range(3)]
        local = await api.get()
        assert len(encoded) == 8  # was 8 per GET
        for wire in over_tcp:
            assert _tick_part(wire) == _tick_part(local) and wire["serving"] == local["serving"]
    finally:
        await exporter.stop()
        await api.server.stop()
        close_node(node)


async def test_metrics_between_ticks_reuse_the_tick_part_and_compare_none_of_it(tmp_path, monkeypatch):
    """GET /metrics keys its cached page as GET /v1/status keys its tick part: by the identity of the tick's
    objects, which the agent hands out unchanged until the next tick. It compared the whole status by value on
    every GET, a status whose GPUs, host and engines were built anew for each GET. Since session 19 the key held
    `agent.last_tick_ms` (counted back from each status's own now: it moves by a millisecond between GETs), and
    every other GET rendered the whole page again (CI: 3 renders for 6 GETs); the disk's free bytes (renewed every
    5 s, not on the page) did the same. The writer's queue (on the page) is drained first."""
    node = open_node(_config(tmp_path))
    exporter = MetricsExporter("127.0.0.1:0", node.status, totals=node.view.serving_totals)
    await exporter.start()
    try:
        await run_clock(node, 30, until=lambda: node.ticker.ticks >= 2)  # the clock is stopped from here on
        assert node.writer.flush(30)  # nothing left queued to change `lynxtop_store_queued_ticks`
        assert node.status().gpus is node.status().gpus  # one tick, one set of objects
        url = f"http://127.0.0.1:{exporter.bound_port}/metrics"
        async with aiohttp.ClientSession() as session:
            async def get() -> bytes:
                async with session.get(url) as resp:
                    assert resp.status == 200
                    return await resp.read()

            await get()
            built, compared = [], []
            real_build, real_eq = node.view.gpu_statuses, status_mod.GpuStatus.__eq__
            monkeypatch.setattr(node.view, "gpu_statuses", lambda: built.append(1) or real_build())
            monkeypatch.setattr(status_mod.GpuStatus, "__eq__", lambda a, b: compared.append(1) or real_eq(a, b))
            pages = [await get() for _ in range(5)]
            assert (len(built), len(compared), exporter.renders) == (0, 0, 1)  # were 5, 40 (8 GPUs x 5) and 1
            assert pages[-1] == generate_latest(exporter.registry)  # still the page a fresh render gives
            free = node.status().agent.store.free_bytes
            monkeypatch.setattr(status_view_mod, "free_bytes", lambda path: (free or 0) + 4096)
            node.view._free._read_at = None  # read again at the next status
            assert await get() == pages[-1] and exporter.renders == 1
            assert node.status().agent.store.free_bytes == (free or 0) + 4096  # the status has it; the page has not

            ticks, before = node.ticker.ticks, node.status().gpus
            await run_clock(node, 30, until=lambda: node.ticker.ticks > ticks)  # a tick: new rows, a new page
            assert node.status().gpus is not before and len(built) == 1
            assert await get() == generate_latest(exporter.registry) and exporter.renders == 2
    finally:
        await exporter.stop()
        close_node(node)
