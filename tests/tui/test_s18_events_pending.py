"""The Events view marks the events the agent holds in memory, not in the history yet (session 18).

While the history cannot be written (a full disk) the agent keeps its events in memory and serves them marked
`pending` (agent/api/pending.py); the Events view read the history database alone, so the events explaining the
outage (`store.write_failed` first) were missing from it, and an event read from the agent was not marked. Now the
view adds the agent's held events while the status says writes fail, each tagged `[pending]` (its title says what
that means, the detail too), each listed once: one written between the two reads is shown from the database.

A FAKE agent on a real unix socket with a real SQLite history (a hostile message among the held events), and a
real agent on a real 20 MB tmpfs (root only) filled to the last byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.agent_proc import Agent, e2e_config, reap_sims
from support.small_fs import fill, mounted
from support.tui import make_app, screen_text, text_of, wait_for
from support.tui_keys import open_screen
from textual.widgets import DataTable
from tui_fake_agent import T0

from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.store.writer import StoreWriter
from lynxtop.tui.screens.event_detail import EventDetailScreen
from lynxtop.tui.screens.events import EventsScreen
from lynxtop.tui.widgets.recent_events import RecentEvents

FAILED = Event(EventKind.STORE_WRITE_FAILED, Severity.ERROR, "history not written: database or disk is full",
               {"path": "/var/lib/lynxtop/lynxtop.db"}, ts_ms=T0 - 30_000)
HOSTILE = Event(EventKind.SERVING_CRASH, Severity.ERROR, "exit 1 [bold]boom[/bold] \x1b[2J", run_id=3,
                ts_ms=T0 - 20_000)
STORED = Event(EventKind.SERVING_READY, Severity.INFO, "ready after 17m57s", run_id=3, ts_ms=T0 - 3_600_000)


def _held(ev: Event) -> Event:
    """`ev` as the agent serves it while it holds it: no id, marked pending."""
    return Event.from_json({**ev.to_json(), "id": None, "pending": True})


def _store(path: Path, *events: Event) -> None:
    w = StoreWriter(path, clock=lambda: T0 / 1000)
    w.start()
    for ev in events:
        w.record(ev)
    w.close()


@pytest.fixture
def db() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="lt-pending-", dir="/tmp"))
    path = d / "history.db"
    _store(path, STORED, FAILED)  # FAILED: written between the agent's answer and the view's database read
    yield path
    shutil.rmtree(d, ignore_errors=True)


def _rows(screen: EventsScreen) -> list[list[str]]:
    table = screen.query_one("#events", DataTable)
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


def _of(rows: list[list[str]], kind: str) -> list[list[str]]:
    return [r for r in rows if r[2] == kind]


def _not_writing(agent) -> None:
    agent.status["agent"]["store"].update(retrying=True, last_error="database or disk is full", free_bytes=0)


async def test_held_events_are_added_tagged_pending_escaped_and_listed_once(sock_dir, agent, db):
    _not_writing(agent)
    agent.events = [STORED, _held(FAILED), _held(HOSTILE)]  # the agent's answer: FAILED held, as it was
    app = make_app(agent.socket_path, db, utc=True)
    async with app.run_test(size=(120, 30)) as pilot:
        screen = await open_screen(pilot, app, "5", EventsScreen)
        await wait_for(pilot, lambda: _of(_rows(screen), "serving.crash"))
        rows = _rows(screen)
        crash = _of(rows, "serving.crash")
        assert len(crash) == 1 and crash[0][4].startswith("[pending] "), rows
        # foreign text: markup shown as typed, the escape sequence escaped, never reaching the terminal raw
        assert crash[0][4] == "[pending] exit 1 [bold]boom[/bold] \\x1b[2J", crash
        assert "[bold]boom[/bold]" in screen_text(app)
        failed = _of(rows, "store.write_failed")
        assert len(failed) == 1 and not failed[0][4].startswith("[pending]"), rows  # once, from the database
        assert len(rows) == 3, rows
        title = text_of(screen.query_one("#events-filters"))
        assert "[pending] 1: held by the agent, not in the history yet" in title, title

        screen.query_one("#events", DataTable).move_cursor(row=rows.index(crash[0]))
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, EventDetailScreen))
        assert "pending: held by the agent" in screen_text(app)
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is screen)

        # writes resume: the agent wrote it (now in the database, no longer held): listed once, not tagged
        _store(db, HOSTILE)
        agent.status["agent"]["store"].update(retrying=False, last_error=None, free_bytes=10**9)
        agent.events = [STORED, FAILED, HOSTILE]
        await wait_for(pilot, lambda: not app.state.agent.store.not_writing)
        screen.fetch_events()
        await wait_for(pilot, lambda: not any(r[4].startswith("[pending]") for r in _rows(screen)))
        rows = _rows(screen)
        assert len(_of(rows, "serving.crash")) == 1 and len(rows) == 3, rows
        assert "[pending]" not in text_of(screen.query_one("#events-filters"))


async def test_no_extra_ask_while_the_history_is_written(sock_dir, agent, db):
    """The agent is asked for its held events only while writes fail: a healthy node costs no extra request."""
    app = make_app(agent.socket_path, db, utc=True)
    async with app.run_test(size=(120, 30)) as pilot:
        screen = await open_screen(pilot, app, "5", EventsScreen)
        await wait_for(pilot, lambda: len(_rows(screen)) == 2)
        await pilot.pause(0.3)
        assert not any(path == "/v1/events" for _, path, _ in agent.requests), agent.requests


async def test_recent_events_on_the_node_view_tag_held_ones(sock_dir, agent):
    """The node view's recent events (read from the agent, held ones included) tag them as view 5 does."""
    _not_writing(agent)
    agent.events = [STORED, _held(HOSTILE)]
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        panel = app.screen.query_one(RecentEvents)
        await wait_for(pilot, lambda: "exit 1" in text_of(panel))
        lines = text_of(panel).splitlines()
        crash = next(x for x in lines if "exit 1" in x)
        assert "[pending] exit 1 [bold]boom[/bold] \\x1b[2J" in crash, lines
        assert "[pending]" not in next(x for x in lines if "ready after" in x)


