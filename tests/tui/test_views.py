"""GPU, Latency, History (real SQLite), Events & logs, help and UTC: driven by Pilot."""

from __future__ import annotations

import csv

from support.tui import make_app, screen_text, text_of, wait_for
from support.tui_keys import open_screen
from support.waits import wait_for_async
from textual.widgets import DataTable, Input, Log, Static

from lynxtop.tui.screens.compare import CompareScreen
from lynxtop.tui.screens.events import EventsScreen
from lynxtop.tui.screens.export_path import ExportPathScreen
from lynxtop.tui.screens.gpu import GpuScreen
from lynxtop.tui.screens.help import HelpScreen
from lynxtop.tui.screens.history import HistoryScreen
from lynxtop.tui.screens.latency import LatencyScreen
from lynxtop.tui.widgets.gpu_table import GpuTable
from lynxtop.tui.widgets.time_chart import TimeChart


async def _history_with_runs(pilot, app) -> HistoryScreen:
    """The History view once both stored runs are listed: the keys tested there act on the selected run."""
    screen = await open_screen(pilot, app, "4", HistoryScreen, connected=False)
    await wait_for(pilot, lambda: len(screen.runs) == 2)
    return screen


async def _keys_on_runs(pilot, app, *keys: str) -> None:
    """Keys pressed with the runs table focused: c (compare) and e (export) act on its selected run."""
    screen = await _history_with_runs(pilot, app)
    screen.query_one("#runs", DataTable).focus()
    await pilot.press(*keys)


async def _filter_by(pilot, table: DataTable, box: Input, text: str) -> None:
    """/ on the focused table must give its filter box the focus, or the text typed would go to the keys."""
    table.focus()
    await pilot.press("slash")
    assert box.has_focus
    box.value = text
    await pilot.press("enter")


async def test_gpu_view_arrows_choose_gpu_and_charts_backfill(agent, history_db):
    db, _ = history_db
    app = make_app(agent.socket_path, db, backfill=True, utc=True)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: app.state.connected and len(app.state.gpu_history.get(0, ())) > 50)
        await open_screen(pilot, app, "2", GpuScreen, connected=False)
        await wait_for(pilot, lambda: "GPU 0" in text_of(app.screen.query_one("#gpu-title")))
        await pilot.press("right", "right")
        await wait_for(pilot, lambda: app.gpu_index == 2 and "GPU 2" in text_of(app.screen.query_one("#gpu-title")))
        await pilot.press("left", "left", "left")
        await wait_for(pilot, lambda: app.gpu_index == 7)  # wraps around
        chart = app.screen.query_one("#chart-sm", TimeChart)
        # 15 minutes of stored samples (every 10 s) plus the live one
        assert len(chart.points) >= 90
        assert "SM activity" in screen_text(app)


async def test_enter_on_gpu_row_opens_gpu_view(agent):
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 36)) as pilot:
        table = app.screen.query_one("#gpus", GpuTable)
        await wait_for(pilot, lambda: table.row_count == 8)
        table.focus()
        await pilot.press("down", "down", "down", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, GpuScreen))
        assert app.gpu_index == 3


async def test_latency_view_marks_breaches_against_sla(agent, history_db):
    db, _ = history_db
    app = make_app(agent.socket_path, db, backfill=True, utc=True)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: len(app.state.serving_history) > 50)
        await open_screen(pilot, app, "3", LatencyScreen, connected=False)
        await wait_for(pilot, lambda: "▲" in screen_text(app))  # the stored breaches drawn
        chart = app.screen.query_one("#chart-ttft-p99", TimeChart)
        assert chart.threshold == 2000
        text = screen_text(app)
        assert "TTFT p99 ≤ 2.00 s" in text
        assert "breach" in text and "▲" in text  # the 3 s spikes in the stored history
        tpot = app.screen.query_one("#chart-tpot-p99", TimeChart)
        assert tpot.threshold == 150


