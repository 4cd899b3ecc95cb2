"""The Events view's cursor on the newest row follows the newest event (session 22).

Since rows are kept by key (session 21) a cursor stays on its event when new ones arrive, right for one the
operator moved to; but one left on the top row, watching events come in (a restart in progress at 3 a.m.), slid
down with its old event while the new ones arrived above it, and Enter opened an old event. On row 0 it now
follows the newest, as `journalctl -f`; anywhere else it stays on its event.

The real app against the FAKE agent on a real unix socket; the rows are the test's (the screen's own reads held
off), the fill is the screen's own.
"""

from __future__ import annotations

import pytest
from support.tui import make_app
from test_s21_events_keyed import events, open_events, rows_match_shown
from textual.widgets import DataTable


@pytest.mark.timeout(180)
async def test_the_top_row_follows_the_newest_and_another_row_stays_on_its_event(agent):
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 50)) as pilot:
        screen = await open_events(pilot, app)
        table = screen.query_one("#events", DataTable)
        screen.events = events(300, 300)
        screen._fill_events()
        await pilot.pause()
        table.focus()
        table.move_cursor(row=0)
        await pilot.pause()
        assert screen.shown[table.cursor_row].id == 300

        screen.events = events(302, 300)  # two new events
        screen._fill_events()
        await pilot.pause()
        assert table.cursor_row == 0 and screen.shown[0].id == 302, (
            f"cursor on row {table.cursor_row}, event {screen.shown[table.cursor_row].id}")
        rows_match_shown(screen, table)

        table.move_cursor(row=4)  # the operator moved to an event: it stays under the cursor
        await pilot.pause()
        looked_at = screen.shown[table.cursor_row].id
        screen.events = events(303, 300)
        screen._fill_events()
        await pilot.pause()
        assert screen.shown[table.cursor_row].id == looked_at and table.cursor_row == 5
