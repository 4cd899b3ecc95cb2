"""One control at a time: no palette over a confirmation or the profile picker, no second control while one is
open or waiting for the agent's answer, and so no dialog left on screen whose worker was cancelled."""

from __future__ import annotations

import asyncio
import threading

import pytest
from aiohttp import web
from support.tui import app_with_notices, wait_for
from support.tui_keys import open_screen
from support.waits import holds_async
from textual.command import CommandPalette
from tui_fake_agent import FakeAgent

from lynxtop.tui.screens.confirm import ConfirmScreen
from lynxtop.tui.screens.profile_picker import ProfilePickerScreen


@pytest.mark.parametrize(("key", "dialog"), [("R", ConfirmScreen), ("P", ProfilePickerScreen)])
async def test_palette_does_not_open_over_a_control_dialog(agent, key, dialog):
    app, notices = app_with_notices(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        shown = await open_screen(pilot, app, key, dialog)
        await pilot.press("ctrl+p")
        await holds_async(lambda: app.screen is shown and not CommandPalette.is_open(app), 0.4,
                          what="the dialog still on top, no palette", sleep=pilot.pause)
        assert any("palette" in m for _, m, _ in notices), notices
        await pilot.press(*"stop", "enter")  # what the audit typed into the palette: lands on the dialog
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen | ProfilePickerScreen))
        await holds_async(lambda: agent.posts() == [] and len(app.screen_stack) == 1, 0.5,
                          what="nothing posted, no dialog left behind", sleep=pilot.pause)


async def test_confirm_dialog_still_works_after_a_refused_palette(agent):
    app, notices = app_with_notices(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_screen(pilot, app, "R", ConfirmScreen)
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: agent.posts() != [])
        assert agent.posts() == [("/v1/restart", {"expect_run": 3})]
        await wait_for(pilot, lambda: any("restart accepted" in t for t, _, _ in notices))


class SlowPostAgent(FakeAgent):
    """Answers a control only once the test releases it: the answer is still awaited whenever the test presses
    its next key (a fixed 1 s hold let a loaded machine's slow key press land after the answer)."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.release = threading.Event()

    async def _post(self, request: web.Request) -> web.Response:
        answer = await super()._post(request)
        await asyncio.to_thread(self.release.wait, 60)
        return answer


async def test_second_control_while_one_awaits_its_answer_is_refused_not_cancelling_it(sock_dir):
    """X pressed while a restart waits for its answer: the restart's answer is still shown, no stop dialog."""
    agent = SlowPostAgent(sock_dir / "agent.sock").start()
    try:
        app, notices = app_with_notices(agent.socket_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await open_screen(pilot, app, "R", ConfirmScreen)
            await pilot.press("tab", "enter")
            await wait_for(pilot, lambda: agent.posts() != [])
            await pilot.press("X")
            await wait_for(pilot, lambda: any("restart" in m and "wait" in m for _, m, sev in notices
                                              if sev == "warning"), 30)
            assert not isinstance(app.screen, ConfirmScreen)
            assert not any("restart accepted" in t for t, _, _ in notices)  # the answer was still awaited
            agent.release.set()
            await wait_for(pilot, lambda: any("restart accepted" in t for t, _, _ in notices), 30)
            assert not isinstance(app.screen, ConfirmScreen)
            assert agent.posts() == [("/v1/restart", {"expect_run": 3})]
    finally:
        agent.release.set()
        agent.stop()
