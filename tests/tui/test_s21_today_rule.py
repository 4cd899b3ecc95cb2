"""Today's times read as the clock alone, another day's with their date, by the calendar date (session 21).

The Events view tested `now - ts < 24 h`: at 09:00 yesterday's 10:00 read as "10:00:00" (an hour ahead), and on
a 24.5-hour DST day an event of 00:10 seen at 23:55 got a date. The node view's Recent events and `lynxtop status`
showed the clock alone whatever the age: a crash or a run of three days ago read as today's. One rule now,
contract/format.py's fmt_when, by the date in the displayed zone (UTC when the app shows UTC, else local).

Real functions and a real app on a fake agent's real socket; the zone set with TZ and time.tzset().
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from support.tui import make_app, text_of, wait_for
from support.tui_keys import open_screen
from textual.widgets import DataTable
from tui_fake_agent import T0

from lynxtop.cli.ctl import _run_text
from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.contract.format import fmt_when
from lynxtop.contract.status import ServingStatus
from lynxtop.tui.screens.events import EventsScreen, _when
from lynxtop.tui.widgets.recent_events import RecentEvents

DAY_MS = 86_400_000


@pytest.fixture
def tz(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Sets the local zone for the test; the runner's zone is back afterwards."""
    def use(name: str) -> None:
        monkeypatch.setenv("TZ", name)
        time.tzset()
    yield use
    monkeypatch.undo()
    time.tzset()


def _ms(zone: str, *when: int) -> int:
    """Epoch ms of a wall-clock time in `zone` (the DST offset of that instant, as the zone's rules say)."""
    return int(datetime(*when, tzinfo=ZoneInfo(zone)).timestamp() * 1000)


@pytest.mark.parametrize(("zone", "ts", "now", "short", "long"), [
    # yesterday 10:00 seen today at 09:00, 23 h later: a date
    ("America/New_York", (2026, 3, 9, 10, 0), (2026, 3, 10, 9, 0), "03-09 10:00", "2026-03-09 10:00"),
    # today 00:00:01 seen at 23:59:59: the clock, though almost a day old
    ("America/New_York", (2026, 3, 10, 0, 0, 1), (2026, 3, 10, 23, 59, 59), "00:00:01", "00:00:01"),
    # the 24.5-hour day of Lord Howe Island's DST end: 00:10 seen at 23:55 the same day, 24 h 15 m later
    ("Australia/Lord_Howe", (2026, 4, 5, 0, 10), (2026, 4, 5, 23, 55), "00:10:00", "00:10:00"),
    # a minute before midnight, seen two minutes later: another day
    ("Asia/Kolkata", (2026, 12, 2, 23, 59), (2026, 12, 3, 0, 1), "12-02 23:59", "2026-12-02 23:59"),
    # a future time (a node clock ahead) of another day: its date, not a clock that reads as today's
    ("Asia/Kolkata", (2026, 12, 4, 8, 0), (2026, 12, 3, 9, 0), "12-04 08:00", "2026-12-04 08:00"),
])
def test_the_clock_alone_only_for_todays_date_in_local_time(tz, zone, ts, now, short, long):
    tz(zone)
    ts_ms, now_ms = _ms(zone, *ts), _ms(zone, *now)
    assert fmt_when(ts_ms, now_ms, False, short=True) == short
    assert fmt_when(ts_ms, now_ms, False) == long
    assert _when(ts_ms, False, now_ms) == short  # the Events view: narrow columns


def test_utc_display_takes_the_date_in_utc(tz):
    """In Kolkata 17:00Z is 22:30 of 2 Dec and 19:00Z is 00:30 of 3 Dec: another day locally, the same in UTC."""
    tz("Asia/Kolkata")
    ts_ms, now_ms = _ms("UTC", 2026, 12, 2, 17, 0), _ms("UTC", 2026, 12, 2, 19, 0)
    assert fmt_when(ts_ms, now_ms, True, short=True) == "17:00:00Z"
    assert fmt_when(ts_ms, now_ms, False, short=True) == "12-02 22:30"
    assert fmt_when(ts_ms, now_ms + DAY_MS, True, short=True) == "12-02 17:00Z"
    assert fmt_when(ts_ms, now_ms + DAY_MS, True) == "2026-12-02 17:00 UTC"
    assert _when(ts_ms, True, now_ms) == "17:00:00Z" and _when(ts_ms, False, now_ms) == "12-02 22:30"


