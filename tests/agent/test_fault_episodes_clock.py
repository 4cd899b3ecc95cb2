"""Two time sources fighting over the wall clock (±5 min every minute): one `agent.clock_step` at the first step,
then the steps are counted, told hourly while they go on and once more when the clock has been still for
CLOCK_QUIET_S, with the count and the net offset; never one event per step. A single step stays one event."""

from __future__ import annotations

from lynxtop.agent.api.connguard import Episodes
from lynxtop.agent.clock import Timeline
from lynxtop.agent.ticker import CLOCK_QUIET_S, CLOCK_SUMMARY_S, Ticker

WALL0 = 1_800_000_000.0


def _ticker(mono: list[float], wall: list[float]) -> Ticker:
    tl = Timeline(wall=lambda: wall[0] + mono[0], mono=lambda: mono[0])
    return Ticker(1.0, tl, Episodes(lambda m: None), writer=lambda: None, record=lambda evs: None,
                  context=lambda: (None, None), on_beat=lambda now: None, on_done=lambda: None)


def _run(t: Ticker, mono: list[float], wall: list[float], seconds: range, fight: bool) -> list:
    events = []
    for sec in seconds:  # 1 Hz ticks; while fighting, every minute the wall clock is set 5 min forward, then back
        mono[0] = float(sec)
        if fight and sec % 60 == 0 and sec:
            wall[0] += 300 if (sec // 60) % 2 else -300
        ev = t._clock_step()
        if ev is not None:
            events.append(ev)
    return events


def test_a_clock_stepping_every_minute_is_one_episode_with_a_count():
    mono, wall = [0.0], [WALL0]
    t = _ticker(mono, wall)
    hours = 2
    fighting = _run(t, mono, wall, range(hours * 3600), fight=True)
    # the first step at once, then one count an hour: not 119 events
    assert len(fighting) == hours, [e.message for e in fighting]
    first, summary = fighting
    assert "stepped 5 min 0 s forward" in first.message and first.details["step_ms"] == 300_000
    assert summary.details["steps"] == 61 and summary.details["steps_since_told"] == 60, summary.details
    assert summary.details["ended"] is False and "still stepping" in summary.message
    assert summary.details["net_step_ms"] == 300_000  # 61 steps: one more forward than back
    assert t._timeline.steps == hours * 60 - 1  # every step still counted for the status
    end = hours * 3600
    quiet = _run(t, mono, wall, range(end, end + int(CLOCK_QUIET_S) + 5), fight=False)
    assert len(quiet) == 1, [e.message for e in quiet]  # the clock still again: the episode's closing count
    closing = quiet[0].details
    assert closing["ended"] is True and closing["steps"] == hours * 60 - 1
    assert closing["steps_since_told"] == hours * 60 - 1 - 61 and closing["net_step_ms"] == 300_000, closing
    assert "episode is over" in quiet[0].message
    # a later step opens a new episode: told at once again
    wall[0] += 600
    again = _run(t, mono, wall, range(end + int(CLOCK_QUIET_S) + 5, end + int(CLOCK_QUIET_S) + 7), fight=False)
    assert len(again) == 1 and again[0].details["step_ms"] == 600_000, [e.message for e in again]


def test_one_step_is_one_event_and_no_count():
    mono, wall = [0.0], [WALL0]
    t = _ticker(mono, wall)
    assert _run(t, mono, wall, range(10), fight=False) == []
    wall[0] -= 86_400
    events = _run(t, mono, wall, range(10, int(CLOCK_SUMMARY_S + CLOCK_QUIET_S) + 20), fight=False)
    assert len(events) == 1 and events[0].details["step_ms"] == -86_400_000, [e.message for e in events]
