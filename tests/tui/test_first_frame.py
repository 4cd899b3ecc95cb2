"""The dashboard's start (issue 27, benchmarks/tui.py first_frame_s): what it does before its first frame and what
waits until after it. Against the FAKE agent on a real unix socket; no timing is asserted, only order and counts.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator

import pytest
from support.tui import make_app, text_of, wait_for
from support.waits import wait_for as wait_until

from lynxtop.cli.dashboard_cmd import run
from lynxtop.cli.parser import build_parser
from lynxtop.contract.client import AgentUnreachable
from lynxtop.contract.status import Status
from lynxtop.tui.app import LynxtopApp
from lynxtop.tui.screens.node import NodeScreen
from lynxtop.tui.source import LiveSource
from lynxtop.tui.widgets.gpu_table import GpuTable


def _status_gets(agent) -> int:
    return sum(1 for method, path, _ in agent.requests if (method, path) == ("GET", "/v1/status"))


@pytest.fixture
def gc_restored() -> Iterator[None]:
    """The test process' collector as it was, whatever the app under test did with it."""
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


@pytest.fixture
def draws(monkeypatch) -> list[tuple[bool, bool]]:
    """Every Node view draw: (a status was there to draw, the collector was running)."""
    seen: list[tuple[bool, bool]] = []
    original = NodeScreen.draw

    def draw(self: NodeScreen, now_ms: int) -> None:
        seen.append((self.lynx.state.status is not None, gc.isenabled()))
        original(self, now_ms)

    monkeypatch.setattr(NodeScreen, "draw", draw)
    return seen


async def test_prefetched_status_answers_the_first_poll_without_asking_again(agent):
    source = LiveSource(agent.socket_path)
    source.prefetch_status()
    wait_until(lambda: _status_gets(agent) == 1, what="the prefetch's GET /v1/status at the agent")
    first = await source.status()
    assert isinstance(first, Status) and first.serving.profile == "dsv41-tp8"
    assert _status_gets(agent) == 1  # the prefetch's answer, not a second request
    await source.status()
    assert _status_gets(agent) == 2  # taken once: the next poll asks the agent


async def test_a_failed_prefetch_is_the_first_polls_failure(tmp_path):
    source = LiveSource(tmp_path / "nothing.sock")
    source.prefetch_status()
    with pytest.raises(AgentUnreachable, match="no agent socket"):
        await source.status()
    assert source.first_status() is None


async def test_first_frame_draws_the_prefetched_status_and_the_next_poll_waits_an_interval(agent, draws):
    source = LiveSource(agent.socket_path)
    source.prefetch_status()
    wait_until(lambda: source._early is not None and source._early.done(), what="the prefetched status")
    app = make_app(agent.socket_path, None, source=source, poll_interval_s=30)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: draws)
        assert draws[0][0], "the Node view's first draw had no status: its first paint showed empty panels"
        assert app.screen.query_one(GpuTable).row_count == 8
        assert "READY" in text_of(app.screen.query_one("#header"))
        await pilot.pause()
        assert _status_gets(agent) == 1  # no second request at mount: the next poll is an interval away


async def test_collection_is_paused_until_the_first_frame(agent, draws, gc_restored):
    gc.disable()  # as the entry does (cli/dashboard_cmd.py)
    app = make_app(agent.socket_path, None, gc_paused=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.status is not None)
        await wait_for(pilot, gc.isenabled)
        first_with_status = next(enabled for has_status, enabled in draws if has_status)
        assert first_with_status is False  # the first full frame was drawn with the collector paused


async def test_collection_resumes_when_the_agent_is_down_from_the_start(tmp_path, gc_restored):
    gc.disable()
    app = make_app(tmp_path / "no-agent.sock", None, gc_paused=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.outage is not None)
        await wait_for(pilot, gc.isenabled)


async def test_an_app_not_told_so_leaves_the_collector_alone(agent, gc_restored):
    gc.disable()  # e.g. a test or an embedding that keeps it off on purpose
    app = make_app(agent.socket_path, None)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.status is not None)
        await pilot.pause()
        assert not gc.isenabled()


