"""History you can steer (Grafana): zoom and pan the charts' window with keys, jump to a run's time range; the
window is on the status line and is what the charts read from the real SQLite history (issue 28.4)."""

from __future__ import annotations

from pathlib import Path

import pytest
from steer_history import HOUR, build_steer_history
from support.status import T0
from support.tui import make_app, screen_text, text_of, wait_for
from support.tui_keys import open_screen
from textual.widgets import DataTable

from lynxtop.tui.history_series import MIN_WINDOW_MS, pan, zoom
from lynxtop.tui.screens.history import HistoryScreen
from lynxtop.tui.widgets.time_chart import TimeChart

NOW = T0 + 2000  # make_app's clock
MIN = 60_000


@pytest.fixture(scope="module")
def steer_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    path = tmp_path_factory.mktemp("steer") / "history.db"
    return path, build_steer_history(path)


async def _charted(pilot, screen: HistoryScreen, window: tuple[int, int]) -> None:
    """The charts were read for `window`: the query's range, and the points the store gave back lie inside it."""
    chart = screen.query_one("#hchart-sm", TimeChart)
    await wait_for(pilot, lambda: screen.queried == window and chart.points
                   and chart.points[0][0] >= window[0] - MIN and chart.points[-1][0] <= window[1])


async def test_zoom_pan_and_jump_change_the_queried_window(sock_dir, steer_db):
    db, info = steer_db
    app = make_app(sock_dir / "absent.sock", db, utc=True)
    async with app.run_test(size=(160, 40)) as pilot:
        screen = await open_screen(pilot, app, "4", HistoryScreen, connected=False)
        await wait_for(pilot, lambda: len(screen.runs) == 2)
        screen.query_one("#runs", DataTable).focus()
        await _charted(pilot, screen, (NOW - HOUR, NOW))  # the 1h preset, ending now (run 2 is running)
        await pilot.press("plus")  # half as long, about the middle
        await _charted(pilot, screen, (NOW - 45 * MIN, NOW - 15 * MIN))
        status = text_of(screen.query_one("#history-status"))
        assert "12-02 13:15→13:45 (30m00s)" in status and "[1h]" not in status  # the window, no preset
        await pilot.press("left_square_bracket")  # earlier by half the window
        await _charted(pilot, screen, (NOW - 60 * MIN, NOW - 30 * MIN))
        await pilot.press("right_square_bracket", "right_square_bracket", "right_square_bracket")
        await _charted(pilot, screen, (NOW - 30 * MIN, NOW))  # never past now
        await pilot.press("minus", "minus")
        await _charted(pilot, screen, (NOW - 2 * HOUR, NOW))
        await pilot.press("down", "enter")  # Enter on run 1 (ended): its own time range
        await _charted(pilot, screen, (info["r1_start"], info["r2_start"] - 1000))
        assert "12-02 08:00→10:59" in text_of(screen.query_one("#history-status"))
        await pilot.press("up", "g")  # g: the selected run's range, to now while it runs
        await _charted(pilot, screen, (info["r2_start"], NOW))
        await pilot.press("t")  # a preset again: 6h ending where run 2 ends (now)
        await _charted(pilot, screen, (NOW - 6 * HOUR, NOW))
        assert "[6h]" in text_of(screen.query_one("#history-status"))


async def test_narrow_status_line_keeps_the_window_and_the_run(sock_dir, steer_db):
    db, info = steer_db
    app = make_app(sock_dir / "absent.sock", db, utc=True)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_screen(pilot, app, "4", HistoryScreen, connected=False)
        await wait_for(pilot, lambda: len(screen.runs) == 2)
        status = screen.query_one("#history-status")
        await wait_for(pilot, lambda: screen.queried is not None)
        await wait_for(pilot, lambda: "run " in text_of(status))
        text = screen_text(app)
        assert "12-02 13:00→14:00 (1h00m)" in text and f"run {info['run2']} dsv41-tp8-ep" in text


def test_zoom_and_pan_limits():
    assert zoom(NOW - MIN, NOW, 0.5, NOW) == (NOW - MIN_WINDOW_MS, NOW)  # a minute at the closest
    start, end = zoom(NOW - 2 * HOUR, NOW - HOUR, 2, NOW)
    assert (start, end) == (NOW - 2 * HOUR - 30 * MIN, NOW - 30 * MIN)
    assert pan(NOW - HOUR, NOW, 1.0, NOW) == (NOW - HOUR, NOW)
