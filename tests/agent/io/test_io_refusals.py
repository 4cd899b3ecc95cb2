"""Refused control requests: logged once per episode with a count (issue 25.5), on the real API and socket."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from agent_io_helpers import FakeController
from support.waits import wait_for_async

from lynxtop.agent.api.connguard import Episodes
from lynxtop.agent.api.routes import ApiServer


async def test_a_flood_of_refused_requests_is_one_line_and_a_count(sock_dir):
    """300 restarts while another action runs: one 'refused' line when the episode starts, one summary with the
    count when it ends, not 300 lines."""
    ctl = FakeController()
    ctl.busy = "switch to tp8-fp8kv"
    logs: list[str] = []
    episodes = Episodes(logs.append, quiet_s=0.3)
    server = ApiServer(ctl, sock_dir / "agent.sock", group="users", log=logs.append, episodes=episodes)
    await server.start()
    try:
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sock_dir / "agent.sock"))) as s:
            for _ in range(300):
                async with s.post("http://agent/v1/restart", json={}) as r:
                    assert r.status == 409
            deadline = time.monotonic() + 20  # the guard's sweep closes the episode once it has been quiet
            while not any("occurrence(s)" in line for line in logs) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            refused = [line for line in logs if "refused:" in line]
            assert len(refused) == 2, refused  # the first, and the summary
            assert "busy" in refused[0] and "switch to tp8-fp8kv" in refused[0]
            assert "300 occurrence(s)" in refused[1], refused[1]
            # a single refusal later is said once, with no summary of one
            logs.clear()
            ctl.busy = None
            async with s.post("http://agent/v1/start", json={}) as r:
                assert r.status == 409
            # the episode closes once quiet for quiet_s: polled until it has, however slow the machine
            await wait_for_async(lambda: episodes.poll() or not episodes.open, 10, what="the episode closed")
            assert len([line for line in logs if "refused:" in line]) == 1, logs
            assert not any("occurrence(s)" in line for line in logs), logs
    finally:
        await server.stop()
