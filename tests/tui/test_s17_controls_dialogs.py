"""Restart and stop dialogs name the running profile's shutdown timeout, as the switch dialog does; and every
confirmation keeps its buttons on an 80x24 screen, however long its text (its body scrolls)."""

from __future__ import annotations

import copy

from support.tui import make_app, plain, screen_text, wait_for
from support.tui_keys import open_screen
from textual.containers import VerticalScroll
from textual.geometry import Region
from textual.widgets import Button, OptionList

from lynxtop.tui.screens.confirm import ConfirmScreen
from lynxtop.tui.screens.profile_picker import ProfilePickerScreen


def _dialog_text(screen: ConfirmScreen) -> str:
    return plain(screen.title_text) + plain(screen.body)


def _timeout(agent, name: str, seconds: str | None) -> None:
    """The profile `name` as the agent lists it, with `--shutdown-timeout seconds` (None: the flag left out)."""
    agent.profiles = copy.deepcopy(agent.profiles)
    flags = next(p for p in agent.profiles["profiles"] if p["name"] == name)["flags"]
    flags.pop("--shutdown-timeout", None)
    if seconds is not None:
        flags["--shutdown-timeout"] = seconds


async def test_restart_dialog_names_the_running_profiles_shutdown_timeout(agent):
    _timeout(agent, "dsv41-tp8", "7")
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        text = _dialog_text(await open_screen(pilot, app, "R", ConfirmScreen))
        assert "drain for the profile's shutdown timeout, 7s" in text, text
        # the busy requests' line refers to it, without the figure again (s25: said once)
        assert "get the shutdown timeout to finish" in text and "(7s)" not in text, text


async def test_stop_dialog_names_the_shutdown_timeout_even_with_no_request_running(agent):
    _timeout(agent, "dsv41-tp8", "7")
    agent.status["serving_metrics"] = {**agent.status["serving_metrics"], "requests_running": 0,
                                       "requests_waiting": 0}
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        text = _dialog_text(await open_screen(pilot, app, "X", ConfirmScreen))
        assert "drain for the profile's shutdown timeout, 7s" in text, text
        assert "stays stopped" in text, text


async def test_the_timeout_named_is_that_of_the_profile_the_polled_status_runs(agent):
    """The run the dashboard shows runs dsv41-tp8-ep (the agent lists another as `current`): its timeout."""
    _timeout(agent, "dsv41-tp8", "8")
    _timeout(agent, "dsv41-tp8-ep", "45")
    agent.status["serving"]["profile"] = "dsv41-tp8-ep"
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        text = _dialog_text(await open_screen(pilot, app, "R", ConfirmScreen))
        assert "shutdown timeout, 45s" in text and "8s" not in text, text


async def test_a_profile_without_shutdown_timeout_says_requests_are_aborted(agent):
    """vLLM's default shutdown timeout is 0: in-flight requests are aborted at once, nothing drains."""
    _timeout(agent, "dsv41-tp8", None)
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        text = _dialog_text(await open_screen(pilot, app, "X", ConfirmScreen))
        assert "no shutdown timeout" in text and "aborted at once" in text, text
        assert "drain for" not in text, text


async def test_the_dialog_still_opens_when_the_profiles_cannot_be_read(agent):
    """A stop must never wait on the profile list: without it the dialog says the timeout without its value."""
    agent.profiles = {"current": "dsv41-tp8", "profiles": "not a list"}  # an answer the client refuses
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        text = _dialog_text(await open_screen(pilot, app, "X", ConfirmScreen))
        assert "the profile's shutdown timeout" in text and "Stop serving?" in text, text


# ------------------------------------------------------------------------------------- buttons at 80x24
def _long_switch(agent) -> None:
    """The longest dialog: a switch to a profile differing in 30 flags, with a long description, while requests
    run and wait."""
    agent.status["serving_metrics"] = {**agent.status["serving_metrics"], "requests_running": 31,
                                       "requests_waiting": 417}
    agent.profiles = copy.deepcopy(agent.profiles)
    target = agent.profiles["profiles"][1]
    target["description"] = "expert parallel, long context, " * 6
    target["flags"].update({f"--long-flag-{i:02d}": f"value-{i}" * 3 for i in range(30)})


def _within(inner: Region, outer: Region) -> bool:
    return outer.contains_region(inner)


def _buttons_on_screen(app, dialog: ConfirmScreen) -> bool:
    screen = Region(0, 0, *app.size)
    return all(_within(dialog.query_one(f"#{b}", Button).region, screen) for b in ("cancel", "confirm"))


async def _assert_buttons_visible(pilot, app, dialog: ConfirmScreen) -> None:
    await wait_for(pilot, lambda: _buttons_on_screen(app, dialog))  # the layout settles after the dialog opens
    screen = Region(0, 0, *app.size)
    box = dialog.query_one("#dialog").region
    assert _within(box, screen), (box, screen)
    for button_id in ("cancel", "confirm"):
        button = dialog.query_one(f"#{button_id}", Button)
        region = button.region
        assert region.height >= 1 and _within(region, screen), (button_id, region, screen)
        assert _within(region, box), (button_id, region, box)  # not clipped away by the dialog
        assert str(button.label) in screen_text(app), screen_text(app)


async def test_long_switch_dialog_keeps_both_buttons_on_an_80x24_screen(agent):
    _long_switch(agent)
    app = make_app(agent.socket_path)
    async with app.run_test(size=(80, 24)) as pilot:
        picker = await open_screen(pilot, app, "P", ProfilePickerScreen)
        picker.query_one(OptionList).highlighted = 1
        picker.query_one(OptionList).focus()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        dialog = app.screen
        await pilot.pause()
        await _assert_buttons_visible(pilot, app, dialog)
        body = dialog.query_one("#dialog-body", VerticalScroll)
        assert body.max_scroll_y > 0  # the text that does not fit scrolls
        assert "417 waiting" in _dialog_text(dialog)


async def test_long_restart_dialog_keeps_both_buttons_on_an_80x24_screen(agent):
    agent.status["serving_metrics"] = {**agent.status["serving_metrics"], "requests_running": 31,
                                       "requests_waiting": 417}
    agent.status["serving"]["model"] = "/models/deepseek-ai/DeepSeek-V4.1/" + "snapshot-0123456789/" * 45  # 12 rows
    app = make_app(agent.socket_path)
    async with app.run_test(size=(80, 24)) as pilot:
        dialog = await open_screen(pilot, app, "R", ConfirmScreen)
        await pilot.pause()
        await _assert_buttons_visible(pilot, app, dialog)


async def test_a_dialog_opened_on_a_tall_screen_keeps_its_buttons_once_shrunk_to_80x24(agent):
    _long_switch(agent)
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        picker = await open_screen(pilot, app, "P", ProfilePickerScreen)
        picker.query_one(OptionList).highlighted = 1
        picker.query_one(OptionList).focus()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        dialog = app.screen
        await _assert_buttons_visible(pilot, app, dialog)
        await pilot.resize_terminal(80, 24)
        await wait_for(pilot, lambda: app.size == (80, 24))
        await _assert_buttons_visible(pilot, app, dialog)
