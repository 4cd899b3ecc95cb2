"""A key pressed on the dashboard under test and the screen it opens, awaited the way a user would."""

from __future__ import annotations

from typing import Any

from textual.screen import Screen

from lynxtop.tui.screens.history import HistoryScreen
from support.tui import wait_for


async def open_screen(pilot: Any, app: Any, key: str, screen: type[Screen], *, connected: bool = True) -> Screen:
    """Waits for the agent's first answer before the key (pressed earlier, a control key has no status to act on),
    then for the screen: it is pushed a message later, not by the press itself."""
    if connected:
        await wait_for(pilot, lambda: app.state.connected)
    await pilot.press(key)
    await wait_for(pilot, lambda: isinstance(app.screen, screen))
    return app.screen


async def open_history(pilot: Any, app: Any, runs: int = 1) -> HistoryScreen:
    """The History view (key 4) once it listed `runs` runs and drew its charts: what a test reads is then there."""
    screen = await open_screen(pilot, app, "4", HistoryScreen)
    await wait_for(pilot, lambda: len(screen.runs) == runs and screen.last_draw_ms is not None)
    return screen
