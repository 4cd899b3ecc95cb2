"""s23 follow-up: an older agent's `state` refusal that says the ask is already met is titled as the message says.

Before already_running/already_starting/already_serving/already_stopped had codes, agents answered 409 `state`; the
dashboard's fallback titled every such "already" message "start: already serving", and Ray's start on an old
agent ("Ray is already running on this node") read as if vLLM served. The title now follows the message."""

from __future__ import annotations

import pytest
from support.tui import app_with_notices, wait_for
from support.tui_keys import open_screen

from lynxtop.tui.screens.confirm import ConfirmScreen

RAY_RUNNING = "Ray is already running on this node (worker, 10.0.0.1:6379, pid 4321); nothing was started"


@pytest.mark.parametrize(("message", "title"), [
    (RAY_RUNNING, "start: already running"),
    ("Ray is already starting on this node (worker, 10.0.0.1:6379); nothing was started", "start: already starting"),
])
async def test_an_older_agents_ray_already_refusal_is_titled_as_it_says(agent, message, title):
    agent.status["cluster"] = {"role": "worker", "ray_state": "running", "address": "10.0.0.1:6379"}
    agent.status["serving"] = {**agent.status["serving"], "state": "stopped", "profile": None, "run_id": None}
    agent.post_answers["start"] = (409, {"error": "state", "message": message})  # no already_* code: older agent
    app, notices = app_with_notices(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        await open_screen(pilot, app, "S", ConfirmScreen)
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: any(message in m for _, m, _ in notices))
        got = next(n for n in notices if message in n[1])
        assert got[0] == title, notices


@pytest.mark.parametrize(("message", "title"), [
    ("serving is already ready (profile dsv41-tp8); use restart or switch", "start: already serving"),
    ("serving is already starting (profile dsv41-tp8); use restart or switch", "start: already starting"),
    ("Ray is already stopped on this node (stopped by operator); it stays stopped", "start: already stopped"),
    ("the profile is already in use by another run", "start: agent busy"),  # "already", no state named
])
async def test_an_older_agents_serving_already_refusal_is_titled_as_it_says(agent, message, title):
    agent.status["serving"] = {**agent.status["serving"], "state": "stopped", "run_id": None}
    agent.post_answers["start"] = (409, {"error": "state", "message": message})
    app, notices = app_with_notices(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        await open_screen(pilot, app, "S", ConfirmScreen)
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: any(message in m for _, m, _ in notices))
        got = next(n for n in notices if message in n[1])
        assert got[0] == title, notices
