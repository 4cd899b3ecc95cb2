"""Restart, stop, start and switch: confirmation (Cancel focused), read-only, 403, 409 and 422 answers."""

from __future__ import annotations

from support.tui import make_app, plain, text_of, wait_for
from support.tui_keys import open_screen
from support.waits import holds_async, wait_for_async
from textual.widgets import Button, OptionList

from lynxtop.tui.app import LynxtopApp
from lynxtop.tui.screens.confirm import ConfirmScreen
from lynxtop.tui.screens.profile_picker import ProfilePickerScreen


def _app_with_notices(agent) -> tuple[LynxtopApp, list[tuple[str, str, str]]]:
    """The app and every notification it shows, as (title, message, severity): the outcome of a control."""
    app = make_app(agent.socket_path)
    notices: list[tuple[str, str, str]] = []
    original = app.notify

    def spy(message, *a, **kw):
        notices.append((kw.get("title", ""), str(message), kw.get("severity", "information")))
        return original(message, *a, **kw)

    app.notify = spy
    return app, notices


def _dialog_text(screen: ConfirmScreen) -> str:
    return plain(screen.title_text) + plain(screen.body)


async def _confirm(pilot, app, key: str) -> None:
    """Tab first: the dialog opens with Cancel focused, so a bare Enter would send nothing."""
    await open_screen(pilot, app, key, ConfirmScreen)
    await pilot.press("tab", "enter")


async def test_restart_cancel_is_default_and_sends_nothing(agent):
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        dialog = await open_screen(pilot, app, "R", ConfirmScreen)
        assert app.focused is dialog.query_one("#cancel", Button)
        text = _dialog_text(dialog)
        assert "Restart serving?" in text and "dsv41-tp8" in text and "run 3" in text
        assert "loads again" in text and "last load took 17m57s" in text
        assert "12 request(s) are running now" in text
        await pilot.press("enter")  # Enter on the focused button = Cancel
        await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        await holds_async(lambda: agent.posts() == [], 0.5, what="nothing posted", sleep=pilot.pause)


async def test_restart_confirmed_posts_once(agent):
    app, notices = _app_with_notices(agent)
    async with app.run_test(size=(120, 40)) as pilot:
        await _confirm(pilot, app, "R")
        await wait_for(pilot, lambda: agent.posts() != [])
        assert agent.posts() == [("/v1/restart", {"expect_run": 3})]  # the run the dialog showed
        await wait_for(pilot, lambda: any("restart accepted" in t for t, _, _ in notices))


async def test_escape_and_n_cancel_stop(agent):
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        for key in ("escape", "n"):
            await pilot.press("X")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            assert "stays stopped" in _dialog_text(app.screen)
            await pilot.press(key)
            await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        await holds_async(lambda: agent.posts() == [], 0.5, what="nothing posted", sleep=pilot.pause)


async def test_switch_shows_flag_differences_and_load_warning(agent):
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        picker = await open_screen(pilot, app, "P", ProfilePickerScreen)
        options = picker.query_one(OptionList)
        current = options.get_option("dsv41-tp8")
        assert current.disabled  # the running profile cannot be chosen
        options.focus()
        options.highlighted = 1
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        text = _dialog_text(app.screen)
        assert "Switch to profile dsv41-tp8-ep?" in text
        assert "2 flag difference(s)" in text
        assert "--max-model-len" in text and "131072" in text and "262144" in text
        assert "--enable-expert-parallel" in text
        assert "--kv-cache-dtype" not in text  # equal flags are not listed
        assert "minutes" in text
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: agent.posts() != [])
        assert agent.posts() == [("/v1/switch", {"profile": "dsv41-tp8-ep", "expect_run": 3})]


