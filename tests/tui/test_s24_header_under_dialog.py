"""The header stays live under a control dialog: the demo showed "STARTING 3s (loading weights 24/60)" frozen
above a Restart dialog whose own text already said "state ready" (the view below was never redrawn while the
dialog was open), so the one line an operator reads first contradicted the dialog."""

from __future__ import annotations

from support.tui import make_app, text_of, wait_for
from support.tui_keys import open_screen

from lynxtop.tui.screens.base import LiveScreen
from lynxtop.tui.screens.confirm import ConfirmScreen
from lynxtop.tui.widgets.node_header import NodeHeader


async def test_the_header_below_a_dialog_follows_the_serving_state(agent):
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        await open_screen(pilot, app, "R", ConfirmScreen)
        below = app.screen_stack[-2]
        assert isinstance(below, LiveScreen)
        header = below.query_one(NodeHeader)
        assert "READY" in text_of(header)
        agent.status["serving"]["state"] = "degraded"  # the same run, still a running kind: the dialog stays
        await wait_for(pilot, lambda: app.state.serving.state == "degraded")
        await wait_for(pilot, lambda: "DEGRADED" in text_of(header))
        assert isinstance(app.screen, ConfirmScreen)
