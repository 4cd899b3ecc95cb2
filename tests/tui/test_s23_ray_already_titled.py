"""s23: on a Ray worker the dashboard's start acts on its Ray; an agent answering that Ray already runs
(409 already_running, as agent/cluster/raynode.py answers) is titled as done, not as a refusal or a busy agent."""

from __future__ import annotations

from support.tui import app_with_notices, wait_for
from support.tui_keys import open_screen

from lynxtop.tui.screens.confirm import ConfirmScreen


async def test_start_on_a_worker_whose_ray_runs_is_titled_already_running(agent):
    agent.status["cluster"] = {"role": "worker", "ray_state": "running", "address": "10.0.0.1:6379"}
    agent.status["serving"] = {**agent.status["serving"], "state": "stopped", "profile": None, "run_id": None}
    message = "Ray is already running on this node (worker, 10.0.0.1:6379, pid 4321); nothing was started"
    agent.post_answers["start"] = (409, {"error": "already_running", "message": message})
    app, notices = app_with_notices(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        dialog = await open_screen(pilot, app, "S", ConfirmScreen)
        assert "Start this node's Ray?" in str(dialog.title_text)
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: any(message in m for _, m, _ in notices))
        title, _, severity = next(n for n in notices if message in n[1])
        assert (title, severity) == ("start: already running", "information"), notices
        assert agent.posts() == [("/v1/start", {"expect_run": None})]
