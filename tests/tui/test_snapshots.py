"""SVG snapshots of every screen at 80×24, 120×40 and 200x60 (pytest-textual-snapshot; textual pinned exactly).

Data and clock are frozen: the fake agent serves one fixed status, the history database is built at fixed
timestamps (and named by a relative path), the app's clock (and the store reader's, which measures a running
run) is fixed, times are UTC, the agent is polled once, live charts are backfilled from the database before
the shot, and toasts are cleared (their timeouts run on the wall clock). Update after an intended change with
`pytest tests/tui/test_snapshots.py --snapshot-update` and review the SVGs (snapshot_report.html shows each
next to the old one).

Adding a screen (other test files may do the same with the fixtures below):

    async def _open_mine(pilot) -> None:      # from the Node view, connected and backfilled
        await pilot.press("x")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, MyScreen))

    SCREENS["mine"] = _open_mine              # here: snapshots at the three sizes
    VIEWS.append("mine")                      # a view (not a dialog): its key bar is checked at 80x24 too

or, in a test file of your own:

    @three_sizes
    def test_my_screen(snap_screen, size):
        assert snap_screen(_open_mine, size)

`snap_screen(open, size, status=None)` sets the fake agent's status when given, starts the app, waits for it to
settle, runs `open` and settles again. Keep an opener deterministic: wait on conditions, never on time alone.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from rich.cells import cell_len
from support.status import T0, engine_loads
from support.tui import make_app, screen_text, text_of, wait_for
from textual.widgets import DataTable, Input, Log
from tui_fake_agent import make_status

from lynxtop.store import reader as store_reader
from lynxtop.tui.screens.base import LiveScreen
from lynxtop.tui.screens.compare import CompareScreen
from lynxtop.tui.screens.confirm import ConfirmScreen
from lynxtop.tui.screens.export_path import ExportPathScreen
from lynxtop.tui.screens.help import HelpScreen
from lynxtop.tui.screens.history import HistoryScreen
from lynxtop.tui.screens.profile_picker import ProfilePickerScreen
from lynxtop.tui.widgets.gpu_table import UTIL_NOTE
from lynxtop.tui.widgets.key_bar import RANK_VIEWS, KeyBar, key_items

SIZES = [(80, 24), (120, 40), (200, 60)]
Opener = Callable[[Any], Awaitable[None]]
three_sizes = pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")


class _FrozenTime:
    """The store reader's `time` module with the app's frozen clock: it measures a running run to now."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def time() -> float:
        return T0 / 1000 + 2


def _app(agent, db=None):
    # One poll only (at start): each poll adds a point to the live series, so more polls, another picture.
    return make_app(agent.socket_path, db, utc=True, poll_interval_s=3600, backfill=db is not None)


async def settle(pilot) -> None:
    """Wait until what the screen shows no longer depends on when the shot is taken."""
    app = pilot.app
    await wait_for(pilot, lambda: app.state.connected)
    if app.history.path is not None:  # the live charts' backfill (a thread) has landed
        await wait_for(pilot, lambda: len(app.state.gpu_history.get(0, ())) > 50)
    screen = app.screen
    if isinstance(screen, LiveScreen):
        screen.redraw()  # with the backfilled series, without waiting for a poll
    if isinstance(screen, LiveScreen) and screen.has_class("-tall") and hasattr(screen, "fetch_events"):
        await wait_for(pilot, lambda: getattr(screen, "events", None) is not None)  # its own worker
    if isinstance(screen, HistoryScreen):
        await wait_for(pilot, lambda: screen.last_draw_ms is not None)
    await pilot.pause()  # the redraw's messages handled (the app idle), not a fixed time
    # A DataTable measures new rows' column widths when idle: a table filled just before a dialog opened over
    # it was shot with unmeasured (label-wide) columns now and then. Wait for every table in the stack.
    tables = [t for layer in app.screen_stack for t in layer.query(DataTable)]
    await wait_for(pilot, lambda: not any(t._require_update_dimensions or t._new_rows for t in tables))
    app.clear_notifications()
    await wait_for(pilot, lambda: not any(layer.query("Toast") for layer in app.screen_stack))


@pytest.fixture
def snap_screen(snap_compare, agent, history_db, monkeypatch) -> Callable[..., bool]:
    """Snapshot one screen: `snap_screen(open, size)`; `status` replaces the fake agent's status first."""
    db, _ = history_db
    monkeypatch.chdir(db.parent)  # views that name the database show "history.db", not a random temp path
    db = type(db)(db.name)
    monkeypatch.setattr(store_reader, "time", _FrozenTime())  # a running run's length in Compare

    def snap(open_screen: Opener | None, size: tuple[int, int], status: dict[str, Any] | None = None) -> bool:
        if status is not None:
            agent.status = status

        async def run_before(pilot) -> None:
            await settle(pilot)
            if open_screen is not None:
                await open_screen(pilot)
                await settle(pilot)
            for field in pilot.app.screen.query(Input):
                field.cursor_blink = False  # a blink timer would pick the cursor's half-second under load
            await pilot.pause()

        return snap_compare(_app(agent, db), terminal_size=size, run_before=run_before)

    return snap


