"""A control whose answer does not come is not 'not sent': the agent may have acted.

Control POSTs wait longer than the dashboard's reads; one that gets no answer in time says the agent may have
acted and retries nothing. Only a failure before the request went out (no socket, connection refused) is 'not
sent'.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from aiohttp import web
from support.tui import app_with_notices, wait_for
from support.tui_keys import open_screen
from support.waits import holds_async
from tui_fake_agent import FakeAgent

from lynxtop.contract.client import DASHBOARD_TIMEOUT_S
from lynxtop.tui.screens.confirm import ConfirmScreen


class SlowPostAgent(FakeAgent):
    """Acts on (records) the action at once and answers `delay_s` later: an agent whose loop is busy."""

    delay_s = 1.0

    async def _post(self, request: web.Request) -> web.Response:
        answer = await super()._post(request)
        await asyncio.sleep(self.delay_s)
        return answer


@pytest.fixture
def slow_agent(sock_dir: Any) -> Any:
    fake = SlowPostAgent(sock_dir / "agent.sock").start()
    yield fake
    fake.stop()


def test_controls_wait_longer_than_reads(sock_dir):
    from lynxtop.tui.source import LiveSource

    source = LiveSource(sock_dir / "agent.sock")
    assert source.timeout_s == DASHBOARD_TIMEOUT_S
    assert source.control_timeout_s >= 10 > DASHBOARD_TIMEOUT_S


async def test_answer_slower_than_a_read_but_within_the_control_timeout_is_accepted(slow_agent):
    slow_agent.delay_s = 1.0
    app, notices = app_with_notices(slow_agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        app.source.timeout_s = 0.3  # a read would have given up
        await open_screen(pilot, app, "R", ConfirmScreen)
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: any("accepted" in t for t, _, _ in notices), 30)
        assert not any("not sent" in m or "unreachable" in t.lower() for t, m, _ in notices), notices


async def test_no_answer_in_time_says_the_agent_may_have_acted_and_retries_nothing(slow_agent):
    slow_agent.delay_s = 2.0
    app, notices = app_with_notices(slow_agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        app.source.control_timeout_s = 0.5
        await open_screen(pilot, app, "R", ConfirmScreen)
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: any("may have acted" in m for _, m, _ in notices), 30)
        title, message, severity = next(n for n in notices if "may have acted" in n[1])
        assert "no answer within 0.5 s" in message and "nothing is retried" in message, message
        assert "watch the header" in message and severity == "warning"
        assert not any("not sent" in m for _, m, _ in notices), notices
        await holds_async(lambda: slow_agent.posts() == [("/v1/restart", {"expect_run": 3})], 2.5,
                          what="one post, never retried", sleep=pilot.pause)


@pytest.mark.parametrize("gone", ["no socket", "refused"])
async def test_agent_gone_before_sending_is_not_sent(agent, gone):
    app, notices = app_with_notices(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_screen(pilot, app, "X", ConfirmScreen)
        agent.stop()
        listener = None
        if gone == "refused":  # a socket file that nothing accepts on
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(agent.socket_path))
        try:
            await wait_for(pilot, lambda: not app.state.connected, 30)
            assert isinstance(app.screen, ConfirmScreen)  # an outage does not change the run it shows
            await pilot.press("tab", "enter")
            await wait_for(pilot, lambda: any("stop not sent" in m for _, m, _ in notices), 30)
            title, message, severity = next(n for n in notices if "stop not sent" in n[1])
            assert severity == "error" and "may have acted" not in message
        finally:
            if listener is not None:
                listener.close()
