"""SIMULATED wherever the node is known to be simulated: the demo's dashboard says so from its first frame, before
any status, and on the too-small screen (which hides the header); a dashboard that does not know yet claims
neither real nor simulated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.tui import make_app, text_of, wait_for
from tui_fake_agent import make_status

from lynxtop.cli import demo
from lynxtop.tui.widgets.node_header import NodeHeader


async def test_demo_header_says_simulated_before_any_status(sock_dir: Path):
    app = make_app(sock_dir / "absent.sock", simulated=True)  # no agent: no status will ever arrive
    async with app.run_test(size=(100, 30)) as pilot:
        header = app.screen.query_one(NodeHeader)
        await wait_for(pilot, lambda: "waiting for the agent" in text_of(header))
        assert app.state.status is None
        assert "SIMULATED" in text_of(header)


async def test_normal_header_before_any_status_claims_nothing(sock_dir: Path):
    app = make_app(sock_dir / "absent.sock")
    async with app.run_test(size=(100, 30)) as pilot:
        header = app.screen.query_one(NodeHeader)
        await wait_for(pilot, lambda: "waiting for the agent" in text_of(header))
        assert "SIMULATED" not in text_of(header)


async def test_demo_too_small_terminal_says_simulated(sock_dir: Path):
    app = make_app(sock_dir / "absent.sock", simulated=True)
    async with app.run_test(size=(70, 20)) as pilot:
        await wait_for(pilot, lambda: app.screen.has_class("-too-small"))
        text = text_of(app.screen.query_one("#too-small"))
        assert "SIMULATED" in text and "needs at least 80×24" in text


@pytest.mark.parametrize("answers", [False, True], ids=["before_any_status", "real_node_status"])
async def test_normal_too_small_terminal_does_not_say_simulated(sock_dir: Path, agent, answers: bool):
    agent.status = make_status(simulated=False)
    app = make_app(agent.socket_path if answers else sock_dir / "absent.sock")
    async with app.run_test(size=(70, 20)) as pilot:
        await wait_for(pilot, lambda: app.screen.has_class("-too-small") and (app.state.connected or not answers))
        await pilot.pause()
        text = text_of(app.screen.query_one("#too-small"))
        assert "needs at least 80×24" in text and "SIMULATED" not in text


async def test_too_small_terminal_says_simulated_once_the_status_does(agent):
    """Not the demo, but the agent reports a simulated node: the too-small screen labels it when the status comes."""
    app = make_app(agent.socket_path)
    async with app.run_test(size=(70, 20)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        await wait_for(pilot, lambda: "SIMULATED" in text_of(app.screen.query_one("#too-small")))


def test_demo_starts_the_dashboard_as_simulated(tmp_path: Path):
    """`lynxtop demo` tells the dashboard its node is simulated (the flag the tests above give)."""
    made: dict[str, Any] = {}

    class App:
        return_code = 0

        def __init__(self, **kw: Any) -> None:
            made.update(kw)

        def run(self) -> None:
            pass

    d = demo.Demo(tmp_path, startup_seconds=0, keep=True)
    demo._run_dashboard(App, d, None)
    assert made.get("simulated") is True
