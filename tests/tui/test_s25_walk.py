"""Session 25 walk-through (H8): a server the agent holds, as an operator at 3 a.m. reads the dashboard.

The node view said only `no profile  STOPPED 23s · held run 1 pid 27253` in its header: nothing on the screen said
what "held" means (a vLLM left by the previous agent, serving on the GPUs, unsupervised), which profile it serves,
nor that Stop ends it; `lynxtop status` said all of it. The line under the header now does, the important words
first (80 columns keep them). The Stop and Start dialogs read `Now: profile no profile, ...`: now `no profile`.

Pilot against the fake agent (a real unix socket), as tests/tui/test_s25_held_dialog.py.
"""

from __future__ import annotations

import pytest
from support.tui import make_app, plain, screen_text, text_of, wait_for
from support.tui_keys import open_screen
from test_s25_held_dialog import _held

from lynxtop.contract.status import HeldRun, ServingState, ServingStatus
from lynxtop.tui.control_text import start_text, stop_text
from lynxtop.tui.screens.confirm import ConfirmScreen
from lynxtop.tui.widgets.startup_phases import StartupPhases


@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
async def test_the_node_view_says_what_the_held_server_is_and_that_stop_ends_it(agent, size):
    _held(agent)
    app = make_app(agent.socket_path)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.connected and app.state.serving.held is not None)
        line = app.screen.query_one(StartupPhases)
        await wait_for(pilot, lambda: "previous agent" in text_of(line))
        screen = screen_text(app)
        row = next(ln for ln in screen.splitlines() if "previous agent" in ln)
        # within the width: what it is, that it is not supervised, and what ends it
        assert "held" in row and "unsupervised" in row and "X Stop ends it" in row, screen
        if size[0] >= 120:
            assert "profile dsv41" in row and "no start while it lives" in row, screen  # the header says `no profile`
        _held(agent, None)  # ended: the line goes
        await wait_for(pilot, lambda: "previous agent" not in screen_text(app))


async def test_a_read_only_dashboard_names_the_command_not_a_key_it_refuses(agent):
    _held(agent)
    app = make_app(agent.socket_path, readonly=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected and app.state.serving.held is not None)
        line = app.screen.query_one(StartupPhases)
        await wait_for(pilot, lambda: "previous agent" in text_of(line))
        assert "`lynxtop stop` ends it" in text_of(line) and "X Stop" not in text_of(line), text_of(line)


def test_the_dialogs_say_no_profile_not_profile_no_profile():
    srv = ServingStatus(state=ServingState.STOPPED, held=HeldRun(run_id=12, profile="dsv41", pid=4242))
    for text in (plain(stop_text(srv)), plain(start_text(srv, "dsv41"))):
        assert "profile no profile" not in text and "Now: no profile, state stopped" in text, text


async def test_the_held_stop_dialog_reads_no_profile(agent):
    _held(agent)
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected and app.state.serving.held is not None)
        dialog = await open_screen(pilot, app, "X", ConfirmScreen)
        assert "profile no profile" not in plain(dialog.body), plain(dialog.body)


# ------------------------------------------------------------------ the Start dialog's load time

def test_the_start_dialog_says_the_profiles_usual_load_where_known():
    """The demo's Stop and Restart said `The last load took 9s`, its Start `Loading takes minutes for a large
    model`, of the same profile a minute later."""
    srv = ServingStatus(state=ServingState.STOPPED, profile="v4-tp8", run_id=12)
    text = plain(start_text(srv, "v4-tp8", usual_load_ms=9_000))
    assert "v4-tp8 usually loads in ~9s" in text and "takes minutes" not in text, text
    assert "takes minutes" in plain(start_text(srv, "v4-tp8"))  # nothing known: the words as before


async def test_the_start_dialog_reads_the_usual_load_from_the_history(agent, history_db):
    db, _ = history_db  # dsv41-tp8-ep: one ready run, loaded in 1m30s
    agent.status["serving"] = {**agent.status["serving"], "state": "stopped", "profile": "dsv41-tp8-ep",
                               "pid": None, "reason": "stopped by uid 0 (root) pid 1"}
    app = make_app(agent.socket_path, db)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected and app.state.serving.state == ServingState.STOPPED)
        dialog = await open_screen(pilot, app, "S", ConfirmScreen)
        text = plain(dialog.body)
        assert "dsv41-tp8-ep usually loads in ~1m30s" in text, text
