"""The connection guard's sweep wakes the loop only for a deadline (issue 29.3: each wake-up costs ~80 us).

It ran every second (request_timeout_s / 4, at most 1 s) whether or not a connection was open: at 1 Hz sampling
that was one of the agent's four loop wake-ups a second. Now it is armed for the first connection deadline or
episode end, at most once a step; that closing still happens after request_timeout_s is
test_io_connlimit.py's.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from agent_io_helpers import FakeController
from support.waits import wait_for_async

from lynxtop.agent.api.connguard import SWEEP_SLACK_S, Episodes
from lynxtop.agent.api.routes import ApiServer

pytestmark = pytest.mark.timeout(60)


async def test_an_idle_listener_arms_no_sweep_and_a_kept_connection_one_for_its_deadline(sock_dir):
    server = ApiServer(FakeController(), sock_dir / "agent.sock", group="users", log=lambda m: None,
                       request_timeout_s=10)
    await server.start()
    guard = server.guard
    loop = asyncio.get_running_loop()
    try:
        assert guard._sweeper is None  # nothing open: no timer (it was one a second)
        opened, loop_opened = guard.clock(), loop.time()  # before the connection is accepted
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sock_dir / "agent.sock"))) as s:
            async with s.get("http://agent/v1/status") as resp:
                assert resp.status == 200
                await resp.read()
            await wait_for_async(lambda: guard.stats()["open"] == 1 and not any(c.busy for c in guard.conns))
            # kept alive, idle: the one sweep is for a deadline 10 s on, not for a step (1 s) on. The deadline
            # armed is the first the guard knew: the accept's (the answer's, a moment later, keeps that timer;
            # a loaded machine put 3.5 ms between the two), so it lies between the accept's and the answer's
            assert guard._sweeper is not None
            assert guard._sweeper.when() >= loop_opened + 10.0
            conn = next(iter(guard.conns))
            assert opened + 10.0 <= guard._sweep_at <= conn.since + 10.0 + SWEEP_SLACK_S
        await wait_for_async(lambda: guard.stats()["open"] == 0)
        guard._sweep()  # as when its timer fires: nothing left to close, so nothing armed
        assert guard._sweeper is None and guard.stats()["timed_out"] == 0
    finally:
        await server.stop()


async def test_an_episode_alone_arms_the_sweep_that_logs_its_end(sock_dir):
    lines: list[str] = []
    server = ApiServer(FakeController(), sock_dir / "agent.sock", group="users", log=lambda m: None,
                       request_timeout_s=10, episodes=Episodes(lines.append, quiet_s=0.3))
    await server.start()
    guard = server.guard
    try:
        guard._refuse("a test refusal")  # as a flood's: an episode opens with no connection open
        assert lines and "refusing new connections" in lines[0]
        await wait_for_async(lambda: len(lines) == 2, timeout=30)  # no tick polls these episodes: the sweep does
        assert "ended after" in lines[1]
        assert guard._sweeper is None
    finally:
        await server.stop()
