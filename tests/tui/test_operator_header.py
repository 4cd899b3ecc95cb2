"""The header an operator reads at 3 a.m. in an 80-column tmux pane: what matters most survives the width.

Paused display, an action in progress, the agent's health and every breached SLA metric must stay on the line;
the least important words are shortened or left out first (docs/dashboard.md, Node view).
"""

from __future__ import annotations

from support.tui import make_app, screen_text, wait_for

from lynxtop.tui.widgets.node_header import NodeHeader

BREACH = {"state": "breach", "ttft_p99_ms": 38_640.0, "tpot_p99_ms": 199.0, "ttft_threshold_ms": 2000,
          "tpot_threshold_ms": 150, "window_s": 60}
SWITCH = {"action": "switch", "profile": "dsv41-tp8-ep", "by": "uid 0"}


def _header_line(app) -> str:
    """The header's row as drawn: what the cut left of it."""
    return screen_text(app).splitlines()[0]


async def test_paused_survives_80_columns_after_the_toast(agent):
    app = make_app(agent.socket_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.connected and "READY" in _header_line(app))
        await pilot.press("p")
        app.clear_notifications()  # the toast fades; the header must still say it
        await pilot.pause()
        await wait_for(pilot, lambda: "PAUSED" in _header_line(app))
        await pilot.press("p")
        await wait_for(pilot, lambda: "PAUSED" not in _header_line(app))


async def test_paused_survives_a_breach_and_an_action_at_80_columns(agent):
    agent.status["sla"].update(BREACH)
    agent.status["agent"]["action"] = SWITCH
    app = make_app(agent.socket_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.connected and "READY" in _header_line(app))
        await pilot.press("p")
        await wait_for(pilot, lambda: "PAUSED" in _header_line(app))


async def test_breach_and_action_at_80_columns_keep_the_action_and_agent_health(agent):
    agent.status["sla"].update(BREACH)
    agent.status["agent"]["action"] = SWITCH
    app = make_app(agent.socket_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.connected and "READY" in _header_line(app))
        line = _header_line(app)
        assert "⟳ switch dsv41-tp8-ep" in line and "uid 0" in line, line
        assert "agent ✓" in line, line


async def test_breach_at_80_columns_is_shortened_not_cut(agent):
    agent.status["sla"].update(BREACH)
    app = make_app(agent.socket_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.connected and "READY" in _header_line(app))
        line = _header_line(app)
        assert "agent ✓" in line and "SLA ✗ TTFT 38.6s TPOT 199ms" in line, line
        assert "…" not in line, line


async def test_breach_and_action_at_120_columns_keep_both_metrics(agent):
    agent.status["sla"].update(BREACH)
    agent.status["agent"]["action"] = SWITCH
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected and "READY" in _header_line(app))
        line = _header_line(app)
        assert "⟳ switch dsv41-tp8-ep" in line and "agent ✓" in line, line
        assert "TTFT 38.6" in line and "TPOT 199" in line, line
        assert "…" not in line, line


async def test_breach_at_160_columns_keeps_the_full_detail(agent):
    agent.status["sla"].update(BREACH)
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected and "READY" in _header_line(app))
        line = _header_line(app)
        assert "SLA ✗ BREACH TTFT 38.64 s, TPOT 199 ms p99/60s" in line, line
        assert "agent ✓" in line, line


async def test_order_is_state_action_health_then_sla(agent):
    agent.status["sla"].update(BREACH)
    agent.status["agent"]["action"] = SWITCH
    app = make_app(agent.socket_path)
    async with app.run_test(size=(200, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected and "READY" in _header_line(app))
        line = _header_line(app)
        positions = [line.index(word) for word in ("READY", "⟳ switch", "agent ✓", "SLA ✗")]
        assert positions == sorted(positions), line
        assert app.screen.query_one(NodeHeader) is not None
