"""The dashboard's start-up line of a slow load: how long it has loaded and the most it may (readiness_timeout_s),
so an operator watching a 20-minute load sees it is inside its timeout; an older agent's status shows no limit."""

from __future__ import annotations

import math
import re

import pytest
from support.tui import make_app, text_of, wait_for
from tui_fake_agent import make_status

from lynxtop.tui.widgets.startup_phases import StartupPhases


def _starting(t: int, **over) -> dict:
    return make_status(state="starting", ts_ms=t, phase="loading weights", phase_since_ms=t - 252_000,
                       started_ms=t - 252_000, state_since_ms=t - 252_000, ready_ms=None,
                       phases=[{"phase": "loading weights", "ts_ms": t - 252_000}], **over)


async def test_a_slow_load_shows_the_most_it_may_take(agent):
    t = agent.status["ts_ms"]
    agent.status = _starting(t, ready_timeout_s=1800.0, ready_deadline_ms=t - 252_000 + 1_800_000)
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        phases = app.screen.query_one(StartupPhases)
        await wait_for(pilot, lambda: phases.has_class("-visible"))
        text = text_of(phases)
        # the dashboard's clock runs a few seconds past the status' own: 4m1Xs
        assert re.search(r"start-up: 4m1\ds of at most 30m00s \(readiness_timeout_s\) ▶ loading weights 4m1\ds",
                         text), text


async def test_an_older_agent_without_the_deadline_shows_the_phases_alone(agent):
    t = agent.status["ts_ms"]
    agent.status = _starting(t)
    assert "ready_timeout_s" not in agent.status["serving"]
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        phases = app.screen.query_one(StartupPhases)
        await wait_for(pilot, lambda: phases.has_class("-visible"))
        text = text_of(phases)
        assert re.search(r"start-up: 4m1\ds ▶ loading weights", text) and "at most" not in text, text


@pytest.mark.parametrize("odd", [{"ready_timeout_s": math.nan}, {"ready_timeout_s": math.inf},
                                 {"ready_timeout_s": 10.0**20, "ready_deadline_ms": 10**20},
                                 {"ready_timeout_s": -5.0, "ready_deadline_ms": -(10**20)},
                                 {"ready_timeout_s": 0.0, "ready_deadline_ms": None}])
async def test_odd_deadlines_leave_the_dashboard_up(agent, odd):
    t = agent.status["ts_ms"]
    agent.status = _starting(t, **odd)
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        phases = app.screen.query_one(StartupPhases)
        await wait_for(pilot, lambda: phases.has_class("-visible"))
        await pilot.pause(0.3)
        assert app._exception is None, repr(app._exception)
        assert "start-up" in text_of(phases)
