"""The Events view's vLLM log with the agent down: read from the run's log file (its path is in the runs table),
shown from the view's first open, and escaped as the agent's /v1/logs lines are (tui/foreign.py): the file is
vLLM's output, and no escape sequence, C1 control or bidi override in it reaches the terminal."""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from support.tui import make_app, screen_text, wait_for
from support.tui_keys import open_screen
from textual.widgets import Log
from tui_fake_agent import T0

from lynxtop.store.writer import StoreWriter
from lynxtop.tui.screens.events import EventsScreen

CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def raw_controls(app) -> list[str]:
    """Every segment on screen that holds a control character: what the terminal gets."""
    strips = app.screen._compositor.render_strips()
    return [seg.text for strip in strips for seg in strip if CONTROLS.search(seg.text)]


@pytest.fixture
def db_with_log():
    """One run whose log file holds a screen clear, a retitle, a C1 CSI and a bidi override."""
    d = Path(tempfile.mkdtemp(prefix="lt-log-", dir="/tmp"))
    log = d / "vllm.log"
    log.write_text("INFO ok\nhostile \x1b[2J\x1b]0;owned\x07 \x9b31m \u202eend\n")
    path = d / "history.db"
    w = StoreWriter(path, clock=lambda: T0 / 1000)
    w.start()
    run = w.create_run(profile="p", argv=["vllm", "serve", "m"], model="m", host="h",
                       started_ms=T0 - 600_000, pid=10, log_path=str(log), simulated=True, flags={})
    w.update_run(run, ready_ms=T0 - 500_000)
    w.close()
    yield path
    shutil.rmtree(d, ignore_errors=True)


async def test_the_log_read_from_file_is_shown_on_first_open(sock_dir, db_with_log, monkeypatch):
    """The view's first log read may run before the runs (their log paths) are read: it is read again once they
    are, not left at "unavailable". (The runs are read late here, so the first log read always comes first.)"""
    read_runs = EventsScreen._events_from_store

    def late(screen):
        time.sleep(0.3)
        return read_runs(screen)

    monkeypatch.setattr(EventsScreen, "_events_from_store", late)
    app = make_app(sock_dir / "absent.sock", db_with_log, utc=True)
    async with app.run_test(size=(200, 48)) as pilot:
        screen = await open_screen(pilot, app, "5", EventsScreen, connected=False)
        await wait_for(pilot, lambda: screen.runs)
        await wait_for(pilot, lambda: "read from file" in screen_text(app))
        await wait_for(pilot, lambda: screen.query_one("#log", Log).line_count >= 2)


async def test_the_log_read_from_file_is_escaped(sock_dir, db_with_log):
    app = make_app(sock_dir / "absent.sock", db_with_log, utc=True)
    async with app.run_test(size=(200, 48)) as pilot:
        screen = await open_screen(pilot, app, "5", EventsScreen, connected=False)
        await wait_for(pilot, lambda: screen.runs)
        screen.fetch_log()  # read with the runs known, whether or not the first open read it
        await wait_for(pilot, lambda: screen.query_one("#log", Log).line_count >= 2 and "hostile" in screen_text(app))
        assert "read from file" in screen_text(app)
        assert raw_controls(app) == []
        assert "hostile \\x1b[2J\\x1b]0;owned\\x07 \\x9b31m \\u202eend" in screen_text(app)
