"""The one API client (lynxtop.contract.client), both faces, against the real API server: typed status, named errors."""

from __future__ import annotations

import asyncio
import socket
import sys

import pytest
from agent_io_helpers import FakeController, ThreadedApi
from support.ports import short_dir

from lynxtop.contract.client import AgentClient, AgentRefused, AgentUnreachable, AsyncAgentClient
from lynxtop.contract.status import ServingState, Status


@pytest.fixture
def agent():
    with short_dir() as d:
        fake = FakeController()
        with ThreadedApi(fake, d / "agent.sock"):
            yield fake, d


def test_blocking_face(agent):
    fake, d = agent
    client = AgentClient(d / "agent.sock")
    st = client.status()
    assert isinstance(st, Status) and st.serving.state is ServingState.READY and st.agent.host == "node1"
    assert Status.from_json(client.status_json()).serving.run_id == 7
    assert client.action("restart").accepted is True and fake.calls[-1][:2] == ("restart", None)
    fake.busy = "restart"
    with pytest.raises(AgentRefused) as info:
        client.action("stop")
    assert info.value.status == 409 and info.value.code == "busy" and "in progress" in info.value.message
    fake.busy, fake.preflight_fail = None, ["no such executable"]
    with pytest.raises(AgentRefused) as info:
        client.action("switch", "tp8-fp8kv")
    assert info.value.status == 422 and info.value.details["reasons"] == ["no such executable"]
    with pytest.raises(ValueError):
        client.action("reboot")


async def test_async_face(agent):
    fake, d = agent
    client = AsyncAgentClient(d / "agent.sock")
    st = await client.status()
    assert st.serving.profile == "tp8" and len(st.gpus) == 8 and st.gpus[0].metric("power_w") == 612
    assert [r.id for r in await client.runs(limit=2)] == [7, 6]
    assert len(await client.events(since_ms=2000)) == 3
    assert (await client.logs(7, 3))["lines"] == ["line 0", "line 1", "line 2"]
    assert (await client.profiles()).current == "tp8"
    with pytest.raises(AgentRefused) as info:
        await client.logs(99)
    assert info.value.status == 404 and info.value.code == "unknown_run"
    await client.close()
    with pytest.raises(AgentUnreachable, match="closed"):
        await client.status()


async def test_unreachable_is_named_the_same_by_both_faces():
    with short_dir() as d:
        for path, words in ((d / "absent.sock", "no agent socket"), (d / "dead.sock", "nothing answers")):
            if path.name == "dead.sock":  # a socket file left by a dead agent
                dead = socket.socket(socket.AF_UNIX)
                dead.bind(str(path))
                dead.close()
            with pytest.raises(AgentUnreachable, match=words):
                AgentClient(path).status()
            with pytest.raises(AgentUnreachable, match=words):
                await AsyncAgentClient(path, timeout_s=1).status()


async def test_answers_that_are_not_the_api_are_unreachable():
    from aiohttp import web

    async def html(request):
        return web.Response(text="<html>not the agent</html>", content_type="text/html")

    async def other(request):
        return web.json_response({"hello": "world"})

    with short_dir() as d:
        app = web.Application()
        app.router.add_get("/v1/status", other)
        app.router.add_get("/v1/profiles", html)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.UnixSite(runner, str(d / "other.sock")).start()
        try:
            client = AsyncAgentClient(d / "other.sock")
            with pytest.raises(AgentUnreachable, match="not JSON"):
                await client.profiles()
            with pytest.raises(AgentUnreachable, match="not a lynxtop status"):
                await client.status()
            blocking = AgentClient(d / "other.sock")
            with pytest.raises(AgentUnreachable, match="not JSON"):
                await asyncio.to_thread(blocking.profiles)
        finally:
            await runner.cleanup()


def test_the_cli_face_does_not_import_asyncio():
    import subprocess

    code = "import sys, lynxtop.contract.client, lynxtop.cli.ctl; print('asyncio' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