@pytest.mark.parametrize("bad", [-5, float("nan"), float("inf"), 1e300, 253_402_300_800_000 * 10])
def test_a_time_no_date_can_show_reads_as_bad_and_never_raises(tz, bad):
    tz("Asia/Kolkata")
    now = _ms("UTC", 2026, 12, 2, 19, 0)
    for utc in (False, True):
        shown = fmt_when(bad, now, utc, short=True)
        assert shown.startswith("<bad time ") and shown == fmt_when(bad, now, utc), shown
        assert _when(bad, utc, now) == shown  # not "d time -5>", a cut of the date form
    # a bad `now` (a wild clock): the date is shown, the safe side
    assert fmt_when(now, -1, False, short=True) == "12-03 00:30"
    assert fmt_when(None, now) == "N/A" and _when(None, False, now) == "N/A"


# ---------------------------------------------------------------------------------------------- the Events view


def _time_cells(screen: EventsScreen) -> list[str]:
    table = screen.query_one("#events", DataTable)
    return [str(table.get_row_at(i)[0]) for i in range(table.row_count)]


async def test_events_view_flips_to_dates_at_local_midnight_within_the_hour(tz, agent):
    """Kolkata's midnight is 18:30Z: at 18:29Z and 18:31Z the hour (the old cache key) is the same, the date not.
    The table is refilled for the new date at once, not up to an hour late."""
    tz("Asia/Kolkata")
    clock = {"ms": _ms("UTC", 2026, 12, 2, 18, 29)}  # 23:59 IST on 2 Dec
    app = make_app(agent.socket_path, clock=lambda: clock["ms"] / 1000)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        screen = await open_screen(pilot, app, "5", EventsScreen)
        await wait_for(pilot, lambda: len(_time_cells(screen)) == len(agent.events))
        newest = max(e.ts_ms for e in agent.events)  # T0 - 10 min: 19:20 IST on 2 Dec
        assert _time_cells(screen)[0] == fmt_when(newest, clock["ms"], False, short=True) == "19:20:00"
        clock["ms"] += 2 * 60_000  # 00:01 IST on 3 Dec, the same UTC hour
        screen._fill_events()
        assert _time_cells(screen)[0] == "12-02 19:20", _time_cells(screen)


# ---------------------------------------------------------------------------------------------- Recent events


def test_recent_event_lines_of_another_day_show_their_date(tz):
    from lynxtop.tui.widgets.recent_events import _line

    tz("Asia/Kolkata")
    now = _ms("Asia/Kolkata", 2026, 12, 3, 0, 1)
    old = Event(EventKind.SERVING_CRASH, Severity.ERROR, "vLLM exited", ts_ms=now - 3 * DAY_MS)
    fresh = Event(EventKind.SERVING_READY, Severity.INFO, "ready", ts_ms=now - 30_000)
    assert _line(old, False, now).plain.startswith("11-30 00:01  ✗  error"), _line(old, False, now).plain
    assert _line(fresh, False, now).plain.startswith("00:00:30  ·  info"), _line(fresh, False, now).plain
    # in a panel with both, today's clock is padded to the dated lines' width: the columns stay aligned
    assert _line(fresh, False, now, 11).plain.startswith("00:00:30     ·  info")


async def test_node_view_recent_events_date_an_old_crash_by_the_apps_clock(tz, agent):
    """The panel compares with the app's clock (the node's, in the snapshots frozen): a 3-day-old crash gets its
    date, the events of today keep the clock alone, all in one column."""
    tz("America/New_York")
    crash = Event(EventKind.SERVING_CRASH, Severity.ERROR, "vLLM exited with 1", run_id=2, ts_ms=T0 - 3 * DAY_MS,
                  id=99)
    agent.events = [*agent.events, crash]
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        panel = app.screen.query_one(RecentEvents)
        await wait_for(pilot, lambda: "vLLM exited" in text_of(panel))
        lines = text_of(panel).splitlines()
        old = next(x for x in lines if "vLLM exited" in x)
        day = time.strftime("%m-%d %H:%M", time.localtime(crash.ts_ms / 1000))
        assert old.startswith(day), lines
        fresh = next(x for x in lines if "SW thermal" in x)
        assert fresh.startswith(time.strftime("%H:%M:%S", time.localtime((T0 - 600_000) / 1000)) + "   "), lines
        assert fresh.index("warning") == old.index("error"), lines  # the severity column lines up


# ---------------------------------------------------------------------------------------------- lynxtop status


def test_status_run_started_on_another_day_says_its_date(tz):
    tz("America/New_York")
    now = _ms("America/New_York", 2026, 3, 10, 9, 0)
    yesterday = _ms("America/New_York", 2026, 3, 9, 10, 0)
    text = _run_text(ServingStatus(run_id=12, started_ms=yesterday, profile="p"), now)
    assert text == "run 12 (started 2026-03-09 10:00, profile p)", text
    today = _ms("America/New_York", 2026, 3, 10, 0, 30, 5)
    assert _run_text(ServingStatus(run_id=12, started_ms=today, profile="p"), now) == \
        "run 12 (started 00:30:05, profile p)"
