"""`lynxtop status` of a slow load: how long it has loaded and how long it may still load before it is stopped
(readiness_timeout_s), read from the agent's status; an agent older than those fields still reads."""

from __future__ import annotations

from support.status import T0, make_status, status_json

from lynxtop.cli import ctl
from lynxtop.contract.status import ServingState, Status


def _starting(**over) -> Status:
    started = T0 - 252_000  # 4m12s ago
    return make_status(state="starting", phase="loading weights", phase_since_ms=started, started_ms=started,
                       state_since_ms=started, ready_ms=None, **over)


def test_a_starting_run_says_how_long_it_may_still_load():
    st = _starting(ready_timeout_s=1800.0, ready_deadline_ms=T0 - 252_000 + 1_800_000)
    assert st.serving.ready_timeout_s == 1800.0
    text = ctl.format_status(st)
    assert "loading for 4m12s of at most 30m00s (readiness_timeout_s 1800)" in text, text
    assert "stopped in 25m48s unless ready" in text, text


def test_the_time_left_follows_the_deadline_of_an_adopted_load():
    """An adopted load's deadline counts from its process's start (the agent's own figure), not from the
    started_ms the previous agent recorded: the status says what the agent will do."""
    st = _starting(ready_timeout_s=600.0, ready_deadline_ms=T0 + 60_000)
    text = ctl.format_status(st)
    assert "loading for 9m00s of at most 10m00s (readiness_timeout_s 600): stopped in 1m00s unless ready" in text


def test_an_older_agent_without_the_deadline_still_reads_and_shows_no_deadline():
    raw = status_json(state="starting", phase="loading weights", phase_since_ms=T0 - 1000, ready_ms=None)
    assert "ready_timeout_s" not in raw["serving"] and "ready_deadline_ms" not in raw["serving"]
    st = Status.from_json(raw)
    assert st.serving.state == ServingState.STARTING
    assert st.serving.ready_timeout_s is None and st.serving.ready_deadline_ms is None
    text = ctl.format_status(st)
    assert "phase: loading weights" in text and "readiness_timeout_s" not in text


def test_the_fields_go_over_the_wire_and_only_while_starting_they_show():
    st = _starting(ready_timeout_s=1800.0, ready_deadline_ms=T0 + 1_000_000)
    back = Status.from_json(st.to_json())
    assert back.serving.ready_timeout_s == 1800.0 and back.serving.ready_deadline_ms == T0 + 1_000_000
    ready = make_status(state="ready", ready_timeout_s=None, ready_deadline_ms=None)
    assert "readiness_timeout_s" not in ctl.format_status(ready)


def test_odd_deadlines_still_print():
    for odd in ({"ready_timeout_s": float("nan")}, {"ready_timeout_s": 1e20, "ready_deadline_ms": 10**20},
                {"ready_timeout_s": -5.0, "ready_deadline_ms": -(10**20)}, {"ready_timeout_s": 0.0}):
        text = ctl.format_status(_starting(**odd))
        assert "serving  STARTING" in text
