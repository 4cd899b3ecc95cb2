"""Operator walkthrough, session 24: the History view follows a new run when it was on the newest one (its charts
ended where an old run ended, read as stale data); j/k move the cursor in the History and Processes lists as in
the Node view's GPU table, and Help lists them; Help's multi-key rows (Quit) fit one line at 80 and 120 columns."""

from __future__ import annotations

from pathlib import Path

import pytest
from steer_history import HOUR, build_steer_history
from support.status import T0
from support.tui import make_app, screen_text, text_of, wait_for
from support.tui_keys import open_screen
from textual.widgets import DataTable

from lynxtop.tui.screens.help import HelpScreen
from lynxtop.tui.screens.history import HistoryScreen
from lynxtop.tui.screens.node import NodeScreen
from lynxtop.tui.screens.processes import ProcessesScreen

NOW = T0 + 2000  # make_app's clock


@pytest.fixture
def steer_db(tmp_path: Path) -> tuple[Path, dict]:
    path = tmp_path / "history.db"
    return path, build_steer_history(path)


def _new_run(path: Path, ended: int) -> int:
    """Run `ended` ends (a restart) and a new run starts now, written to the real SQLite file by a writer of its own,
    as the agent would while the dashboard shows another view."""
    from lynxtop.store.writer import StoreWriter

    w = StoreWriter(path, clock=lambda: NOW / 1000)
    w.start()
    try:
        w.update_run(ended, ended_ms=NOW - 60_000, exit_code=0, end_reason="restart")
        return w.create_run(profile="dsv41-tp8-ep", argv=["vllm", "serve", "m"], model="deepseek-ai/DeepSeek-V4.1",
                            host="h200-node-07", started_ms=NOW - 30_000, pid=13, log_path="", simulated=True,
                            flags={})
    finally:
        w.close()


def _cursor_run(screen: HistoryScreen) -> str | None:
    table = screen.query_one("#runs", DataTable)
    if not table.row_count:
        return None
    return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value


async def test_selection_on_the_newest_run_follows_a_new_run(sock_dir, steer_db):
    db, info = steer_db
    app = make_app(sock_dir / "absent.sock", db, utc=True)
    async with app.run_test(size=(160, 40)) as pilot:
        screen = await open_screen(pilot, app, "4", HistoryScreen, connected=False)
        await wait_for(pilot, lambda: len(screen.runs) == 2 and screen.selected is not None)
        assert screen.selected.id == info["run2"]  # opened on the newest run by default
        await open_screen(pilot, app, "1", NodeScreen, connected=False)
        run3 = _new_run(db, info["run2"])  # a restart while the operator looks elsewhere
        await open_screen(pilot, app, "4", HistoryScreen, connected=False)
        await wait_for(pilot, lambda: len(screen.runs) == 3)
        await wait_for(pilot, lambda: screen.selected is not None and screen.selected.id == run3
                       and _cursor_run(screen) == str(run3))
        # the charts follow: the 1h preset ending now (run 3 runs), not where run 2 ended
        await wait_for(pilot, lambda: screen.queried == (NOW - HOUR, NOW))
        await wait_for(pilot, lambda: f"run {run3} " in text_of(screen.query_one("#history-status")))
        # the operator picks the newest run themselves (after looking at an older one): it follows as well
        screen.query_one("#runs", DataTable).focus()
        await pilot.press("down")
        await wait_for(pilot, lambda: screen.selected.id == info["run2"])
        await pilot.press("up")
        await wait_for(pilot, lambda: screen.selected.id == run3)
        run4 = _new_run(db, run3)
        await pilot.press("f5")
        await wait_for(pilot, lambda: len(screen.runs) == 4)
        await wait_for(pilot, lambda: screen.selected.id == run4 and _cursor_run(screen) == str(run4))


async def test_an_older_run_chosen_by_the_operator_stays_selected(sock_dir, steer_db):
    db, info = steer_db
    app = make_app(sock_dir / "absent.sock", db, utc=True)
    async with app.run_test(size=(160, 40)) as pilot:
        screen = await open_screen(pilot, app, "4", HistoryScreen, connected=False)
        await wait_for(pilot, lambda: len(screen.runs) == 2 and screen.selected is not None)
        screen.query_one("#runs", DataTable).focus()
        await pilot.press("down")  # the operator studies run 1 (ended)
        await wait_for(pilot, lambda: screen.selected.id == info["run1"])
        await open_screen(pilot, app, "1", NodeScreen, connected=False)
        _new_run(db, info["run2"])
        await open_screen(pilot, app, "4", HistoryScreen, connected=False)
        await wait_for(pilot, lambda: len(screen.runs) == 3)
        await pilot.pause()
        assert screen.selected.id == info["run1"] and _cursor_run(screen) == str(info["run1"])


async def test_j_and_k_move_the_history_run_list_and_help_lists_them(sock_dir, steer_db):
    db, info = steer_db
    app = make_app(sock_dir / "absent.sock", db, utc=True)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_screen(pilot, app, "4", HistoryScreen, connected=False)
        await wait_for(pilot, lambda: len(screen.runs) == 2 and screen.selected is not None)
        screen.query_one("#runs", DataTable).focus()
        await pilot.press("j")
        await wait_for(pilot, lambda: screen.selected.id == info["run1"])
        assert _cursor_run(screen) == str(info["run1"])
        await pilot.press("k")
        await wait_for(pilot, lambda: screen.selected.id == info["run2"])
        await open_screen(pilot, app, "question_mark", HelpScreen, connected=False)
        keys = dict(app.screen.keys)
        assert keys.get("k") == keys.get("up") == "Up" and keys.get("j") == keys.get("down") == "Down", keys
        text = screen_text(app)
        assert any("up, k" in line and "Up" in line for line in text.splitlines()), text
        assert any("down, j" in line and "Down" in line for line in text.splitlines()), text


async def test_j_and_k_move_the_processes_list(agent):
    app = make_app(agent.socket_path, utc=True)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_screen(pilot, app, "7", ProcessesScreen)
        table = screen.query_one("#procs", DataTable)
        await wait_for(pilot, lambda: table.row_count == 9)
        table.focus()
        await pilot.press("j", "j")
        await wait_for(pilot, lambda: table.cursor_row == 2)
        await pilot.press("k")
        await wait_for(pilot, lambda: table.cursor_row == 1)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_help_rows_are_one_line_each(agent, size):
    app = make_app(agent.socket_path, utc=True)
    async with app.run_test(size=size) as pilot:
        await open_screen(pilot, app, "question_mark", HelpScreen)
        await pilot.pause()
        lines = screen_text(app).splitlines()
        quit_lines = [line for line in lines if "Quit" in line]
        assert quit_lines, lines
        quit_keys = next(k for k, d in _merged(app.screen.keys) if d == "Quit")
        assert "," in quit_keys  # the row this is about: several keys
        assert any(quit_keys in line for line in quit_lines), (quit_keys, quit_lines)
        # no row of keys folded onto a second line: each visible row's keys and words on one line
        for k, d in _merged(app.screen.keys):
            if any(d in line for line in lines):
                assert any(k in line and d in line for line in lines), (k, d, lines)


def _merged(keys: list[tuple[str, str]]) -> list[tuple[str, str]]:
    from lynxtop.tui.screens.help import merged_keys

    return merged_keys(keys)
