"""The command palette in ASCII mode shows an ASCII prompt mark: Textual's search icon (a wide emoji) came out of
the ASCII filter as `??` before the input."""

from __future__ import annotations

from support.tui import make_app, wait_for
from textual.command import CommandPalette, SearchIcon


async def test_the_palettes_icon_is_ascii_in_ascii_mode(agent):
    app = make_app(agent.socket_path, ascii_only=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        await pilot.press("colon")
        await wait_for(pilot, lambda: CommandPalette.is_open(app))
        await wait_for(pilot, lambda: all(str(i.icon).isascii() for i in app.screen.query(SearchIcon)))
        assert [str(i.icon) for i in app.screen.query(SearchIcon)] == [">"]


async def test_the_palettes_icon_is_textuals_otherwise(agent):
    app = make_app(agent.socket_path, ascii_only=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        await pilot.press("colon")
        await wait_for(pilot, lambda: CommandPalette.is_open(app) and len(app.screen.query(SearchIcon)) == 1)
        assert str(app.screen.query_one(SearchIcon).icon) == str(SearchIcon.icon._default)
