"""The Events, History and Compare views filter in SQL, say when a list is cut, and keep an unchanged list (s21).

The Events view read the newest 1,000 events and filtered those in Python: after a flood of info events (a
counter reset every scrape) "severity ≥ error" said "no events match" while the database held the errors. The
Compare dialog filtered the newest 1,000 bench results for its two runs, so older runs' curves went missing. The
Events table was cleared and refilled every 5 s with nothing new, throwing the operator's cursor back to the top.
The History list showed the newest 200 runs without saying so.

A real SQLite history written by the store's writer; the real app driven by Textual's Pilot (no agent: its socket
is absent, so the views read the database alone).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.tui import make_app, text_of, wait_for
from support.tui_keys import open_screen
from textual.widgets import DataTable
from tui_fake_agent import T0

from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.store.writer import StoreWriter
from lynxtop.tui.screens.compare import CompareScreen
from lynxtop.tui.screens.events import EventsScreen
from lynxtop.tui.screens.history import HistoryScreen

FLOOD = 5_000


def _writer(path: Path) -> StoreWriter:
    w = StoreWriter(path, clock=lambda: T0 / 1000)
    w.start()
    return w


@pytest.fixture(scope="module")
def flood_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 errors, then 5,000 info events newer than all of them (a counter reset every scrape)."""
    path = tmp_path_factory.mktemp("flood") / "history.db"
    w = _writer(path)
    base = T0 - 3_600_000
    for i in range(3):
        w.record(Event(EventKind.GPU_XID, Severity.ERROR, f"GPU {i} XID 79: fell off the bus", ts_ms=base + i))
    for i in range(FLOOD):
        w.record(Event(EventKind.SCRAPE_COUNTER_RESET, Severity.INFO, f"counter reset {i}",
                       ts_ms=base + 1_000 + i * 100))
        if i % 500 == 0:
            assert w.flush(30)
    w.close()
    return path


def _rows(screen: EventsScreen) -> list[list[str]]:
    table = screen.query_one("#events", DataTable)
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


async def test_errors_older_than_a_flood_of_info_events_are_found(sock_dir, flood_db):
    app = make_app(sock_dir / "absent.sock", flood_db, utc=True)
    async with app.run_test(size=(120, 36)) as pilot:
        screen = await open_screen(pilot, app, "5", EventsScreen, connected=False)
        await wait_for(pilot, lambda: len(_rows(screen)) == 1000, 60)
        filters = screen.query_one("#events-filters")
        await pilot.press("v", "v")  # severity ≥ warning, then ≥ error
        assert screen.min_severity == "error"
        await wait_for(pilot, lambda: len(_rows(screen)) == 3, 60)
        rows = _rows(screen)
        assert all(r[1].endswith("error") and r[2] == "gpu.xid" for r in rows), rows
        assert "no events match" not in text_of(filters)
        assert "newest 1000" not in text_of(filters), text_of(filters)  # all 3 matching read: nothing cut

        # a text and a kind family searched in the database too, not in the newest 1,000 rows
        await pilot.press("escape")
        await wait_for(pilot, lambda: len(_rows(screen)) == 1000, 60)
        assert "newest 1000" in text_of(filters), text_of(filters)  # the cut is said, as `lynxtop events` does
        await pilot.press("slash")
        await pilot.press(*"fell off", "enter")
        await wait_for(pilot, lambda: len(_rows(screen)) == 3, 60)
        await pilot.press("escape", "slash")
        await pilot.press(*"kind:gpu.", "enter")
        await wait_for(pilot, lambda: len(_rows(screen)) == 3, 60)
        assert {r[2] for r in _rows(screen)} == {"gpu.xid"}


