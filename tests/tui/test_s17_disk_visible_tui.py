"""The dashboard on a full disk (audit, session 17): the header said `agent ✓` while every tick was refused and
nothing under tui/ read the store's error or the run's log problem. The header now carries `HISTORY ✗ <why>`
while history is not written, kept at 80 columns by its priorities (after the agent's health, before the SLA),
and the Node view's serving line says why the run's log is not kept.

A fake agent answers on a real unix socket; the app is the real one under Textual's Pilot.
"""

from __future__ import annotations

from support.tui import make_app, screen_text, wait_for

FULL = {"path": "/var/lib/lynxtop/lynxtop.db", "queued": 1234, "dropped": 56, "rejected": 0,
        "last_error": "database or disk is full", "retrying": True, "free_bytes": 0}
LOG_PROBLEM = "the file system of the run's log /var/log/lynxtop/runs/3.log is full (0 bytes free)"
BREACH = {"state": "breach", "ttft_p99_ms": 38_640.0, "tpot_p99_ms": 199.0, "ttft_threshold_ms": 2000,
          "tpot_threshold_ms": 150, "window_s": 60}
SWITCH = {"action": "switch", "profile": "dsv41-tp8-ep", "by": "uid 0"}


def _header_line(app) -> str:
    return screen_text(app).splitlines()[0]


async def _header_at(agent, size: tuple[int, int]) -> str:
    app = make_app(agent.socket_path)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.connected and "READY" in _header_line(app))
        return _header_line(app)


async def test_header_says_history_is_not_written_at_80_columns(agent):
    agent.status["agent"]["store"] = dict(FULL)
    line = await _header_at(agent, (80, 24))
    assert "HISTORY ✗ full" in line, line  # the pressed line's short cause
    # the agent is healthy: systemd's watchdog must not restart it into the full disk
    assert "agent ✓" in line and "…" not in line, line
    assert "HISTORY ✗ disk full" in await _header_at(agent, (120, 40))


async def test_history_badge_survives_a_breach_at_80_columns(agent):
    agent.status["agent"]["store"] = dict(FULL)
    agent.status["sla"].update(BREACH)
    line = await _header_at(agent, (80, 24))
    # the pressed line keeps the badge before the SLA, whose figures (least important here) are cut first
    assert "agent ✓" in line and "HIST ✗ full" in line and "SLA ✗" in line, line


async def test_history_badge_survives_a_breach_and_an_action_at_80_columns(agent):
    """A real node (no SIMULATED badge): the pressed line keeps the action, the health and the badge; the SLA,
    least important, is cut as it was before."""
    agent.status["agent"].update(store=dict(FULL), action=SWITCH, simulated=False)
    agent.status["sla"].update(BREACH)
    line = await _header_at(agent, (80, 24))
    assert "⟳ switch dsv41-tp8-ep" in line and "agent ✓" in line, line
    assert "HIST ✗ full" in line, line


async def test_history_badge_comes_after_the_agent_health_and_before_the_sla(agent):
    agent.status["agent"]["store"] = {**FULL, "last_error": "database is locked", "free_bytes": 10**12}
    line = await _header_at(agent, (200, 40))
    assert "HISTORY ✗ database locked" in line, line
    positions = [line.index(word) for word in ("READY", "agent ✓", "HISTORY ✗", "SLA ✓")]
    assert positions == sorted(positions), line


async def test_no_badge_while_history_is_written(agent):
    agent.status["agent"]["store"] = {**FULL, "retrying": False, "last_error": None, "queued": 0, "dropped": 0}
    line = await _header_at(agent, (200, 40))
    assert "HISTORY" not in line, line


async def test_node_view_says_why_the_run_log_is_not_kept(agent):
    agent.status["serving"]["log_problem"] = LOG_PROBLEM
    app = make_app(agent.socket_path)
    async with app.run_test(size=(200, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected and "READY" in _header_line(app))
        await wait_for(pilot, lambda: "run log not kept" in screen_text(app))
        line = next(ln for ln in screen_text(app).splitlines() if "run log not kept" in ln)
        assert LOG_PROBLEM in line, line
