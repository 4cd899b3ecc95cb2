"""Issue 25.3 on the dashboard: labels that look like markup ('[/]', '[bold') and control sequences, from the
agent (status, profiles, events, logs, a refusal) and from the history database (runs, flags), are shown as
text: no MarkupError, no style, and no control character reaches the terminal's segments. Driven by Pilot."""

from __future__ import annotations

import dataclasses
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from support.status import engine_loads
from support.tui import make_app, plain, screen_text, wait_for
from support.tui_keys import open_screen
from textual.widgets import DataTable, Log
from textual.widgets._toast import Toast
from tui_fake_agent import T0, make_status

from lynxtop.store.writer import StoreWriter
from lynxtop.tui.screens.compare import CompareScreen
from lynxtop.tui.screens.confirm import ConfirmScreen
from lynxtop.tui.screens.events import EventsScreen
from lynxtop.tui.screens.history import HistoryScreen
from lynxtop.tui.screens.profile_picker import ProfilePickerScreen
from lynxtop.tui.widgets.engine_table import EngineTable
from lynxtop.tui.widgets.serving_panel import ServingPanel

# markup that would crash ([/]) or style ([bold]) if parsed, a screen clear, a retitle, a C1 CSI, a bidi override
EVIL = "[/][bold]\x1b[2J\x1b]0;owned\x07\x9b31m\u202e"
SHOWN = "[/][bold]\\x1b[2J\\x1b]0;owned\\x07\\x9b31m\\u202e"
CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def raw_controls(app) -> list[str]:
    """Every segment on screen (modal layers included) that holds a control character: what the terminal gets."""
    strips = app.screen._compositor.render_strips()
    return [seg.text for strip in strips for seg in strip if CONTROLS.search(seg.text)]


def shown_text(app) -> str:
    return screen_text(app).replace("\n", "")


@pytest.fixture
def hostile_db():
    d = Path(tempfile.mkdtemp(prefix="lt-evil-", dir="/tmp"))
    path = d / "history.db"
    w = StoreWriter(path, clock=lambda: T0 / 1000)
    w.start()
    for i, value in enumerate(("1" + EVIL, "2")):
        run = w.create_run(profile=f"p{i}", argv=["vllm", "serve", "m"], model="model" + EVIL, host="h",
                           started_ms=T0 - (2 - i) * 600_000, pid=10 + i, log_path="", simulated=True,
                           flags={"--chat-template": value})
        w.update_run(run, ready_ms=T0 - (2 - i) * 600_000 + 60_000, ended_ms=T0 - (1 - i) * 600_000 - 1000,
                     exit_code=0, end_reason="stopped" + EVIL)
    w.close()
    yield path
    shutil.rmtree(d, ignore_errors=True)


def _hostile_agent(agent) -> None:
    agent.status = make_status(model="m" + EVIL, vllm_version="0.99" + EVIL, profile="dsv41-tp8", reason="r" + EVIL,
                               agent={"host": "h" + EVIL})
    agent.events[0] = dataclasses.replace(agent.events[0], message="event" + EVIL)
    agent.log_lines.append("log line" + EVIL)
    target = agent.profiles["profiles"][1]
    target["description"] = "d" + EVIL
    target["flags"]["--chat-template"] = "tpl" + EVIL


async def test_node_and_events_views_show_foreign_text_escaped(agent):
    _hostile_agent(agent)
    app = make_app(agent.socket_path)
    async with app.run_test(size=(200, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.connected and f"0.99{SHOWN}" in shown_text(app)
                       and f"h{SHOWN}" in shown_text(app))
        assert raw_controls(app) == []
        screen = await open_screen(pilot, app, "5", EventsScreen)
        await wait_for(pilot, lambda: screen.query_one("#events", DataTable).row_count == 3
                       and screen.query_one("#log", Log).line_count > 40)
        await wait_for(pilot, lambda: f"event{SHOWN}" in shown_text(app) and f"log line{SHOWN}" in shown_text(app))
        assert raw_controls(app) == []


async def test_switch_dialog_and_refusal_show_foreign_text_as_text(agent):
    _hostile_agent(agent)
    agent.post_answers["switch"] = (422, {"error": "preflight", "message": "preflight failed: " + EVIL})
    app = make_app(agent.socket_path)
    async with app.run_test(size=(200, 48), notifications=True) as pilot:
        await open_screen(pilot, app, "P", ProfilePickerScreen)
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen)
                       and "Switch to profile" in shown_text(app))  # the dialog drawn
        assert raw_controls(app) == []
        text = plain(app.screen.body, width=400)
        assert f"tpl{SHOWN}" in text and f"d{SHOWN}" in text  # the flag difference and the description
        await pilot.press("tab", "enter")  # confirm: the agent refuses, quoting the foreign text
        await wait_for(pilot, lambda: "preflight failed" in shown_text(app))  # the toast drawn
        assert raw_controls(app) == []
        assert [n.message for n in app._notifications if n.message.startswith("preflight")] == \
            [f"preflight failed: {SHOWN}"]


