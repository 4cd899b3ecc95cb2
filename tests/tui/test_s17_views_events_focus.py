"""The Events view shows which pane has the keys (`/` filters the events or searches the log, by focus), and `/`
puts the keys in a box that is visibly focused (tmux audit, session 16: "/ acts on a pane whose focus is not
shown"). At 80x24, with a real history database and no agent."""

from __future__ import annotations

from pathlib import Path

import pytest
from steer_history import build_steer_history
from support.tui import make_app, screen_text, wait_for
from support.tui_keys import open_screen
from textual.widgets import DataTable, Input, Log

from lynxtop.tui.screens.events import EventsScreen


@pytest.fixture(scope="module")
def steer_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    path = tmp_path_factory.mktemp("events-focus") / "history.db"
    return path, build_steer_history(path)


def _line_of(app, widget_id: str) -> str:
    """The screen row of a one-line widget, as the operator reads it."""
    region = app.screen.query_one(widget_id).region
    return screen_text(app).splitlines()[region.y]


async def test_focused_pane_is_marked_and_slash_focuses_a_visibly_focused_box(sock_dir, steer_db):
    db, info = steer_db
    app = make_app(sock_dir / "absent.sock", db, utc=True)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_screen(pilot, app, "5", EventsScreen, connected=False)
        await wait_for(pilot, lambda: len(screen.events) == info["events"])
        table, log = screen.query_one("#events", DataTable), screen.query_one("#log", Log)
        events_title, log_title = screen.query_one("#events-filters"), screen.query_one("#log-title")
        table.focus()
        await wait_for(pilot, lambda: table.has_focus and events_title.has_class("-focused"))
        # the events pane has the keys: its title line says so with a mark (not colour alone), the log's not
        assert not log_title.has_class("-focused")
        assert _line_of(app, "#events-filters").lstrip().startswith("▶ events"), screen_text(app)
        assert "▶" not in _line_of(app, "#log-title")
        blurred_rule = log.styles.border_top

        await pilot.press("tab")  # the log has the keys now: the marks move, the log's rule turns heavy
        await wait_for(pilot, lambda: log.has_focus and log_title.has_class("-focused"))
        assert not events_title.has_class("-focused")
        assert _line_of(app, "#log-title").lstrip().startswith("▶"), screen_text(app)
        assert "▶" not in _line_of(app, "#events-filters")
        assert log.styles.border_top[0] != blurred_rule[0] == "solid"

        await pilot.press("slash")  # search the log: the keys go to the box, which is visibly focused
        box = screen.query_one("#filter", Input)
        await wait_for(pilot, lambda: app.focused is box)
        assert box.has_class("-open") and "search the log" in box.placeholder
        focused_border = box.styles.border_top
        assert log_title.has_class("-focused")  # the pane the box acts on stays marked while typing
        await pilot.press("tab")  # the box open but without the keys: another kind of border, not a shade
        await wait_for(pilot, lambda: not box.has_focus)
        assert box.styles.border_top[0] != focused_border[0], (box.styles.border_top, focused_border)
        rows = screen_text(app).splitlines()
        assert not any("━" in row for row in rows[box.region.y:box.region.bottom]), rows
        box.focus()
        await wait_for(pilot, lambda: box.has_focus)
        rows = screen_text(app).splitlines()
        assert any("━" in row for row in rows[box.region.y:box.region.bottom]), rows  # heavy: seen without colour