# ---------------------------------------------------------------------------------------------- the screens
def _key(key: str, screen: type) -> Opener:
    async def open_it(pilot) -> None:
        await pilot.press(key)
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, screen))
    return open_it


def _view(key: str) -> Opener:
    async def open_it(pilot) -> None:
        before = pilot.app.current_mode
        await pilot.press(key)
        await wait_for(pilot, lambda: pilot.app.current_mode != before)
    return open_it


async def _history(pilot) -> HistoryScreen:
    await _view("4")(pilot)
    screen = pilot.app.screen
    await wait_for(pilot, lambda: len(screen.runs) == 2 and screen.last_draw_ms is not None)
    table = screen.query_one("#runs", DataTable)
    table.focus()
    # its columns measured (on idle) before a dialog covers it: the profile column holds "dsv41-tp8-ep SIM"
    await wait_for(pilot, lambda: max((c.content_width for c in table.columns.values()), default=0) >= 16)
    return screen


async def _events(pilot) -> None:
    await _view("5")(pilot)
    screen = pilot.app.screen
    log = screen.query_one("#log", Log)
    await wait_for(pilot, lambda: screen.events and screen.source and log.line_count == len(screen.log_lines) > 0)


async def _compare(pilot) -> None:
    await _history(pilot)
    pilot.app.push_screen(CompareScreen(1, 2))
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, CompareScreen))
    await wait_for(pilot, lambda: "run 1" in screen_text(pilot.app) and "run 2" in screen_text(pilot.app))


async def _export(pilot) -> None:
    await _history(pilot)
    await pilot.press("e")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ExportPathScreen))


async def _switch_confirm(pilot) -> None:
    await _key("P", ProfilePickerScreen)(pilot)
    await pilot.press("down", "enter")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ConfirmScreen))


SCREENS: dict[str, Opener | None] = {
    "node": None,
    "gpu": _view("2"),
    "latency": _view("3"),
    "history": _history,
    "events": _events,
    "help": _key("question_mark", HelpScreen),
    "restart_confirm": _key("R", ConfirmScreen),
    "profile_picker": _key("P", ProfilePickerScreen),
    "switch_confirm": _switch_confirm,
    "compare": _compare,
    "export_path": _export,
}


VIEWS = ["node", "gpu", "latency", "history", "events"]


@three_sizes
@pytest.mark.parametrize("name", list(SCREENS))
def test_screen(snap_screen, name, size):
    assert snap_screen(SCREENS[name], size)


@pytest.mark.parametrize("name", VIEWS)
async def test_key_bar_keys_whole_at_80x24(agent, history_db, monkeypatch, name):
    """At 80 columns every key the bar shows is whole on one row (no "S Star…"), and a key left out for room
    is still listed by `?`, which the bar always shows."""
    db, _ = history_db
    app = _app(agent, db)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        if SCREENS[name] is not None:
            await SCREENS[name](pilot)
            await settle(pilot)
        bar = app.screen.query_one(KeyBar)
        rows = screen_text(app).splitlines()[bar.region.y:bar.region.bottom]
        every = key_items(app.screen.active_bindings.values(), app)
        assert len(every) >= 5 and bar.shown, rows
        assert not any("…" in row for row in rows), rows
        for item in bar.shown:
            assert any(item.label in row for row in rows), (item.label, rows)
        assert any(item.label == "? Help" for item in bar.shown)
        left_out = [item for item in every if item not in bar.shown]
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        listed = {description for _, description in app.screen.keys}
        for item in left_out:
            assert item.description in listed or item.rank == RANK_VIEWS, item


async def test_help_lists_every_key_unscrolled_at_80x24(agent, history_db):
    """`?` at 80x24 shows every key of the view (the one place a key left off the bar is found) without
    scrolling; the colour and engine notes below may scroll."""
    db, _ = history_db
    app = _app(agent, db)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await _key("question_mark", HelpScreen)(pilot)
        descriptions = {description for _, description in app.screen.keys}
        assert len(descriptions) >= 10
        await wait_for(pilot, lambda: all(d in screen_text(app) for d in descriptions))
        shown = screen_text(app)
        missing = [d for d in descriptions if d not in shown]
        assert not missing, shown


