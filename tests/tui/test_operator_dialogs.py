"""What a confirmation dialog says will be lost, and Start only where a start can act (UX audit, 3 a.m.)."""

from __future__ import annotations

import copy

import pytest
from support.tui import app_with_notices, make_app, plain, screen_text, text_of, wait_for
from support.tui_keys import open_screen
from support.waits import holds_async
from textual.widgets import OptionList
from tui_fake_agent import make_status

from lynxtop.contract.records import ProfileInfo
from lynxtop.contract.status import ServingMetrics, Status
from lynxtop.tui import control_text
from lynxtop.tui.screens.confirm import ConfirmScreen
from lynxtop.tui.screens.profile_picker import ProfilePickerScreen
from lynxtop.tui.widgets.key_bar import key_items


def _dialog_text(screen: ConfirmScreen) -> str:
    return plain(screen.title_text) + plain(screen.body)


def _busy(agent, running: int = 3, waiting: int = 17) -> None:
    agent.status["serving_metrics"] = {**agent.status["serving_metrics"], "requests_running": running,
                                       "requests_waiting": waiting}


async def _switch_dialog(pilot, app) -> ConfirmScreen:
    picker = await open_screen(pilot, app, "P", ProfilePickerScreen)
    picker.query_one(OptionList).focus()
    picker.query_one(OptionList).highlighted = 1
    await pilot.press("enter")
    await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
    return app.screen


async def test_switch_dialog_names_running_and_waiting_requests_and_the_shutdown_timeout(agent):
    _busy(agent)
    agent.profiles = copy.deepcopy(agent.profiles)
    agent.profiles["profiles"][0]["flags"]["--shutdown-timeout"] = "5"
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        text = _dialog_text(await _switch_dialog(pilot, app))
        assert "3 request(s) are running now and 17 waiting" in text, text
        assert "shutdown timeout (5s)" in text, text


async def test_switch_dialog_with_busy_requests_keeps_its_buttons_at_80x24(agent):
    _busy(agent)
    app = make_app(agent.socket_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await _switch_dialog(pilot, app)
        await pilot.pause()
        shown = screen_text(app)
        assert "17 waiting" in shown and "Cancel" in shown and "Switch " in shown, shown


async def test_restart_dialog_names_the_waiting_requests_too(agent):
    _busy(agent)
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        text = _dialog_text(await open_screen(pilot, app, "R", ConfirmScreen))
        assert "3 request(s) are running now and 17 waiting" in text, text
        assert "last load took 17m57s" in text, text


async def test_stop_dialog_names_busy_requests_and_the_last_load(agent):
    _busy(agent)
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        text = _dialog_text(await open_screen(pilot, app, "X", ConfirmScreen))
        assert "3 request(s) are running now and 17 waiting" in text, text
        assert "The last load took 17m57s" in text, text


def test_restart_and_stop_say_the_shutdown_timeout_when_the_profile_is_known():
    status = Status.from_json(make_status())
    metrics = ServingMetrics.from_json({**make_status()["serving_metrics"], "requests_running": 3,
                                        "requests_waiting": 0})
    profile = ProfileInfo("dsv41-tp8", flags={"--shutdown-timeout": "5"})
    restart = plain(control_text.restart_text(status.serving, metrics, profile))
    assert "drain for the profile's shutdown timeout, 5s" in restart, restart
    assert "waiting" not in restart  # none waiting: not said
    stop = plain(control_text.stop_text(status.serving, metrics, profile))
    assert "shutdown timeout, 5s" in stop and "(5s)" not in stop, stop  # said once (s25)
    title, body, _ = control_text.confirmation("stop", status.serving, metrics, None, profile)
    assert "shutdown timeout, 5s" in plain(body)


def _start_enabled(app) -> bool:
    return next(i.enabled for i in key_items(app.screen.active_bindings.values(), app) if i.keys == "S")


async def test_start_is_greyed_and_does_nothing_while_ready(agent):
    app, notices = app_with_notices(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        await wait_for(pilot, lambda: not _start_enabled(app))
        assert app.check_action("control", ("start",)) is None  # greyed, not hidden
        assert app.check_action("control", ("restart",)) is True
        await pilot.press("S")
        await holds_async(lambda: not isinstance(app.screen, ConfirmScreen | ProfilePickerScreen)
                          and agent.posts() == [], 0.5, what="no dialog and nothing posted", sleep=pilot.pause)
        assert "S Start" in text_of(app.screen.query_one("#keys"))  # still listed, greyed


async def test_start_comes_back_once_serving_stops(agent):
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected and not _start_enabled(app))
        agent.status["serving"]["state"] = "stopped"
        await wait_for(pilot, lambda: _start_enabled(app))
        dialog = await open_screen(pilot, app, "S", ConfirmScreen)
        assert "Start serving dsv41-tp8" in _dialog_text(dialog)


async def test_start_refused_as_already_serving_is_titled_so(agent):
    agent.status["serving"]["state"] = "stopped"
    agent.post_answers["start"] = (409, {"error": "state", "message": "serving is already ready (profile "
                                                                       "dsv41-tp8); use restart or switch"})
    app, notices = app_with_notices(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_screen(pilot, app, "S", ConfirmScreen)
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: any("already serving" in t for t, _, _ in notices))
        assert not any("busy" in t for t, _, _ in notices)


@pytest.mark.parametrize(("code", "title"), [("already_serving", "start: already serving"),
                                             ("already_starting", "start: already starting")])
async def test_start_refused_with_an_already_code_is_titled_so(agent, code, title):
    """The agent's own codes for an ask already met (session 22) read as that, never as "agent busy"."""
    agent.status["serving"]["state"] = "stopped"
    agent.post_answers["start"] = (409, {"error": code, "message": "serving is already ready (profile dsv41-tp8); "
                                                                   "use restart or switch"})
    app, notices = app_with_notices(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_screen(pilot, app, "S", ConfirmScreen)
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: any(t == title for t, _, _ in notices))
        assert not any("busy" in t for t, _, _ in notices)
