"""The GPU table sorted by any column (htop F6/I), and the events filtered, searched and opened (issue 28.4)."""

from __future__ import annotations

from pathlib import Path

import pytest
from steer_history import build_steer_history
from support.tui import make_app, screen_text, text_of, wait_for
from support.tui_keys import open_screen
from textual.widgets import DataTable, Input

from lynxtop.tui.screens.event_detail import EventDetailScreen, field
from lynxtop.tui.screens.events import EventsScreen
from lynxtop.tui.widgets.gpu_table import GpuTable


async def test_gpu_table_sorts_by_a_column_keeps_its_gpu_and_survives_live_updates(agent):
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 40)) as pilot:
        table = app.screen.query_one("#gpus", GpuTable)
        await wait_for(pilot, lambda: table.row_count == 8)
        assert table.order == list(range(8)) and "▲" not in text_of(table)  # GPU order, unmarked
        table.focus()
        await pilot.press("down", "down")
        assert table.selected_gpu == 2
        await pilot.press("s")  # SM activity (60 + index), busiest first
        assert table.order == [7, 6, 5, 4, 3, 2, 1, 0]
        assert table.selected_gpu == 2  # the cursor stays on its GPU, not its row number
        header = text_of(table).splitlines()[0]
        assert "SM act▼" in header and "GPU▲" not in header
        # a live update: GPU 0 becomes the busiest; the sort holds and re-orders by the new readings
        agent.status["gpus"][0]["sm_active_pct"] = 99
        await wait_for(pilot, lambda: table.order[0] == 0)
        assert table.order == [0, 7, 6, 5, 4, 3, 2, 1] and table.selected_gpu == 2
        assert "SM act▼" in text_of(table).splitlines()[0]
        assert str(table.get_row("0")[1]).strip().endswith("99%")  # rows stay keyed by GPU index
        await pilot.press("I")
        assert table.order == [1, 2, 3, 4, 5, 6, 7, 0] and "SM act▲" in text_of(table).splitlines()[0]
        await pilot.press("enter")  # opens the GPU under the cursor, wherever the sort put it
        await wait_for(pilot, lambda: app.current_mode == "gpu")
        assert app.gpu_index == 2


async def test_gpu_sort_puts_missing_readings_last_and_cycles_back_to_index_order(agent):
    agent.status["gpus"][3]["temp_c"] = None
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 40)) as pilot:
        table = app.screen.query_one("#gpus", GpuTable)
        await wait_for(pilot, lambda: table.row_count == 8)
        table.focus()
        keys = [k for k in table._visible_keys()]
        for _ in range(keys.index("temp")):
            await pilot.press("s")
        assert table.sort_key == "temp" and table.order[-1] == 3  # N/A last, descending
        await pilot.press("I")
        assert table.order[-1] == 3 and table.order[:2] == [0, 1]  # ... and ascending
        for _ in range(len(keys) - keys.index("temp")):
            await pilot.press("s")
        assert table.sort_key == "gpu" and table.order == list(range(8))


@pytest.fixture(scope="module")
def steer_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    path = tmp_path_factory.mktemp("events") / "history.db"
    return path, build_steer_history(path)


def _filters(app) -> str:
    return text_of(app.screen.query_one("#events-filters"))


async def _filter(pilot, app, text: str) -> None:
    app.screen.query_one("#events", DataTable).focus()
    await pilot.press("slash")
    box = app.screen.query_one("#filter", Input)
    assert box.has_focus
    box.value = text
    await pilot.press("enter")


