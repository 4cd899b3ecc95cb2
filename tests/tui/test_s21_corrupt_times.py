"""A stored time past year 9999 (a corrupt ts_ms / started_ms, 2**62, from a node with a wild clock) in the history
database: the Events and History views list every row, the corrupt one with a `<bad time N>` marker, and the app
keeps running. Before, fmt_datetime raised inside the Events view's fill worker and its table stayed empty with no
error said. Real SQLite written by StoreWriter, the real app."""

from __future__ import annotations

import contextlib
from pathlib import Path

from support.tui import make_app, wait_for
from support.tui_keys import open_screen
from textual.widgets import DataTable
from tui_fake_agent import T0

from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.store.writer import StoreWriter
from lynxtop.tui.screens.events import EventsScreen
from lynxtop.tui.screens.history import HistoryScreen

BAD = 2**62
MARK = f"<bad time {BAD}>"


def _db(path: Path) -> Path:
    w = StoreWriter(path, clock=lambda: T0 / 1000)
    w.start()
    run = w.create_run(profile="p", model="m", started_ms=BAD)
    w.record(Event(EventKind.SERVING_READY, Severity.INFO, "good", ts_ms=T0 - 60_000))
    w.record(Event(EventKind.SERVING_READY, Severity.INFO, "corrupt", run_id=run, ts_ms=BAD))
    w.close()
    return path


def _cells(table: DataTable) -> list[str]:
    return [str(cell) for row in range(table.row_count) for cell in table.get_row_at(row)]


async def _events_view_lists_both(sock_dir: Path, path: Path, utc: bool) -> None:
    app = make_app(sock_dir / "absent.sock", path, utc=utc)
    async with app.run_test(size=(120, 36)) as pilot:
        screen = await open_screen(pilot, app, "5", EventsScreen, connected=False)
        table = screen.query_one("#events", DataTable)
        await wait_for(pilot, lambda: len(screen.events) == 2, 60)  # both read from the database
        with contextlib.suppress(AssertionError):
            await wait_for(pilot, lambda: table.row_count == 2 or app._exception is not None, 30)
        assert app._exception is None, repr(app._exception)
        assert table.row_count == 2, "the Events view read 2 events and shows fewer"
        cells = _cells(table)
        assert any(MARK in c for c in cells), cells
        assert any("good" in c for c in cells) and any("corrupt" in c for c in cells), cells


async def test_events_view_lists_a_corrupt_event_time_as_a_marker_utc(sock_dir, tmp_path: Path):
    await _events_view_lists_both(sock_dir, _db(tmp_path / "history.db"), utc=True)


async def test_events_view_lists_a_corrupt_event_time_as_a_marker_local(sock_dir, tmp_path: Path):
    await _events_view_lists_both(sock_dir, _db(tmp_path / "history.db"), utc=False)


async def test_history_view_lists_a_run_with_a_corrupt_start(sock_dir, tmp_path: Path):
    app = make_app(sock_dir / "absent.sock", _db(tmp_path / "history.db"), utc=False)
    async with app.run_test(size=(200, 48)) as pilot:
        screen = await open_screen(pilot, app, "4", HistoryScreen, connected=False)
        table = screen.query_one("#runs", DataTable)
        with contextlib.suppress(AssertionError):
            await wait_for(pilot, lambda: table.row_count == 1 or app._exception is not None, 60)
        await pilot.pause(0.5)
        assert app._exception is None, repr(app._exception)
        assert table.row_count == 1, "the History view lists no run"
        assert any(MARK in c for c in _cells(table)), _cells(table)