async def test_history_and_compare_show_the_databases_words_as_text(sock_dir, hostile_db):
    app = make_app(sock_dir / "absent.sock", hostile_db, utc=True)
    async with app.run_test(size=(200, 48)) as pilot:
        screen = await open_screen(pilot, app, "4", HistoryScreen, connected=False)
        # the end reason, shown as text (its column cuts it, with an ellipsis; the cell holds it whole, escaped)
        await wait_for(pilot, lambda: len(screen.runs) == 2 and "stopped[/][bold" in shown_text(app))
        assert raw_controls(app) == []
        assert str(screen.query_one("#runs", DataTable).get_row_at(0)[4]) == f"stopped{SHOWN}"
        screen.query_one("#runs", DataTable).focus()
        await pilot.press("c", "down", "c")
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen))
        # the flag's value, not parsed as markup
        await wait_for(pilot, lambda: "flag difference" in shown_text(app) and f"1{SHOWN}" in shown_text(app))
        assert raw_controls(app) == []


MARKUP = "[/] [bold]not bold [link=x]"


async def test_markup_like_labels_are_shown_not_parsed(agent, hostile_db):
    """Markup alone (no control character): a flag's name in the switch dialog and a refusal's message would
    raise MarkupError, and the database's flags in the compare dialog too, if handed over as markup."""
    agent.profiles["profiles"][1]["flags"]["--x" + MARKUP] = "1"  # a flag's name, from extra_args
    agent.post_answers["switch"] = (422, {"error": "preflight", "message": MARKUP})
    app = make_app(agent.socket_path, hostile_db)
    async with app.run_test(size=(200, 48), notifications=True) as pilot:  # toasts drawn, as on a terminal
        await open_screen(pilot, app, "P", ProfilePickerScreen)
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert f"--x{MARKUP}" in plain(app.screen.body, width=400)
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: any(n.message == MARKUP for n in app._notifications))
        # the toast mounted; markup would raise in render()
        await wait_for(pilot, lambda: any(MARKUP in plain(t.render(), width=400) for t in app.screen.query(Toast)))
        screen = await open_screen(pilot, app, "4", HistoryScreen)
        await wait_for(pilot, lambda: len(screen.runs) == 2)
        screen.query_one("#runs", DataTable).focus()
        await pilot.press("c", "down", "c")
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen))
        await wait_for(pilot, lambda: "flag difference" in shown_text(app))
        assert "[/][bold]" in plain(app.screen.query_one("#compare-body").content, width=400)


@pytest.mark.parametrize("label", ["[/]", "[bold red]5", "[@click=app.quit]5"])
async def test_an_engine_label_that_looks_like_markup_is_shown_as_text(agent, label):
    """An engine's label is vLLM's (its metrics page's `engine` label): in the Serving panel's and the per-engine
    table's border it is shown as written, never parsed ('[/]' raised MarkupError and closed the dashboard,
    '[bold red]' styled, '[@click=...]' made an action of it)."""
    engines = engine_loads(waiting={5: 9}, kv={5: 96.0})
    engines[5]["engine"] = label
    agent.status = make_status(engines=engines)
    app = make_app(agent.socket_path)
    async with app.run_test(size=(200, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.connected and len(app.state.engines) == 8)
        await wait_for(pilot, lambda: f"engine {label} lagging" in screen_text(app))
        assert app._exception is None, repr(app._exception)
        await pilot.press("e")  # the per-engine table, its border naming the lagging engine too
        table = app.screen.query_one(EngineTable)
        await wait_for(pilot, lambda: table.display and not app.screen.query_one(ServingPanel).display
                       and f"engine {label} lagging" in screen_text(app))
        assert app._exception is None, repr(app._exception)
