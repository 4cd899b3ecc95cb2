"""Snapshots of the screens issue 28.4 part 2 added, through the committed harness (tests/tui/test_snapshots.py):
an event's detail, the command palette, a zoomed History window and a sorted GPU table, at 80x24, 120x40, 200x60."""

from __future__ import annotations

from support.tui import text_of, wait_for
from test_snapshots import snap_screen, three_sizes  # noqa: F401 - the snapshot harness (its fixture by name)
from textual.command import CommandPalette
from textual.widgets import DataTable, Input

from lynxtop.tui.screens.event_detail import EventDetailScreen
from lynxtop.tui.screens.events import EventsScreen
from lynxtop.tui.screens.history import HistoryScreen
from lynxtop.tui.widgets.gpu_table import GpuTable


async def _event_detail(pilot) -> None:
    app = pilot.app
    await pilot.press("5")
    await wait_for(pilot, lambda: isinstance(app.screen, EventsScreen) and len(app.screen.events) == 4)
    app.screen.query_one("#events", DataTable).focus()
    await pilot.press("down", "enter")  # the GPU XID event of the running run
    await wait_for(pilot, lambda: isinstance(app.screen, EventDetailScreen))
    await wait_for(pilot, lambda: "dsv41-tp8-ep" in text_of(app.screen.query_one("#event-body")))


async def _palette(pilot) -> None:
    await pilot.press("colon")
    await wait_for(pilot, lambda: CommandPalette.is_open(pilot.app))
    palette = pilot.app.screen
    palette.query_one(Input).cursor_blink = False  # a blinking cursor is in the shot or not, by the clock
    await pilot.press(*"view")
    listing = palette.query_one("CommandList")
    # the search has answered (no busy countdown running) and the views 1-5 are listed, the first highlighted
    await wait_for(pilot, lambda: palette._busy_timer is None and not palette._show_busy
                   and listing.option_count >= 5 and listing.highlighted == 0)


async def _history_zoomed(pilot) -> None:
    app = pilot.app
    await pilot.press("4")
    await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen) and len(app.screen.runs) == 2)
    screen = app.screen
    screen.query_one("#runs", DataTable).focus()
    await wait_for(pilot, lambda: screen.queried is not None)
    first = screen.queried
    await pilot.press("plus", "left_square_bracket")
    await wait_for(pilot, lambda: screen.queried != first and screen.queried == screen.window)
    # the zoomed window's charts drawn: its loading worker has finished (it draws before it ends)
    await wait_for(pilot, lambda: not any(w.group == "history-charts" and not w.is_finished for w in app.workers))


async def _gpus_sorted(pilot) -> None:
    table = pilot.app.screen.query_one("#gpus", GpuTable)
    table.focus()
    await pilot.press("s", "I")  # by SM activity, ascending
    await wait_for(pilot, lambda: table.sort_key == "sm" and not table.sort_descending)


@three_sizes
def test_event_detail_snapshot(snap_screen, size):  # noqa: F811 - the harness's fixture, imported above
    assert snap_screen(_event_detail, size)


@three_sizes
def test_palette_snapshot(snap_screen, size):  # noqa: F811
    assert snap_screen(_palette, size)


@three_sizes
def test_history_zoomed_snapshot(snap_screen, size):  # noqa: F811
    assert snap_screen(_history_zoomed, size)


@three_sizes
def test_gpu_table_sorted_snapshot(snap_screen, size):  # noqa: F811
    assert snap_screen(_gpus_sorted, size)