async def test_events_filter_by_kind_family_severity_and_text_with_counts(sock_dir, steer_db):
    db, info = steer_db
    app = make_app(sock_dir / "absent.sock", db, utc=True)
    async with app.run_test(size=(160, 40)) as pilot:
        screen = await open_screen(pilot, app, "5", EventsScreen, connected=False)
        await wait_for(pilot, lambda: len(screen.events) == info["events"])
        table = screen.query_one("#events", DataTable)
        assert table.row_count == 5 and "events 5/5" in _filters(app)
        table.focus()
        await pilot.press("K")  # families in order: action., gpu., serving., sla.
        # the filter is read in SQL: the count settles at shown / read for that filter (session 21)
        await wait_for(pilot, lambda: "events 1/1" in _filters(app))
        assert screen.kind == "action." and table.row_count == 1
        await pilot.press("K", "K")
        assert [str(field(e, "kind")) for e in screen.shown] == ["serving.ready", "serving.starting"]
        assert "kind (K): serving.*" in _filters(app)
        await _filter(pilot, app, "kind:serving. ready")  # a family and a word
        await wait_for(pilot, lambda: "events 1/1" in _filters(app))
        assert [str(field(e, "kind")) for e in screen.shown] == ["serving.ready"]
        await _filter(pilot, app, "kind:all sev:error")
        await wait_for(pilot, lambda: "events 2/2" in _filters(app))
        assert [str(field(e, "kind")) for e in screen.shown] == ["sla.breach", "gpu.xid"]
        await _filter(pilot, app, "sev:loud")  # a mistake: said, nothing changed
        await wait_for(pilot, lambda: any("sev:loud" in str(n.message) for n in app._notifications))
        assert screen.min_severity == "error" and table.row_count == 2
        assert screen.query_one("#filter", Input).has_focus  # the box stays open with what was typed
        await pilot.press("escape")  # clears every filter
        assert table.row_count == 5 and screen.kind is None and screen.min_severity == "info"


async def test_enter_on_an_event_shows_its_message_details_and_run_escaped(sock_dir, steer_db):
    db, info = steer_db
    app = make_app(sock_dir / "absent.sock", db, utc=True)
    async with app.run_test(size=(160, 50)) as pilot:
        screen = await open_screen(pilot, app, "5", EventsScreen, connected=False)
        await wait_for(pilot, lambda: len(screen.events) == info["events"])
        table = screen.query_one("#events", DataTable)
        table.focus()
        await pilot.press("down", "enter")  # newest first: sla.breach, then gpu.xid
        await wait_for(pilot, lambda: isinstance(app.screen, EventDetailScreen))
        body = app.screen.query_one("#event-body")
        await wait_for(pilot, lambda: "dsv41-tp8-ep" in text_of(body))
        text = text_of(body)
        assert "GPU 1 XID 79: fell off the bus" in text and "\x1b" not in screen_text(app)
        assert "[bold]x[/]" in text and "[red]not markup[/]" in text  # shown as written, not parsed
        assert '"xid": 79' in text and '  "gpu": 1' in text  # details as indented JSON
        assert f"run {info['run2']}: dsv41-tp8-ep" in text and "started 2026-" in text and "running for" in text
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, EventsScreen))
        await pilot.press("up", "enter")  # the long message, whole
        await wait_for(pilot, lambda: isinstance(app.screen, EventDetailScreen))
        body = app.screen.query_one("#event-body")
        await wait_for(pilot, lambda: "limit_ms" in text_of(body))
        assert ("long words " * 30).strip() in " ".join(text_of(body).split())


async def test_event_detail_reads_a_run_the_list_does_not_carry(sock_dir, steer_db):
    db, info = steer_db
    app = make_app(sock_dir / "absent.sock", db, utc=True)
    async with app.run_test(size=(160, 50)) as pilot:
        screen = await open_screen(pilot, app, "5", EventsScreen, connected=False)
        await wait_for(pilot, lambda: len(screen.events) == info["events"])
        screen.runs = []  # as when the events came from the agent: the run is read from the history
        screen.query_one("#events", DataTable).focus()
        await pilot.press("down", "down", "down", "down", "enter")  # the oldest: serving.starting of run 1
        await wait_for(pilot, lambda: isinstance(app.screen, EventDetailScreen))
        body = app.screen.query_one("#event-body")
        await wait_for(pilot, lambda: f"run {info['run1']}: dsv41-tp8" in text_of(body))
        assert "ended 2026-" in text_of(body) and "(switch)" in text_of(body)
