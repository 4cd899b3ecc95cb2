"""Serving an operator stopped says so on the Node view (session 18): the agent keeps it stopped across its own
restarts (autostart held until an operator starts it, or a reboot), and a dashboard showing only "STOPPED" left the
operator of the next shift guessing why the node's model did not come back."""

from __future__ import annotations

from support.status import T0, status_json
from support.tui import make_app, text_of, wait_for

from lynxtop.tui.widgets.startup_phases import StartupPhases

HELD = ("stopped by uid 1000 (alice) at 09:12:00 UTC; autostart of dsv41-tp8 held until an operator starts serving "
        "(lynxtop start / restart / switch) or the node reboots")


async def test_the_node_view_says_who_stopped_serving_and_that_autostart_is_held(agent):
    agent.status = status_json("stopped", ts_ms=T0, reason=HELD, run_id=None, pid=None)
    app = make_app(agent.socket_path)
    async with app.run_test(size=(200, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.serving.state == "stopped")
        line = app.screen.query_one(StartupPhases)
        await wait_for(pilot, lambda: line.has_class("-visible"))
        text = text_of(line)
        assert "stopped by uid 1000 (alice) at 09:12:00 UTC" in text and "autostart of dsv41-tp8 held" in text, text


async def test_a_node_stopped_for_no_one_shows_no_line(agent):
    """The agent's own start (nothing was running, autostart off): no stop to explain."""
    agent.status = status_json("stopped", ts_ms=T0, reason="agent started", run_id=None, pid=None)
    app = make_app(agent.socket_path)
    async with app.run_test(size=(200, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.serving.state == "stopped")
        await pilot.pause()
        assert not app.screen.query_one(StartupPhases).has_class("-visible")