async def test_a_refresh_with_nothing_new_keeps_the_table_and_its_cursor(sock_dir, flood_db):
    app = make_app(sock_dir / "absent.sock", flood_db, utc=True)
    async with app.run_test(size=(120, 36)) as pilot:
        screen = await open_screen(pilot, app, "5", EventsScreen, connected=False)
        await wait_for(pilot, lambda: len(_rows(screen)) == 1000, 60)
        table = screen.query_one("#events", DataTable)
        table.move_cursor(row=20)
        await pilot.pause()
        keys = list(table.rows)
        worker = screen.fetch_events()  # what the 5 s refresh does
        await wait_for(pilot, lambda: worker.is_finished, 60)
        await pilot.pause()
        assert table.cursor_row == 20  # a rebuild puts it back on row 0
        assert all(a is b for a, b in zip(keys, table.rows, strict=True)), "the table was cleared and refilled"

        # something new: the list is refilled and shows it
        w = _writer(flood_db)
        w.record(Event(EventKind.GPU_XID, Severity.CRITICAL, "GPU 7 XID 48: double bit ECC", ts_ms=T0))
        w.close()
        worker = screen.fetch_events()
        await wait_for(pilot, lambda: worker.is_finished, 60)
        await wait_for(pilot, lambda: "double bit ECC" in _rows(screen)[0][4], 60)


@pytest.fixture(scope="module")
def bench_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, int]:
    """Runs a and b with a sweep each, then a run with 1,001 bench results newer than both."""
    path = tmp_path_factory.mktemp("bench") / "history.db"
    w = _writer(path)
    ids = []
    for i, profile in enumerate(("tp8", "tp8-ep", "flood")):
        ids.append(w.create_run(profile=profile, argv=["vllm", "serve", "m"], model="m", host="h",
                                started_ms=T0 - 3_600_000 + i * 600_000, pid=10 + i, log_path="", simulated=True))
        w.update_run(ids[-1], ended_ms=T0 - 3_600_000 + i * 600_000 + 500_000, exit_code=0, end_reason="switch")
    a, b, flood = ids
    for run, scale in ((a, 1.0), (b, 1.5)):
        for conc in (1, 8):
            w.add_bench_result({"run_id": run, "name": "sharegpt", "concurrency": conc, "ts_ms": T0 - 3_000_000,
                                "bench_id": f"sweep-{run}", "output_tokens_per_s": 100.0 * conc * scale,
                                "ttft_p99_ms": 200.0 * conc, "num_prompts": 40})
    for i in range(1_001):
        w.add_bench_result({"run_id": flood, "name": "sharegpt", "concurrency": 1, "ts_ms": T0 - 1_000_000 + i,
                            "bench_id": f"flood-{i}", "output_tokens_per_s": 90.0})
    w.close()
    return path, a, b


async def test_compare_finds_bench_results_older_than_a_thousand_others(sock_dir, bench_db):
    db, a, b = bench_db
    app = make_app(sock_dir / "absent.sock", db, utc=True)
    async with app.run_test(size=(200, 60)) as pilot:
        app.push_screen(CompareScreen(a, b))
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.query("#compare-body"))
        body = app.screen.query_one("#compare-body")
        await wait_for(pilot, lambda: "same flags" in text_of(body) or "flag difference" in text_of(body), 60)
        text = text_of(body)
        assert "benchmark curves" in text, text
        lines = [ln.replace("│", " ").split() for ln in text.splitlines()]
        rows = {cells[0]: cells for cells in lines if cells and cells[0] in ("1", "8")}
        assert set(rows) == {"1", "8"}, text
        assert rows["8"][1] == "40", rows  # run a's level 8: its 40 requests


async def test_history_says_when_the_run_list_is_cut(sock_dir, tmp_path):
    db = tmp_path / "history.db"
    w = _writer(db)
    for i in range(205):
        run = w.create_run(profile=f"p{i}", argv=["vllm"], model="m", host="h", started_ms=T0 - 10_000_000 + i * 1000,
                           pid=100 + i, log_path="", simulated=True)
        w.update_run(run, ended_ms=T0 - 10_000_000 + i * 1000 + 500, exit_code=0, end_reason="switch")
    w.close()
    app = make_app(sock_dir / "absent.sock", db, utc=True)
    async with app.run_test(size=(160, 40)) as pilot:
        screen = await open_screen(pilot, app, "4", HistoryScreen, connected=False)
        table = screen.query_one("#runs", DataTable)
        await wait_for(pilot, lambda: table.row_count == 200, 60)
        status = screen.query_one("#history-status")
        await wait_for(pilot, lambda: "newest 200" in text_of(status), 30)
