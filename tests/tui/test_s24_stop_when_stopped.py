"""X on a node whose serving is already stopped: the dialog must not describe a drain and a lost load that cannot
happen (the demo showed "in-flight requests drain ... To serve again the model must load again" for a stopped node).
"""

from __future__ import annotations

from support.tui import make_app, plain, wait_for
from support.tui_keys import open_screen

from lynxtop.tui.screens.confirm import ConfirmScreen


def _dialog_text(screen: ConfirmScreen) -> str:
    return plain(screen.title_text) + plain(screen.body)


async def test_stop_dialog_on_a_stopped_node_says_it_is_already_stopped(agent):
    agent.status["serving"]["state"] = "stopped"
    agent.status["serving"]["pid"] = None
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected and app.state.serving.state == "stopped")
        text = _dialog_text(await open_screen(pilot, app, "X", ConfirmScreen))
        assert "already stopped" in text, text
        assert "drain" not in text and "must load again" not in text, text
        assert "request(s) are running" not in text, text


async def test_stop_dialog_on_a_ready_node_still_says_what_is_lost(agent):
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        text = _dialog_text(await open_screen(pilot, app, "X", ConfirmScreen))
        assert "stays stopped" in text and "must load again" in text, text
        assert "already stopped" not in text, text


async def test_restart_dialog_on_a_stopped_node_claims_no_running_requests(agent):
    """The serving metrics of a stopped node are the last read before the stop: not requests that would fail."""
    agent.status["serving"]["state"] = "stopped"
    agent.status["serving"]["pid"] = None
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected and app.state.serving.state == "stopped")
        text = _dialog_text(await open_screen(pilot, app, "R", ConfirmScreen))
        assert "Restart serving?" in text, text
        assert "request(s) are running" not in text and "drain" not in text and "aborted" not in text, text