async def test_history_at_80x24_run_list_whole_and_apart_from_charts(agent, history_db, monkeypatch):
    db, _ = history_db
    monkeypatch.chdir(db.parent)
    app = _app(agent, type(db)(db.name))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await _history(pilot)
        await settle(pilot)
        lines = screen_text(app).splitlines()
        header = next(line for line in lines if line.split()[:2] == ["run", "profile"])
        assert header.split() == ["run", "profile", "started", "length", "end"], header
        assert any(line.startswith("SM activity (avg of GPUs)") for line in lines), lines  # not beside the list
        assert any("dsv41-tp8-ep SIM" in line and "running" in line for line in lines), lines


@pytest.mark.parametrize(("name", "line_id"), [("gpu", "#gpu-title"), ("latency", "#sla-line"),
                                               ("history", "#history-status")])
async def test_view_status_line_whole_at_80x24(agent, history_db, monkeypatch, name, line_id):
    """A view's title line says what it shows in full at 80 columns (shorter words), not cut by "…"."""
    db, _ = history_db
    monkeypatch.chdir(db.parent)
    app = _app(agent, type(db)(db.name))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await SCREENS[name](pilot)
        await settle(pilot)
        widget = app.screen.query_one(line_id)
        full = text_of(widget).strip()
        assert full and cell_len(full) <= widget.size.width, (full, widget.size.width)


async def test_event_message_whole_at_80x24(agent):
    """A long message wraps within its row instead of being cut at the table's edge."""
    message = "switch to dsv41-tp8-ep by uid 1000 (alice): preflight ok, 8 GPUs freed in 41 s, run 4 starting"
    first = agent.events[0]
    raw = first if isinstance(first, dict) else first.to_json()  # the fake's events: JSON or contract records
    event = {**raw, "id": 9, "ts_ms": raw["ts_ms"] + 1000, "severity": "warning", "message": message}
    agent.events.append(event if isinstance(first, dict) else type(first).from_json(event))
    app = _app(agent)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await _view("5")(pilot)
        screen = app.screen
        await wait_for(pilot, lambda: len(screen.events) == len(agent.events))

        def wrapped_whole() -> bool:
            text = " ".join(line.strip() for line in screen_text(app).splitlines())
            return " ".join(message.split()) in " ".join(text.split())

        await wait_for(pilot, wrapped_whole)


async def test_node_view_gives_its_free_rows_to_serving_at_80x24(agent):
    """Eight GPUs leave rows free at 80x24: the Serving panel takes them (E2E and queue p99), not blank rows."""
    app = _app(agent)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await wait_for(pilot, lambda: any(line.startswith("│ E2E ") for line in screen_text(app).splitlines()))
        lines = screen_text(app).splitlines()
        assert any(line.startswith("│ QUEUE ") for line in lines), lines
        assert sum(1 for line in lines if not line.strip()) <= 2, lines
        assert any(line.strip() == UTIL_NOTE for line in lines), lines  # whole, not "…"
        assert "…" not in lines[0], lines[0]  # the header's tail: whole or left out


async def test_dp8_per_engine_panel_reachable_at_80x24(agent):
    """Eight engines do not fit under eight GPUs at 80x24: the body scrolls to the last engine, not cut."""
    agent.status = make_status(engines=engine_loads(waiting={7: 9}, kv={7: 96.4}))
    app = _app(agent)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("e")
        await wait_for(pilot, lambda: app.screen.has_class("-engines"))
        table = app.screen.query_one("#engines")
        await wait_for(pilot, lambda: table.row_count == 8)
        app.screen.query_one("#body").scroll_end(animate=False)
        # its last row (and border) on screen
        await wait_for(pilot, lambda: table.region.height > 0
                       and table.region.bottom <= app.screen.query_one("#body").region.bottom)


def test_node_view_per_engine_120x40(snap_screen):
    """DP8 with engine 5 queueing and its KV cache near full: `e` shows each engine, engine 5 marked."""
    engines = engine_loads(waiting={5: 9}, kv={5: 96.4}, running={5: 14})
    status = make_status(engines=engines, metrics={"requests_running": 98, "requests_waiting": 9,
                                                   "kv_cache_usage_pct": 96.4})

    async def per_engine(pilot) -> None:
        await pilot.press("e")
        await wait_for(pilot, lambda: pilot.app.screen.has_class("-engines"))

    assert snap_screen(per_engine, (120, 40), status=status)


def test_too_small_60x20(snap_compare, agent):
    async def connected(pilot) -> None:
        await wait_for(pilot, lambda: pilot.app.state.connected)
        await pilot.pause()  # the first status drawn (the app idle), not a fixed time

    assert snap_compare(_app(agent), terminal_size=(60, 20), run_before=connected)
