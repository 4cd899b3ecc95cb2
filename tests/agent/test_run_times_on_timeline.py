"""A run's times (start, ready, end, state changes) are stamped on the agent's timeline, the clock its samples are
stamped with: after the wall clock was stepped, `export --run N` and the run's summary select its samples by
that span. On the wall clock (as before) a run started a day after a one-day step back matched no sample, and a
run spanning a backward step ended before it started."""

from __future__ import annotations

import time

import pytest

from lynxtop.agent.clock import Timeline
from lynxtop.agent.serving import run as serving_run

pytestmark = pytest.mark.timeout(60)
DAY_MS = 86_400_000


@pytest.fixture
def timeline_a_day_ahead():
    """The agent's timeline as it is after the wall clock was stepped back a day under a running agent."""
    real = time.time
    tl = Timeline(wall=lambda: real() + DAY_MS / 1000)
    serving_run.use_clock(tl.now_ms)
    yield tl
    serving_run.use_clock(None)


async def test_a_runs_span_is_on_the_agents_timeline(make_sup, store, h, timeline_a_day_ahead):
    tl = timeline_a_day_ahead
    sup = make_sup()
    before = tl.now_ms()
    await sup.start("alpha", by="test")
    await h.wait_for(lambda: sup.state == "ready", 15, what="ready")
    await sup.stop(by="test")
    await h.wait_for(lambda: sup.state == "stopped", 15, what="stopped")
    after = tl.now_ms()
    store.flush()
    row = h.db_rows(store.path, "SELECT * FROM runs")[-1]
    assert before <= row["started_ms"] <= row["ready_ms"] <= row["ended_ms"] <= after, (before, row, after)
    st = sup.serving_status()
    assert before <= st.state_since_ms <= after


def test_without_a_node_runs_use_the_wall_clock():
    serving_run.use_clock(None)
    assert abs(serving_run.now_ms() - time.time() * 1000) < 1000