async def test_history_lists_runs_charts_ranges_and_works_without_agent(sock_dir, history_db):
    db, info = history_db
    app = make_app(sock_dir / "absent.sock", db, utc=True)
    async with app.run_test(size=(120, 36)) as pilot:
        screen = await _history_with_runs(pilot, app)
        await wait_for(pilot, lambda: screen.last_draw_ms is not None)
        table = screen.query_one("#runs", DataTable)
        assert [r.value for r in table.rows] == [str(info["run2"]), str(info["run1"])]
        chart = screen.query_one("#hchart-ttft", TimeChart)
        assert chart.points and max(v for _, v in chart.points if v is not None) == 3000
        status = text_of(screen.query_one("#history-status"))
        assert "[1h]" in status
        for _ in range(4):
            await pilot.press("t")
        await wait_for(pilot, lambda: "[30d]" in text_of(screen.query_one("#history-status")))
        await pilot.press("t")
        await wait_for(pilot, lambda: "[run]" in text_of(screen.query_one("#history-status")))
        await wait_for(pilot, lambda: chart.start_ms == info["mid"])  # the whole of the running run
        # the agent is down, history still works
        assert app.state.outage is not None
        await _filter_by(pilot, table, screen.query_one("#runs-filter", Input), "-ep")
        assert [r.value for r in table.rows] == [str(info["run2"])]
        assert "1 of 2 runs" in text_of(screen.query_one("#history-status"))
        await pilot.press("escape")
        assert table.row_count == 2


async def test_history_compare_two_runs(sock_dir, history_db):
    db, _ = history_db
    app = make_app(sock_dir / "absent.sock", db, utc=True)
    async with app.run_test(size=(120, 36)) as pilot:
        await _keys_on_runs(pilot, app, "c", "down", "c")
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen))
        body = app.screen.query_one("#compare-body")
        await wait_for(pilot, lambda: "flag difference" in text_of(body))
        text = text_of(body)
        assert "2 flag difference(s)" in text and "--enable-expert-parallel" in text
        assert "262144" in text and "131072" in text
        assert "generation_tokens_per_s" in text and "ttft_p99_ms" in text
        assert "gpus.sm_active_pct (mean)" in text and "gpus.count" in text
        assert "benchmark curves" in text and "4.16k" in text and "3.20k" in text  # 32 x 100 x 1.3 and x 1.0
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen))


async def test_history_export_writes_csv_and_refuses_overwrite(sock_dir, history_db, tmp_path):
    db, info = history_db
    app = make_app(sock_dir / "absent.sock", db, utc=True)
    target = tmp_path / "run.csv"
    async with app.run_test(size=(120, 36)) as pilot:
        await _keys_on_runs(pilot, app, "down", "e")  # run 1 (ended)
        await wait_for(pilot, lambda: isinstance(app.screen, ExportPathScreen))
        box = app.screen.query_one("#export-path", Input)
        box.value = str(target)
        await pilot.press("enter")
        await wait_for(pilot, lambda: any("rows written" in n.message for n in app._notifications), timeout_s=10)
        with open(target) as f:
            rows = list(csv.DictReader(f))
        assert rows and rows[0]["time_utc"].endswith("Z") and "sm_active_pct" in rows[0]
        assert {r["gpu"] for r in rows} == {str(g) for g in range(8)}
        assert all(info["start"] <= int(r["ts_ms"]) < info["mid"] for r in rows)
        size = target.stat().st_size
        # a second export to the same path is refused in the dialog and changes nothing
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, ExportPathScreen))
        app.screen.query_one("#export-path", Input).value = str(target)
        await pilot.press("enter")
        await wait_for(pilot, lambda: "already exists" in text_of(app.screen.query_one("#export-error")))
        assert isinstance(app.screen, ExportPathScreen)
        assert target.stat().st_size == size
        await pilot.press("escape")