# ---------------------------------------------------------------------------------------------- a real agent


@pytest.fixture
def cleanup(tmp_path):
    """The agents started here: killed, with their servers, at teardown (as tests/agent/conftest.py does)."""
    agents: list[Agent] = []
    yield agents
    for a in agents:
        if a.proc.poll() is None:
            a.proc.kill()
            a.proc.wait(5)
    reap_sims(tmp_path / "sim-state")


@pytest.fixture
def small_fs(tmp_path):
    """A 20m tmpfs (support/small_fs.py)."""
    with mounted(tmp_path / "small", "20m") as mnt:
        yield mnt


async def _wait_api(a: Agent, pred, timeout: float, what: str) -> list[dict]:
    deadline = time.monotonic() + timeout
    events: list[dict] = []
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, KeyError):
            events = (await a.api("GET", "/v1/events?limit=10000"))[1]["events"]
            if pred(events):
                return events
        await asyncio.sleep(0.3)
    raise AssertionError(f"{what}: {[(e['kind'], e.get('pending')) for e in events]}")


@pytest.mark.timeout(200)
async def test_a_real_full_disk_shows_its_held_events_pending_then_once_stored(tmp_path, small_fs, cleanup):
    db = small_fs / "lynxtop.db"
    cfg = e2e_config(tmp_path, autostart=False, extra_agent="min_free_mb = 0")
    cfg.write_text(cfg.read_text().replace(str(tmp_path / "state" / "lynxtop.db"), str(db)))
    a = Agent(tmp_path, cfg)
    cleanup.append(a)
    await a.wait_state(lambda s: True, what="up")
    await _wait_api(a, lambda ev: any(e["kind"] == "agent.started" for e in ev), 20, "agent.started stored")
    filler = fill(small_fs)
    await _wait_api(a, lambda ev: any(e["kind"] == "store.write_failed" and e.get("pending") for e in ev), 30,
                    "store.write_failed held")

    app = make_app(Path(a.sock_path), db, utc=True, clock=time.time)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.agent.store.not_writing, timeout_s=20)
        screen = await open_screen(pilot, app, "5", EventsScreen)
        await wait_for(pilot, lambda: _of(_rows(screen), "store.write_failed"), timeout_s=20)
        rows = _rows(screen)
        failed = _of(rows, "store.write_failed")
        assert len(failed) == 1 and failed[0][4].startswith("[pending] "), rows
        assert _of(rows, "agent.started") and not _of(rows, "agent.started")[0][4].startswith("[pending]")
        assert "held by the agent, not in the history yet" in text_of(screen.query_one("#events-filters"))

        filler.unlink()  # space returns: the agent writes what it held; the view lists it once, from the database
        await _wait_api(a, lambda ev: any(e["kind"] == "store.writes_resumed" for e in ev)
                        and not any(e.get("pending") for e in ev), 40, "written")

        def settled() -> bool:
            got = _rows(screen)
            if not _of(got, "store.writes_resumed") or any(r[4].startswith("[pending]") for r in got):
                screen.fetch_events()  # the view's own refresh is every 5 s
                return False
            return True

        await wait_for(pilot, settled, timeout_s=30)
        rows = _rows(screen)
        assert len(_of(rows, "store.write_failed")) == 1, rows
        assert "held by the agent" not in text_of(screen.query_one("#events-filters"))
    assert a.stop() == 0