async def test_readonly_flag_hides_controls(agent):
    app = make_app(agent.socket_path, readonly=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        assert app.check_action("control", ("restart",)) is False
        await pilot.press("R", "X", "S", "P")
        await holds_async(lambda: not isinstance(app.screen, ConfirmScreen | ProfilePickerScreen)
                          and agent.posts() == [], 0.5, what="no dialog and nothing posted", sleep=pilot.pause)
        assert "READ-ONLY (--readonly)" in text_of(app.screen.query_one("#header"))
        keys = {ab.binding.key for ab in app.screen.active_bindings.values() if ab.enabled}
        assert "R" not in keys
        bar = text_of(app.screen.query_one("#keys"))
        assert "Restart" not in bar and "Switch" not in bar and "q Quit" in bar


async def test_403_turns_dashboard_readonly_with_reason(agent):
    agent.post_answers["restart"] = (403, {"error": "forbidden",
                                           "message": "uid 1001 (bob) is not in group lynxtop"})
    app, notices = _app_with_notices(agent)
    async with app.run_test(size=(120, 40)) as pilot:
        await _confirm(pilot, app, "R")
        await wait_for(pilot, lambda: app.readonly_reason is not None)
        assert "not in group lynxtop" in app.readonly_reason
        await wait_for(pilot, lambda: "READ-ONLY" in text_of(app.screen.query_one("#header")))
        assert "not in group lynxtop" in text_of(app.screen.query_one("#header"))
        assert any(sev == "error" and "refused" in title for title, _, sev in notices)
        await pilot.press("X")
        await holds_async(lambda: not isinstance(app.screen, ConfirmScreen) and len(agent.posts()) == 1, 0.5,
                          what="no dialog and no second post", sleep=pilot.pause)


async def test_409_busy_and_422_preflight_are_notified_and_change_nothing(agent):
    agent.post_answers["stop"] = (409, {"error": "busy",
                                        "message": "switch to dsv41-tp8-ep in progress since 09:18:02"})
    agent.post_answers["switch"] = (422, {"error": "preflight",
                                          "message": "preflight failed: model path missing"})
    app, notices = _app_with_notices(agent)
    async with app.run_test(size=(120, 40)) as pilot:
        await _confirm(pilot, app, "X")
        await wait_for(pilot, lambda: any("busy" in t for t, _, _ in notices))
        busy = next(n for n in notices if "busy" in n[0])
        assert busy[2] == "warning" and "in progress since 09:18:02" in busy[1]
        assert app.readonly_reason is None
        await open_screen(pilot, app, "P", ProfilePickerScreen, connected=False)
        app.screen.query_one(OptionList).highlighted = 1
        app.screen.query_one(OptionList).focus()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: any("422" in t for t, _, _ in notices))
        assert any("model path missing" in m for _, m, _ in notices)
        assert app.readonly_reason is None


async def test_start_when_stopped_uses_current_profile(agent):
    agent.status["serving"]["state"] = "stopped"
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        dialog = await open_screen(pilot, app, "S", ConfirmScreen)
        assert "Start serving dsv41-tp8" in _dialog_text(dialog)
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: agent.posts() != [])
        assert agent.posts() == [("/v1/start", {"expect_run": 3})]  # a stopped node still reports its last run


def _worker(agent) -> None:
    agent.status["cluster"] = {"role": "worker", "ray_state": "running", "address": "10.0.0.1:6379"}
    agent.status["serving"] = {**agent.status["serving"], "state": "stopped", "profile": None, "run_id": None}


async def test_stop_on_a_ray_worker_says_it_stops_ray_and_what_the_head_loses(agent):
    _worker(agent)
    app, notices = _app_with_notices(agent)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        dialog = await open_screen(pilot, app, "X", ConfirmScreen)
        text = _dialog_text(dialog)
        assert "Stop this node's Ray?" in text and "Ray worker of 10.0.0.1:6379" in text
        assert "serving there fails" in text and "Stop serving?" not in text
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: agent.posts() != [])
        assert agent.posts() == [("/v1/stop", {"expect_run": None})]  # a worker has no run of its own


async def test_restart_on_a_ray_worker_is_refused_locally(agent):
    _worker(agent)
    app, notices = _app_with_notices(agent)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        await pilot.press("R")
        await wait_for(pilot, lambda: any("Ray worker" in m for _, m, _ in notices))
        assert not isinstance(app.screen, ConfirmScreen) and agent.posts() == []


async def test_ctrl_c_quits_the_app(agent):
    """Ctrl-C leaves, as in htop and k9s, instead of Textual's 'press ctrl+q to quit' hint (issue 28.1)."""
    app, notices = _app_with_notices(agent)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.status is not None)
        await pilot.press("ctrl+c")
        await wait_for_async(lambda: not app.is_running, 30, what="the app to exit")
    assert not any("ctrl+q" in m for _, m, _ in notices)


async def test_ctrl_c_in_a_confirm_dialog_cancels(agent):
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_screen(pilot, app, "R", ConfirmScreen)
        await pilot.press("ctrl+c")
        await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        await holds_async(lambda: app.is_running and agent.posts() == [], 0.5,
                          what="the app running and nothing posted", sleep=pilot.pause)


async def test_load_key_only_in_demo_mode(agent):
    calls: list[int] = []

    def toggle() -> str:
        calls.append(1)
        return "load raised"

    app = make_app(agent.socket_path, demo_load=toggle)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        await pilot.press("L")
        await wait_for(pilot, lambda: calls == [1])
    plain = make_app(agent.socket_path)
    async with plain.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: plain.state.connected)
        assert plain.check_action("demo_load", ()) is False
        await pilot.press("L")
        await holds_async(lambda: plain.is_running, 0.5, what="the app running", sleep=pilot.pause)
