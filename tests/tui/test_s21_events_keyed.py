"""The Events view adds the new events' rows instead of refilling its table (session 21).

Left open on a node whose events keep coming, the view cleared and rebuilt its whole table (up to EVENTS_READ =
1,000 rows, each message wrapped) whenever one new event arrived, every REFRESH_S: 570-650 ms of the event loop
per refill at 1,000 rows, and the operator's cursor thrown back to the first row. Now rows are keyed by event:
new ones go in at the top, dropped ones (beyond the limit, held ones now stored) go out, the cursor stays on its
event, and the rows already shown are not built again. A filter change still rebuilds everything.

The real app against the FAKE agent on a real unix socket; the rows are the test's (the screen's own reads held
off), the fill is the screen's own.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from support.tui import make_app, wait_for
from textual.widgets import DataTable
from tui_fake_agent import T0

import lynxtop.tui.screens.events as events_mod
from lynxtop.contract.events import Event, EventKind
from lynxtop.tui.screens.event_detail import EventDetailScreen


def events(newest_id: int, n: int = 1000) -> list[Event]:
    """`n` stored events, newest first, ids newest_id down; long messages (they wrap)."""
    return [Event(EventKind.GPU_XID, "warning", f"GPU {i % 8} xid event {i} " + "detail " * (i % 30), run_id=3,
                  ts_ms=T0 - (newest_id - i) * 1000, id=i) for i in range(newest_id, newest_id - n, -1)]


def held(ev: Event) -> Event:
    """`ev` as the agent serves it while it holds it: no id, marked pending."""
    return Event.from_json({**ev.to_json(), "id": None, "pending": True})


class Counter:
    """Counts the message cells built (one per row built) and delegates to the real builder."""

    def __init__(self) -> None:
        self.calls = 0
        self.real = events_mod._message

    def __call__(self, e: Event) -> Any:
        self.calls += 1
        return self.real(e)


def rows_match_shown(screen: Any, table: DataTable) -> None:
    """Row i of the table is shown[i]: the detail opens the event the operator sees."""
    assert table.row_count == len(screen.shown)
    for i, e in enumerate(screen.shown):
        cell = table.get_row_at(i)[-1]
        assert cell.plain == events_mod._message(e).plain, f"row {i} shows {cell.plain!r}, shown[{i}] is {e}"


async def open_events(pilot: Any, app: Any) -> Any:
    await pilot.press("5")
    await wait_for(pilot, lambda: app.screen.__class__.__name__ == "EventsScreen")
    screen = app.screen
    screen._last_fetch = time.monotonic() + 10**6  # its own reads held off: the rows are the test's
    await screen.workers.wait_for_complete()
    return screen


@pytest.mark.timeout(180)
async def test_new_events_keep_the_cursor_and_build_only_their_rows(agent, monkeypatch):
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 50)) as pilot:
        screen = await open_events(pilot, app)
        table = screen.query_one("#events", DataTable)
        counter = Counter()
        monkeypatch.setattr(events_mod, "_message", counter)

        screen.events = events(1000)
        t = time.perf_counter()
        screen._fill_events()
        full_s = time.perf_counter() - t
        await pilot.pause()
        full_drawn_s = time.perf_counter() - t
        assert counter.calls == 1000
        table.focus()
        table.move_cursor(row=10)
        await pilot.pause()
        looked_at = screen.shown[table.cursor_row].id

        counter.calls = 0
        screen.events = events(1001)  # one new event; the oldest falls beyond the limit
        t = time.perf_counter()
        screen._fill_events()
        one_new_s = time.perf_counter() - t
        await pilot.pause()
        one_new_drawn_s = time.perf_counter() - t
        print(f"\nfill at 1,000 rows (drawn): full {full_s * 1000:.0f} ms ({full_drawn_s * 1000:.0f} ms); "
              f"one new event {one_new_s * 1000:.1f} ms ({one_new_drawn_s * 1000:.0f} ms)")
        assert screen.shown[table.cursor_row].id == looked_at, (
            f"cursor moved from event {looked_at} to event {screen.shown[table.cursor_row].id}")
        assert table.cursor_row == 11
        assert counter.calls == 1, f"{counter.calls} rows built for one new event"
        assert screen.shown[0].id == 1001 and screen.shown[-1].id == 2
        rows_match_shown(screen, table)

        # several new ones at once, the cursor still on its event
        counter.calls = 0
        screen.events = events(1005)
        screen._fill_events()
        await pilot.pause()
        assert counter.calls == 4
        assert screen.shown[table.cursor_row].id == looked_at
        rows_match_shown(screen, table)

        # a filter change rebuilds every row (their set changed, not just grew)
        counter.calls = 0
        screen.text_filter = "event"
        screen._fill_events()
        await pilot.pause()
        assert counter.calls == 1000
        rows_match_shown(screen, table)

        # Enter opens the event under the cursor (the screen reads its own events again on return)
        table.move_cursor(row=[e.id for e in screen.shown].index(looked_at))
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, EventDetailScreen))
        assert app.screen.event.id == looked_at
        await pilot.press("escape")
        await wait_for(pilot, lambda: screen.is_current)


@pytest.mark.timeout(180)
async def test_a_held_event_stored_since_replaces_its_row(agent):
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 50)) as pilot:
        screen = await open_events(pilot, app)
        table = screen.query_one("#events", DataTable)
        stored = events(1000, 50)
        newest = events(1002, 2)  # ids 1002, 1001: held by the agent first, stored by the next read
        screen.events = [*map(held, newest), *stored]
        screen._fill_events()
        await pilot.pause()
        assert [e.pending for e in screen.shown[:3]] == [True, True, False]
        table.focus()
        table.move_cursor(row=5)
        await pilot.pause()
        looked_at = screen.shown[table.cursor_row].id

        screen.events = [*events(1003, 1), *newest, *stored]  # both written now, and a newer one
        screen._fill_events()
        await pilot.pause()
        assert not any(e.pending for e in screen.shown), "a held event listed beside its stored row"
        assert [e.id for e in screen.shown[:4]] == [1003, 1002, 1001, 1000]
        assert screen.shown[table.cursor_row].id == looked_at
        rows_match_shown(screen, table)
        assert not any("[pending]" in table.get_row_at(i)[-1].plain for i in range(table.row_count))
