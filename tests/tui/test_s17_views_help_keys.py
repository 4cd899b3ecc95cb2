"""`?` lists what each key really does, read from the bindings in force: ctrl+c quits (it was listed as "Copy
selected text", Textual's screen binding that passes the key on when nothing is selected), and every key of a
binding is named (`F6` sorts the GPU table; it was shown as a second `s`). Tmux audit, session 16."""

from __future__ import annotations

from support.tui import make_app, screen_text, wait_for
from support.tui_keys import open_screen

from lynxtop.tui.screens.gpu import GpuScreen
from lynxtop.tui.screens.help import HelpScreen
from lynxtop.tui.widgets.gpu_table import GpuTable


def _rows(app) -> dict[str, str]:
    """The help's rows: each key (as listed, "q, ctrl+c" split) -> what the help says it does."""
    out: dict[str, str] = {}
    for keys, description in app.screen.keys:
        for key in keys.split(", "):
            out[key] = description
    return out


async def test_help_lists_every_app_key_with_what_it_does_and_f6(agent):
    app = make_app(agent.socket_path, utc=True)
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.screen.query_one("#gpus", GpuTable)
        await wait_for(pilot, lambda: table.row_count == 8)
        table.focus()
        await open_screen(pilot, app, "question_mark", HelpScreen)
        rows = _rows(app)
        for binding in app.BINDINGS:
            if not binding.description or app._check_action_state(binding.action, app) is False:
                continue  # no description (ctrl+p: the palette's second key), or hidden here (L: the demo's)
            for key in binding.key.split(","):
                label = "?" if key == "question_mark" else ":" if key == "colon" else key
                assert rows.get(label) == binding.description, (label, rows)
        assert rows["ctrl+c"] == "Quit"  # was "Copy selected text"
        assert not any("copy" in d.lower() for k, d in app.screen.keys if "ctrl+c" in k), app.screen.keys
        assert rows["F6"] == rows["s"] == "Sort column", rows  # F6 was missing
        text = screen_text(app)
        assert any("F6" in line and "Sort column" in line for line in text.splitlines()), text
        assert "ctrl+c" in text and not any("ctrl+c" in line and "opy" in line for line in text.splitlines()), text
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen))
        # what the help says is what the keys do: F6 sorts the table, ctrl+c quits (nothing is selected)
        table.focus()
        before = table.sort_key
        await pilot.press("f6")
        await wait_for(pilot, lambda: table.sort_key != before)
        await pilot.press("ctrl+c")
        await wait_for(pilot, lambda: app.return_code is not None)


async def test_help_names_each_key_of_a_two_key_binding(agent):
    """`left,h` shown as "←" made both rows "←": h (and l) were not listed."""
    app = make_app(agent.socket_path, utc=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_screen(pilot, app, "2", GpuScreen)
        await open_screen(pilot, app, "question_mark", HelpScreen)
        rows = _rows(app)
        assert rows["←"] == rows["h"] == "Prev GPU", rows
        assert rows["→"] == rows["l"] == "Next GPU", rows
