"""Esc leaves the GPU view for the Node view: Enter on a GPU row opens it, and an operator backs out with Esc as
from every other detail (Compare, an event's details); it did nothing."""

from __future__ import annotations

from support.tui import make_app, wait_for

from lynxtop.tui.screens.gpu import GpuScreen
from lynxtop.tui.screens.node import NodeScreen


async def test_escape_on_the_gpu_view_goes_back_to_the_node_view(agent):
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        await pilot.press("enter")  # the GPU table's row: GPU 0's view
        await wait_for(pilot, lambda: isinstance(app.screen, GpuScreen))
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, NodeScreen))
