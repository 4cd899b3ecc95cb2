"""A confirmation acts on the run it showed, never on the one current when the request lands.

The dialog names a run (its id, profile and state); while it is open another operator may switch, stop or
restart. The dashboard withdraws a dialog whose run changed (nothing sent, a notice that says why), keeps one whose
run only moved on (starting -> ready) up to date with Cancel focused, and sends `expect_run` = the run id shown, so
an agent whose run changed in the last instant answers 409 `run_changed` and does nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.tui import app_with_notices, plain, wait_for
from support.tui_keys import open_screen
from support.waits import holds_async
from textual.widgets import Button, OptionList
from tui_fake_agent import FakeAgent

from lynxtop.tui.screens.confirm import ConfirmScreen
from lynxtop.tui.screens.profile_picker import ProfilePickerScreen


def _dialog_text(screen: ConfirmScreen) -> str:
    return plain(screen.title_text) + plain(screen.body)


def _serving(agent: FakeAgent, **change: Any) -> None:
    agent.status["serving"] = {**agent.status["serving"], **change}


BOB_SWITCHED = {"run_id": 4, "profile": "dsv41-tp8-ep", "state": "starting", "ready_ms": None}


@pytest.mark.parametrize(("key", "change", "why"), [
    ("X", BOB_SWITCHED, "run 3"),  # another operator's switch: a fresh load the dialog never showed
    ("R", BOB_SWITCHED, "run 3"),
    ("X", {"state": "stopped"}, "run 3"),  # the run ended (someone else stopped it)
    ("R", {"state": "stopping"}, "run 3"),
    ("R", {"profile": "dsv41-tp8-ep"}, "dsv41-tp8-ep"),
])
async def test_dialog_is_withdrawn_when_its_run_changes(agent, key, change, why):
    app, notices = app_with_notices(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        dialog = await open_screen(pilot, app, key, ConfirmScreen)
        assert "run 3" in _dialog_text(dialog) and "dsv41-tp8" in _dialog_text(dialog)
        await pilot.press("tab")  # the operator is on the action's button, about to press Enter
        _serving(agent, **change)
        await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen), 30)
        await pilot.press("enter")  # the Enter meant for the dialog lands on the view: nothing
        await holds_async(lambda: agent.posts() == [], 0.6, what="nothing posted", sleep=pilot.pause)
        warning = [n for n in notices if n[2] == "warning" and "nothing done" in n[1]]
        assert warning, notices
        assert why in warning[0][1] and f"press {key} again" in warning[0][1], warning
        assert not any("cancelled" in m for _, m, _ in notices)  # not told it was cancelled: it was withdrawn


async def test_stop_dialog_against_bobs_new_load_sends_nothing_even_if_confirmed_fast(agent):
    """The auditor's sequence: Alice's X dialog shows run 3; Bob switches (run 4 loading); the app sees run 4.
    No dialog may still be confirmable: run 4's load must survive."""
    app, notices = app_with_notices(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        dialog = await open_screen(pilot, app, "X", ConfirmScreen)
        _serving(agent, **BOB_SWITCHED)
        await wait_for(pilot, lambda: app.state.serving.run_id == 4, 30)
        await pilot.press("tab", "enter")
        await holds_async(lambda: agent.posts() == [], 0.6, what="nothing posted", sleep=pilot.pause)
        assert app.screen is not dialog


async def test_same_run_moving_on_updates_the_dialog_and_focuses_cancel(agent):
    """starting -> ready is the same run: the dialog stays (the operator meant that run), its text follows the
    state, and the focus goes back to Cancel so an Enter already on its way cancels rather than confirms."""
    _serving(agent, state="starting", ready_ms=None)
    app, notices = app_with_notices(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        dialog = await open_screen(pilot, app, "X", ConfirmScreen)
        assert "state starting" in _dialog_text(dialog)
        await pilot.press("tab")
        assert app.focused is dialog.query_one("#confirm", Button)
        _serving(agent, state="ready", ready_ms=agent.status["ts_ms"] - 1000)
        await wait_for(pilot, lambda: "state ready" in _dialog_text(dialog), 30)
        assert app.screen is dialog and app.focused is dialog.query_one("#cancel", Button)
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: agent.posts() != [])
        assert agent.posts() == [("/v1/stop", {"expect_run": 3})]


@pytest.mark.parametrize("key", ["R", "X"])
async def test_confirmation_sends_the_run_it_showed(agent, key):
    app, _ = app_with_notices(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_screen(pilot, app, key, ConfirmScreen)
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: agent.posts() != [])
        action = {"R": "restart", "X": "stop"}[key]
        assert agent.posts() == [(f"/v1/{action}", {"expect_run": 3})]


async def test_start_with_no_run_sends_expect_run_null(agent):
    """null = the operator saw no run: a start that lands after someone else started one is refused."""
    _serving(agent, state="stopped", run_id=None, pid=None)
    app, _ = app_with_notices(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_screen(pilot, app, "S", ConfirmScreen)
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: agent.posts() != [])
        assert agent.posts() == [("/v1/start", {"expect_run": None})]


async def test_switch_sends_the_run_it_showed(agent):
    app, _ = app_with_notices(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        picker = await open_screen(pilot, app, "P", ProfilePickerScreen)
        picker.query_one(OptionList).focus()
        picker.query_one(OptionList).highlighted = 1
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: agent.posts() != [])
        assert agent.posts() == [("/v1/switch", {"profile": "dsv41-tp8-ep", "expect_run": 3})]


async def test_switch_picker_is_withdrawn_when_the_run_changes(agent):
    """The picker's 'current' profile and the dialog's flag diff are read when it opened: a run change makes both
    stale, so the picker goes with a notice and no dialog follows."""
    app, notices = app_with_notices(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        picker = await open_screen(pilot, app, "P", ProfilePickerScreen)
        picker.query_one(OptionList).focus()
        picker.query_one(OptionList).highlighted = 1
        _serving(agent, **BOB_SWITCHED)
        await wait_for(pilot, lambda: not isinstance(app.screen, ProfilePickerScreen), 30)
        await pilot.press("enter", "tab", "enter")
        await holds_async(lambda: agent.posts() == [] and not isinstance(app.screen, ConfirmScreen), 0.6,
                          what="no dialog, nothing posted", sleep=pilot.pause)
        assert any(sev == "warning" and "nothing done" in m and "press P again" in m for _, m, sev in notices)


async def test_run_changed_409_is_a_warning_with_the_agents_words_and_is_not_retried(agent):
    """The run changed after the dashboard's last poll: the agent's guard refuses, the operator reads why."""
    agent.post_answers["restart"] = (409, {"error": "run_changed",
                                           "message": "run 3 is no longer current (run 4 is): nothing done"})
    app, notices = app_with_notices(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_screen(pilot, app, "R", ConfirmScreen)
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: any("run 4 is" in m for _, m, _ in notices))
        title, message, severity = next(n for n in notices if "run 4 is" in n[1])
        assert severity == "warning" and "run changed" in title and "busy" not in title
        assert "press R again" in message
        await holds_async(lambda: len(agent.posts()) == 1, 0.6, what="one post, no retry", sleep=pilot.pause)
        assert app.readonly_reason is None
