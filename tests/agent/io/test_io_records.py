"""Typed records end to end on a real unix socket: the API writes the records' JSON (the wire of docs/api.md,
unchanged), both client faces read them back typed, and an answer this version cannot read is a named error."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from agent_io_helpers import FakeController, ThreadedApi
from aiohttp import web
from support.ports import short_dir

from lynxtop.agent.api.routes import ApiServer
from lynxtop.cli import ctl
from lynxtop.contract.client import AgentClient, AgentUnreachable, AgentUnreadable, AsyncAgentClient
from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.contract.records import ActionAnswer, ProfileList, RunInfo

NEWER_KIND = "serving.teleported"  # unknown on purpose; a name, so the fixture scan (test_records.py) lets it be


async def test_the_api_writes_the_records_wire_json(sock_dir):
    server = ApiServer(FakeController(), sock_dir / "agent.sock", group="users", log=lambda _: None)
    await server.start()
    try:
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sock_dir / "agent.sock"))) as s:
            async with s.get("http://agent/v1/events?since=4000&limit=1") as resp:
                events = (await resp.json())["events"]
            async with s.get("http://agent/v1/runs?limit=1") as resp:
                runs = (await resp.json())["runs"]
            async with s.get("http://agent/v1/profiles") as resp:
                profiles = await resp.json()
    finally:
        await server.stop()
    # docs/api.md's keys, written literally: a change of the JSON on the wire fails here
    assert events == [{"id": 5, "ts_ms": 5000, "run_id": 7, "kind": "serving.phase", "severity": "info",
                       "message": "event 5", "details": {}}]
    assert runs[0]["id"] == 7 and runs[0]["profile"] == "tp8" and "summary" not in runs[0]
    assert set(runs[0]) == {"id", "profile", "argv", "model", "host", "started_ms", "pid", "pid_start_time",
                            "log_path", "simulated", "flags", "ready_ms", "vllm_version", "gpu_names", "gpu_count",
                            "ended_ms", "exit_code", "exit_signal", "end_reason"}
    assert profiles["current"] == "tp8" and profiles["profiles"][0] == {
        "name": "tp8", "description": "DeepSeek TP8", "argv": ["vllm", "serve", "m"], "flags": {}, "env": {}}


def test_blocking_client_answers_typed_records():
    with short_dir() as d:
        fake = FakeController()
        with ThreadedApi(fake, d / "agent.sock"):
            client = AgentClient(d / "agent.sock")
            events = client.events(since_ms=3000)
            assert events == [Event(EventKind.SERVING_PHASE, Severity.INFO, f"event {i}", {}, run_id=7, ts_ms=1000 * i)
                              for i in (4, 5)]
            assert [e.id for e in events] == [4, 5]
            assert client.runs(limit=2) == [RunInfo(7, profile="tp8"), RunInfo(6, profile="tp8")]
            profiles = client.profiles()
            assert isinstance(profiles, ProfileList) and profiles.names == ["tp8", "tp8-fp8kv"]
            answer = client.action("restart", None)
            assert answer == ActionAnswer(True, "restart", "restart accepted")


@pytest.fixture
async def newer_agent(sock_dir):
    """A real socket answering what a newer agent might: a kind this version lacks, a field it does not know."""
    async def events(_: web.Request) -> web.Response:
        return web.json_response({"events": [
            {"id": 1, "ts_ms": 1, "run_id": None, "kind": "serving.ready", "severity": "info", "message": "ok",
             "details": None, "node": "n2"},
            {"id": 2, "ts_ms": 2, "run_id": None, "kind": NEWER_KIND, "severity": "info", "message": "new",
             "details": None}]})

    async def runs(_: web.Request) -> web.Response:
        return web.json_response({"runs": [{"id": 3, "profile": "p", "shiny_new_field": [1]}, {"profile": "q"}]})

    app = web.Application()
    app.router.add_get("/v1/events", events)
    app.router.add_get("/v1/runs", runs)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.UnixSite(runner, str(sock_dir / "agent.sock")).start()
    yield sock_dir / "agent.sock"
    await runner.cleanup()


async def test_a_record_this_version_cannot_read_is_a_named_error(newer_agent):
    client = AsyncAgentClient(newer_agent)
    # a newer agent's well-formed kind is no such record: read as a generic event, beside the others
    assert [str(e.kind) for e in await client.events()] == ["serving.ready", NEWER_KIND]
    with pytest.raises(AgentUnreadable, match=r"GET /v1/runs .*runs\[1\]\.id: missing") as info:
        await client.runs()  # the unknown field of runs[0] was not it
    assert isinstance(info.value, AgentUnreachable)  # callers that show an unreachable agent show this too
    blocking = AgentClient(newer_agent)
    assert [str(e.kind) for e in await asyncio.to_thread(blocking.events)] == ["serving.ready", NEWER_KIND]
    with pytest.raises(AgentUnreadable, match=r"runs\[1\]\.id"):
        await asyncio.to_thread(blocking.runs)


def test_cluster_stop_answers_are_read_from_typed_events(capsys):
    """`lynxtop stop --cluster --wait` prints what each worker answered: the head's cluster.stop event."""
    with short_dir() as d:
        fake = FakeController()
        fake._events = [
            Event(EventKind.CLUSTER_STOP, Severity.INFO, "cluster stop: 10.0.0.2 stopped its Ray",
                  {"nodes": {"10.0.0.2": "stopped"}}, ts_ms=9000, id=1),
            Event(EventKind.CLUSTER_STOP, Severity.INFO, "no nodes in details: not printed", {}, ts_ms=9001, id=2),
            Event(EventKind.RAY_STOPPED, Severity.INFO, "ray stopped", {"nodes": {}}, ts_ms=9002, id=3)]
        with ThreadedApi(fake, d / "agent.sock"):
            ctl._print_cluster_stop(AgentClient(d / "agent.sock"), 9000)
    assert capsys.readouterr().out == "cluster stop: 10.0.0.2 stopped its Ray\n"
