"""The Logs (6) and Processes (7) views at 80x24, 120x40 and 200x60 through the committed snapshot harness
(tests/tui/test_snapshots.py), and their key bars whole at 80x24. Update with --snapshot-update and review."""

from __future__ import annotations

from support.tui import make_app, screen_text, wait_for
from test_snapshots import settle, snap_screen, three_sizes  # noqa: F401 - the harness (its fixture by name)
from textual.widgets import DataTable

from lynxtop.tui.app import LynxtopApp
from lynxtop.tui.screens.help import HelpScreen
from lynxtop.tui.screens.logs import LogsScreen
from lynxtop.tui.screens.processes import ProcessesScreen
from lynxtop.tui.widgets.follow_log import FollowLog
from lynxtop.tui.widgets.key_bar import RANK_VIEWS, KeyBar, key_items

LOG = [*(f"INFO 12-02 09:{i:02d}:00 [loader.py] loading shard {i}/64" for i in range(40)),
       "WARNING 12-02 09:58:00 [scheduler.py] KV cache 97% full: preempting 3 requests",
       "ERROR 12-02 09:59:00 [engine.py] [bold]engine core died \\x1b[31m (lone [ kept)",
       "INFO 12-02 10:00:00 [api_server.py] Uvicorn running on http://127.0.0.1:8000"]


async def _logs(pilot) -> None:
    await pilot.press("6")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, LogsScreen))
    log = pilot.app.screen.query_one(FollowLog)
    await wait_for(pilot, lambda: len(log.lines) == len(LOG) and log.scroll_y == log.max_scroll_y)


async def _processes(pilot) -> None:
    await pilot.press("7")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ProcessesScreen))
    table = pilot.app.screen.query_one("#procs", DataTable)
    await wait_for(pilot, lambda: table.row_count == 9 and "supervised vLLM: 6.00 GiB" in screen_text(pilot.app))


@three_sizes
def test_logs_view(snap_screen, agent, size):  # noqa: F811 - the harness's fixture, imported above
    agent.log_lines = list(LOG)
    assert snap_screen(_logs, size)


@three_sizes
def test_processes_view(snap_screen, size):  # noqa: F811 - the harness's fixture, imported above
    assert snap_screen(_processes, size)


async def test_key_bars_keys_whole_at_80x24(agent):
    """Each view's bar at 80 columns shows whole keys, and what it leaves out `?` lists."""
    for opener in (_logs, _processes):
        agent.log_lines = list(LOG)
        app: LynxtopApp = make_app(agent.socket_path, None, utc=True, poll_interval_s=3600)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await opener(pilot)
            bar = app.screen.query_one(KeyBar)
            rows = screen_text(app).splitlines()[bar.region.y:bar.region.bottom]
            every = key_items(app.screen.active_bindings.values(), app)
            assert bar.shown and not any("…" in row for row in rows), rows
            left_out = [item for item in every if item not in bar.shown]
            await pilot.press("question_mark")
            await wait_for(pilot, lambda a=app: isinstance(a.screen, HelpScreen))
            listed = {description for _, description in app.screen.keys}
            assert all(item.description in listed or item.rank == RANK_VIEWS for item in left_out), left_out
