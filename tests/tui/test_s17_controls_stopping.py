"""While serving stops (the drain before a stop, restart or switch) the Node view's serving line says what drains,
for how long so far, and against which timeouts: a 20-minute model is not stopped blind."""

from __future__ import annotations

from support.status import T0, status_json
from support.tui import make_app, screen_text, text_of, wait_for

from lynxtop.contract.status import ServingStatus
from lynxtop.tui.live_state import LiveState
from lynxtop.tui.widgets.startup_phases import StartupPhases

NOW = T0 + 2000  # make_app's clock


def _ready_before(ts_ms: int, running: int, waiting: int) -> dict:
    return status_json("ready", ts_ms=ts_ms, metrics={"requests_running": running, "requests_waiting": waiting})


def _stopping(since_ms: int, **serving) -> dict:
    """As the agent serves it while the run drains: nothing is scraped, so no serving metrics."""
    st = status_json("stopping", ts_ms=T0, reason="restarted by uid 1000 (alice)", **serving)
    st["serving"]["state_since_ms"] = since_ms
    st["agent"]["action"] = {"action": "restart", "profile": "dsv41-tp8", "since_ms": since_ms,
                             "by": "uid 1000 (alice)"}
    return st


async def _phases_text(agent, first: dict, then: dict, size=(160, 48)) -> str:
    """The serving line once the dashboard has seen `first` (served before the stop), then `then`."""
    agent.status = first
    app = make_app(agent.socket_path)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.ts_ms == first["ts_ms"])
        agent.status = then
        await wait_for(pilot, lambda: app.state.ts_ms == then["ts_ms"] and app.state.serving.state == "stopping")
        line = app.screen.query_one(StartupPhases)
        await wait_for(pilot, lambda: line.has_class("-visible") and "draining" in text_of(line))
        await pilot.pause()
        return text_of(line) + "\n" + screen_text(app)


async def test_stopping_shows_what_drains_for_how_long_and_the_timeouts(agent):
    text = await _phases_text(agent, _ready_before(T0 - 20_000, 3, 0),
                              _stopping(NOW - 12_000, shutdown_timeout_s=30, stop_grace_s=60))
    line = text.splitlines()[0]
    assert "draining 3 running, 0 waiting" in line, text
    assert "12s of 30s" in line and "shutdown timeout" in line, line
    assert "killed at 1m" in line, line


async def test_past_the_shutdown_timeout_it_says_what_comes_next(agent):
    text = await _phases_text(agent, _ready_before(T0 - 60_000, 3, 2),
                              _stopping(NOW - 45_000, shutdown_timeout_s=30, stop_grace_s=60))
    line = text.splitlines()[0]
    assert "45s" in line and "past the 30s shutdown timeout" in line and "killed at 1m" in line, line


async def test_stopping_from_an_agent_without_the_timeouts_still_shows_progress(agent):
    """An older agent serves no timeouts: the time so far, the counts and the reason, no invented limit."""
    text = await _phases_text(agent, _ready_before(T0 - 20_000, 3, 1), _stopping(NOW - 12_000))
    line = text.splitlines()[0]
    assert "draining 3 running, 1 waiting" in line and "12s" in line, line
    assert " of " not in line and "killed" not in line, line


def test_counts_come_from_the_last_reading_before_the_stop_not_after():
    state = LiveState()
    state.apply_status(_status(_ready_before(T0 - 30_000, 9, 4)), NOW)
    state.apply_status(_status(_ready_before(T0 - 20_000, 3, 0)), NOW)
    stop = _stopping(T0 - 15_000, shutdown_timeout_s=30, stop_grace_s=60)
    state.apply_status(_status(stop), NOW)
    assert state.requests_at_stop() == (3, 0)
    nothing_before = LiveState()
    nothing_before.apply_status(_status(stop), NOW)
    assert nothing_before.requests_at_stop() is None
    # run 4 stopped while it loaded: the readings held are run 3's, not what run 4 drains
    earlier_run = LiveState()
    earlier_run.apply_status(_status(_ready_before(T0 - 20_000, 3, 0)), NOW)
    stop_of_4 = _stopping(T0 - 15_000, run_id=4)
    earlier_run.apply_status(_status(stop_of_4), NOW)
    assert earlier_run.requests_at_stop() is None


def _status(json: dict):
    from lynxtop.contract.status import Status

    return Status.from_json(json)


def test_the_timeouts_are_read_from_the_status_and_null_by_default():
    assert ServingStatus.from_json({"state": "ready"}).shutdown_timeout_s is None
    read = ServingStatus.from_json({"state": "stopping", "shutdown_timeout_s": 30, "stop_grace_s": 60})
    assert (read.shutdown_timeout_s, read.stop_grace_s) == (30, 60)
