"""The agent's timeline stepping back (docs/reliability.md: the agent keeps its own timeline while it runs and "a
restart adopts the wall clock", so after the wall clock was set back the restarted agent's ts_ms is earlier than
the last one the dashboard saw): the live charts follow the new readings at once, the samples of the abandoned
timeline dropped, instead of freezing on the last old sample for as long as the step."""

from __future__ import annotations

from support.tui import make_app, wait_for
from tui_fake_agent import T0, gpu_row, make_status

from lynxtop.contract.status import Status
from lynxtop.tui.live_state import LiveState
from lynxtop.tui.widgets.time_chart import TimeChart

STEP_MS = 3600_000  # the wall clock had been an hour ahead; the restarted agent is on the right time


def _status(ts: int, sm: float, ttft: float) -> Status:
    return Status.from_json(make_status(ts_ms=ts, gpu_rows=[gpu_row(0, sm_active_pct=sm)],
                                        metrics={"ttft_p99_ms": ttft}))


def test_live_state_follows_the_agents_timeline_after_it_stepped_back():
    state = LiveState()
    for i in range(5):
        state.apply_status(_status(T0 + i * 1000, 90.0, 900.0), T0 + i * 1000)
    restarted = T0 - STEP_MS
    for i in range(5):
        state.apply_status(_status(restarted + i * 1000, 10.0, 100.0), T0 + 10_000 + i * 1000)
    # the abandoned timeline's samples are gone; the held ones are the restarted agent's, in order
    assert state.gpu_series(0, "sm_active_pct") == [(restarted + i * 1000, 10.0) for i in range(5)]
    assert state.serving_series("ttft_p99_ms") == [(restarted + i * 1000, 100.0) for i in range(5)]


def test_live_state_keeps_samples_older_than_a_step_and_takes_a_tick_once():
    state = LiveState()
    for ts in (T0, T0 + 1000, T0 + 2000, T0 + 2000):  # the same tick polled twice is one sample
        state.apply_status(_status(ts, 50.0, 500.0), ts)
    state.apply_status(_status(T0 + 1500, 20.0, 200.0), T0 + 3000)  # stepped back half a second
    assert state.serving_series("ttft_p99_ms") == [(T0, 500.0), (T0 + 1000, 500.0), (T0 + 1500, 200.0)]


async def test_gpu_chart_follows_readings_after_the_agents_clock_stepped_back(agent):
    agent.status = make_status(ts_ms=T0, gpu_rows=[gpu_row(0, sm_active_pct=90.0)])
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        await pilot.press("2")
        await pilot.pause(0.3)
        restarted = T0 - STEP_MS
        for i in range(4):
            agent.status = make_status(ts_ms=restarted + i * 1000, gpu_rows=[gpu_row(0, sm_active_pct=10.0)])
            await wait_for(pilot, lambda i=i: app.state.ts_ms == restarted + i * 1000)
        chart = app.screen.query_one("#chart-sm", TimeChart)
        title = chart.render().plain.splitlines()[0]
        assert "now 10%" in title, title  # not the hour-old 90 % over an empty chart
