"""Session 25: a server the agent holds (left serving by the previous agent, not supervised: `serving.held`) on the
dashboard. The Stop dialog in STOPPED said "nothing runs, so nothing is lost. The agent will answer that it is
already stopped" while vLLM served on the GPUs, and the header said STOPPED alone. Now the dialog says what runs and
that Stop ends it (its load lost), the header marks it beside the state, and a dialog shown for a held server is
withdrawn once that server is gone (it would no longer end what it showed).
"""

from __future__ import annotations

from typing import Any

from support.tui import app_with_notices, make_app, plain, screen_text, text_of, wait_for
from support.tui_keys import open_screen
from support.waits import holds_async
from tui_fake_agent import FakeAgent

from lynxtop.contract.status import HeldRun, ServingState, ServingStatus
from lynxtop.tui.control_text import Seen, run_change, stop_text
from lynxtop.tui.screens.confirm import ConfirmScreen
from lynxtop.tui.widgets.node_header import NodeHeader, header_line

HELD = {"run_id": 12, "profile": "dsv41", "pid": 4242}


def _held(agent: FakeAgent, held: dict[str, Any] | None = HELD) -> None:
    """The agent's answer with a held server: stopped, no run of its own."""
    agent.status["serving"] = {**agent.status["serving"], "state": "stopped", "run_id": None, "pid": None,
                               "profile": None, "ready_ms": None, "held": held,
                               "reason": "agent started; run 12 (profile dsv41, pid 4242) left by the previous agent "
                                         "was not adopted and is not supervised (serving.not_adopted): `lynxtop "
                                         "stop` ends it"}


def _dialog_text(screen: ConfirmScreen) -> str:
    return plain(screen.title_text) + plain(screen.body)


def test_stop_text_names_the_held_server_and_says_stop_ends_it():
    srv = ServingStatus(state=ServingState.STOPPED, held=HeldRun(run_id=12, profile="dsv41", pid=4242))
    text = plain(stop_text(srv))
    assert "already stopped" not in text and "nothing is lost" not in text, text
    assert "run 12" in text and "pid 4242" in text and "dsv41" in text, text
    assert "previous agent" in text and "Stop ends it" in text, text
    assert "load" in text and "lost" in text, text
    # without one, the words for nothing running stay
    assert "already stopped" in plain(stop_text(ServingStatus(state=ServingState.STOPPED)))


def test_a_held_server_gone_withdraws_the_dialog_that_showed_it():
    held = ServingStatus(state=ServingState.STOPPED, held=HeldRun(run_id=12, profile="dsv41", pid=4242))
    none = ServingStatus(state=ServingState.STOPPED)
    why = run_change(Seen.of(held), Seen.of(none))
    assert why is not None and "4242" in why, why
    assert run_change(Seen.of(none), Seen.of(none)) is None
    assert run_change(Seen.of(held), Seen.of(held)) is None


async def test_the_stop_dialog_on_a_held_server_says_what_runs_and_sends_the_stop(agent):
    _held(agent)
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected and app.state.serving.held is not None)
        dialog = await open_screen(pilot, app, "X", ConfirmScreen)
        text = _dialog_text(dialog)
        assert "already stopped" not in text and "nothing is lost" not in text, text
        assert "run 12" in text and "pid 4242" in text and "Stop ends it" in text, text
        await pilot.press("tab", "enter")  # onto Stop, and confirmed
        await wait_for(pilot, lambda: [p for p, _ in agent.posts()] == ["/v1/stop"], 30)


async def test_the_header_marks_the_held_server_beside_the_state(agent):
    _held(agent)
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected and app.state.serving.held is not None)
        header = app.screen.query_one(NodeHeader)
        await wait_for(pilot, lambda: "held run 12 pid 4242" in text_of(header))
        line = text_of(header)
        assert line.index("STOPPED") < line.index("held run 12 pid 4242"), line
        # the most pressed line still says it (an 80-column header with everything else on it)
        assert "held" in header_line(app.state, 0, [], None, level=3).plain
        _held(agent, None)  # the stop ended it: the mark goes
        await wait_for(pilot, lambda: app.state.serving.held is None)
        await wait_for(pilot, lambda: "held" not in text_of(header))


async def test_a_stop_dialog_for_a_held_server_is_withdrawn_when_it_ends(agent):
    _held(agent)
    app, notices = app_with_notices(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected and app.state.serving.held is not None)
        await open_screen(pilot, app, "X", ConfirmScreen)
        await pilot.press("tab")
        _held(agent, None)  # ended by other means while the dialog was open
        await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen), 30)
        await pilot.press("enter")
        await holds_async(lambda: agent.posts() == [], 0.6, what="nothing posted", sleep=pilot.pause)
        assert any(n[2] == "warning" and "4242" in n[1] for n in notices), notices


async def test_the_cluster_view_row_of_a_node_with_a_held_server_says_held(agent):
    """The fleet view read STOPPED for a head whose agent holds a vLLM the previous agent left serving (serving.held):
    the row now says HELD with its pid, where the state goes."""
    from test_cluster_view import _open_cluster, head_status, ray_node

    st = head_status(ray_node("10.0.0.1", head=True, name="head-1"))
    st["serving"].update(state="stopped", run_id=None, pid=None,
                         held={"run_id": 12, "profile": "dsv41", "pid": 4242})
    agent.status = st
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await _open_cluster(pilot)
        screen.redraw()
        line = next(ln for ln in screen_text(app).splitlines() if "head-1" in ln)
        assert "HELD pid 4242" in line and "STOPPED" not in line, line