async def test_history_unavailable_is_explained(sock_dir, tmp_path):
    bad = tmp_path / "not-a-db.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    app = make_app(sock_dir / "absent.sock", bad)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("4")
        screen = app.screen
        await wait_for(pilot, lambda: screen.error is not None)
        text = text_of(screen.query_one("#history-status"))
        assert "history unavailable" in text and str(bad) in text
    assert bad.read_bytes() == b"this is not sqlite" * 100  # never touched


async def test_events_filters_and_log_search(agent, history_db):
    db, _ = history_db
    app = make_app(agent.socket_path, db, utc=True)
    async with app.run_test(size=(120, 36)) as pilot:
        screen = await open_screen(pilot, app, "5", EventsScreen, connected=False)
        table = screen.query_one("#events", DataTable)
        await wait_for(pilot, lambda: table.row_count == 4)
        assert "history database" in text_of(screen.query_one("#events-filters"))
        await pilot.press("v")  # >= warning
        assert table.row_count == 3
        await pilot.press("v")  # >= error
        assert table.row_count == 2
        await pilot.press("v", "v")  # back to info
        assert table.row_count == 4
        await pilot.press("K")  # first kind family alphabetically: action.* (action.switch)
        assert screen.kind == "action." and table.row_count == 1
        await pilot.press("K")
        assert screen.kind == "gpu." and table.row_count == 1
        await pilot.press("K", "K", "K")  # serving.*, sla.*, all
        assert screen.kind is None and table.row_count == 4
        box = screen.query_one("#filter", Input)
        await _filter_by(pilot, table, box, "xid")
        assert table.row_count == 1
        await pilot.press("escape")
        assert table.row_count == 4
        log = screen.query_one("#log", Log)
        await wait_for(pilot, lambda: log.line_count >= 41)
        log.focus()
        await pilot.press("slash")
        box.value = "uvicorn"
        await pilot.press("enter")
        await wait_for(pilot, lambda: log.line_count == 1)
        assert "1 of 41 lines" in text_of(screen.query_one("#log-title"))


async def test_events_from_agent_when_no_database(agent, sock_dir):
    app = make_app(agent.socket_path, sock_dir / "missing.db")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("5")
        screen = app.screen
        table = screen.query_one("#events", DataTable)
        await wait_for(pilot, lambda: table.row_count == 3)
        assert "agent (history unavailable" in text_of(screen.query_one("#events-filters"))


async def test_help_lists_every_key_and_utc_toggle(agent):
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        help_screen = await open_screen(pilot, app, "question_mark", HelpScreen)
        keys = {k for k, _ in help_screen.keys}
        assert {"q", "?", "1", "2", "3", "4", "5", "R", "X", "S", "P", "u", "p", "r"} <= keys
        help_text = "".join(text_of(w) for w in app.screen.query(Static))
        assert "utilization.gpu" in help_text and "N/A = not readable" in help_text and "Restart" in help_text
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen))
        assert app.utc is False
        await pilot.press("u")
        assert app.utc is True
        await pilot.press("4")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen))
        await wait_for(pilot, lambda: "UTC" in text_of(app.screen.query_one("#header")))


async def test_q_quits(agent):
    app = make_app(agent.socket_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("q")
        await wait_for_async(lambda: not app.is_running, 30, what="the app to exit")
    assert app.return_code in (0, None)
    assert not app.is_running


async def test_typing_in_a_filter_box_never_triggers_keys(agent, history_db):
    db, _ = history_db
    app = make_app(agent.socket_path, db)
    async with app.run_test(size=(120, 36)) as pilot:
        screen = await open_screen(pilot, app, "5", EventsScreen)
        await pilot.press("slash")
        await pilot.press(*"qRXSP14")
        assert screen.query_one("#filter", Input).value == "qRXSP14"
        assert app.is_running and isinstance(app.screen, EventsScreen)
        assert agent.posts() == []
