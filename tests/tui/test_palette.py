"""The command palette (`:` as in k9s, ctrl+p): every binding's action by name, run through the palette."""

from __future__ import annotations

from support.tui import make_app, wait_for
from textual.command import CommandPalette

from lynxtop.tui.app import VIEWS, LynxtopApp
from lynxtop.tui.commands import PALETTE_ACTION, commands
from lynxtop.tui.screens.events import EventsScreen
from lynxtop.tui.widgets.gpu_table import GpuTable


async def _run_through_palette(pilot, app, key: str, query: str) -> None:
    await pilot.press(key)
    await wait_for(pilot, lambda: CommandPalette.is_open(app))
    palette = app.screen
    await pilot.press(*query)
    # the first hit is highlighted once the search has answered; Enter runs it
    await wait_for(pilot, lambda: palette.query_one("CommandList").option_count > 0
                   and palette.query_one("CommandList").highlighted is not None)
    await pilot.press("enter")
    await wait_for(pilot, lambda: not CommandPalette.is_open(app))


async def test_a_view_and_a_widget_action_run_by_name_through_the_palette(agent):
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        table = app.screen.query_one("#gpus", GpuTable)
        await wait_for(pilot, lambda: table.row_count == 8)
        table.focus()
        await _run_through_palette(pilot, app, "colon", "sort column")  # the focused table's action, by name
        assert table.sort_key == "sm" and table.order[0] == 7
        await _run_through_palette(pilot, app, "ctrl+p", "events view")
        await wait_for(pilot, lambda: isinstance(app.screen, EventsScreen))


def _expected(screen, app: LynxtopApp) -> set[str]:
    """Every named binding of the app, the view and the focused widget and its containers that the view does not
    hide (check_action False), but the palette's own."""
    nodes = list(screen.focused.ancestors_with_self) if screen.focused else [screen, app]
    want = set()
    for node in nodes:
        for binding in type(node).BINDINGS:
            if (binding.description and binding.action != PALETTE_ACTION
                    and app._check_action_state(binding.action, node) is not False):
                want.add(binding.action)
    return want


async def test_every_bindings_action_is_in_the_palette_in_every_view(agent, sock_dir):
    app = make_app(agent.socket_path, sock_dir / "absent.db")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        checked = set()
        for view in VIEWS:
            if not app._check_action_state(f"view('{view}')", app):
                continue  # the cluster view: only on a Ray head
            app.switch_mode(view)
            await wait_for(pilot, lambda v=view: app.current_mode == v)
            await pilot.pause()
            screen = app.screen
            offered = {c.action for c in commands(screen)}
            missing = _expected(screen, app) - offered
            assert not missing, f"{view}: not in the palette: {sorted(missing)}"
            checked |= offered
        # the app's own keys and each view's were walked, controls included (the agent is connected)
        for binding in LynxtopApp.BINDINGS:
            if binding.description and binding.action not in ("demo_load", "view('cluster')", PALETTE_ACTION):
                assert binding.action in checked, binding.action
        assert {"sort_next", "sort_invert", "cycle_kind", "open_event", "cycle_range", "compare"} <= checked