class _Tty:
    def isatty(self) -> bool:
        return True


def test_entry_asks_for_the_status_before_the_app_and_pauses_collection(agent, monkeypatch, tmp_path, gc_restored):
    """`lynxtop`: the status request reaches the agent before the app runs, and the app starts with the collector
    paused and told to resume it; after the app the collector runs again."""
    seen: dict[str, object] = {}

    def fake_run(self: LynxtopApp) -> None:
        seen["gc"] = gc.isenabled()
        seen["paused"] = self._gc_paused
        seen["gets"] = _status_gets(agent)
        assert isinstance(self.source, LiveSource) and self.source._early is not None
        seen["status"] = self.source._early.result(timeout=10)

    monkeypatch.setattr(LynxtopApp, "run", fake_run)
    monkeypatch.setattr(sys, "stdin", _Tty())
    monkeypatch.setattr(sys, "__stderr__", _Tty())
    args = build_parser().parse_args(["--socket", str(agent.socket_path), "--database", str(tmp_path / "h.db")])
    assert run(args) == 0
    assert seen["gc"] is False and seen["paused"] is True
    assert isinstance(seen["status"], Status)
    assert _status_gets(agent) == 1  # one request, made by the entry before the app: the app's first poll takes it
    assert gc.isenabled()


def test_command_entry_collects_again_before_the_command_runs(monkeypatch, gc_restored):
    """cli/__main__.py pauses collection only while the command's modules import: a command (the agent, for days)
    runs with it on."""
    import lynxtop.cli.__main__ as entry
    import lynxtop.cli.config_cli as config_cli

    seen = []
    monkeypatch.setattr(config_cli, "check", lambda args: seen.append(gc.isenabled()) or 0)
    assert entry.main(["config", "check"]) == 0
    assert seen == [True]



async def test_first_stylesheet_holds_only_what_the_node_view_draws_the_rest_comes_with_its_screens(agent):
    """tui/views.tcss (the other views' and the dialogs' rules) is parsed when the first of them opens, not three
    times during the start; opened, its rules apply (the help dialog's border, the history layout)."""
    from lynxtop.tui.screens import VIEWS_CSS
    from lynxtop.tui.screens.help import HelpScreen

    app = make_app(agent.socket_path, None)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.status is not None)
        sources = {path for path, _ in app.stylesheet.source}
        assert str(VIEWS_CSS) not in sources
        names = set().union(*(rule.selector_names for rule in app.stylesheet.rules))
        assert "#gpus" in names and not names & {"#dialog", "#history-main", "#runs", "#log"}
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        assert str(VIEWS_CSS) in {path for path, _ in app.stylesheet.source}
        border = app.screen.query_one("#dialog").styles.border
        assert border.top[0] == "thick"  # HelpScreen #dialog { border: thick $primary; }
        await pilot.press("escape", "4")
        await wait_for(pilot, lambda: app.current_mode == "history")
        await pilot.pause()
        assert app.screen.query_one("#runs").styles.max_height is not None  # compact at 120 columns: max-height 7


@pytest.mark.parametrize("size", [(120, 40), (160, 48), (70, 20)])
async def test_size_classes_are_set_before_the_views_widgets_mount(agent, monkeypatch, size):
    """-compact, -tall and -too-small change the styles of every widget of a view: set once the widgets are mounted,
    each restyled the whole screen during the start."""
    from lynxtop.tui.screens import base

    changes: list[tuple[str, int]] = []
    original = base._set_class

    def record(node, on: bool, name: str) -> None:
        if node.has_class(name) != on and name in ("-compact", "-tall", "-too-small"):
            changes.append((name, len(node.children)))
        original(node, on, name)

    monkeypatch.setattr(base, "_set_class", record)
    app = make_app(agent.socket_path, None)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.status is not None)
        await pilot.pause()
    assert changes, "the terminal's size set no class"
    assert all(children == 0 for _, children in changes), changes
