"""A wall clock stepped under a running agent (+8 d, then -1 d): every sample is kept with timestamps that go on
strictly increasing at the sampling interval, and the steps are shown in status; the first is an `agent.clock_step`
event at once, the second (within the same episode) is counted for the episode's later count
(tests/agent/test_fault_episodes_clock.py), not an event of its own."""

from __future__ import annotations

import json
import time

import pytest
from support.node import close_node, open_node, run_clock

pytestmark = pytest.mark.timeout(60)
DAY_MS = 86_400_000


async def test_wall_clock_steps_keep_every_sample_and_become_events(tmp_path, h, monkeypatch):
    node = open_node(h.write_config(tmp_path, 'sample_interval_s = 0.1\nfake_nvml = "h200x8"'))
    node.writer.maintenance_interval_s = 0.05  # retention passes all through the test
    real_time = time.time
    offset_ms = [0]
    monkeypatch.setattr(time, "time", lambda: real_time() + offset_ms[0] / 1000)  # `date -s` for this process
    try:
        t = node.ticker  # five ticks or more in each phase, however late a loaded machine ticks
        await run_clock(node, 30, until=lambda: t.ticks >= 5, what="5 ticks before the step")
        offset_ms[0] += 8 * DAY_MS  # NTP steps a bad RTC forward
        await run_clock(node, 30, until=lambda: t.ticks >= 10, what="5 ticks after the forward step")
        offset_ms[0] -= DAY_MS  # then someone sets it back a day
        await run_clock(node, 30, until=lambda: t.ticks >= 15, what="5 ticks after the backward step")
        assert node.writer.flush(10)
        agent = node.status().agent
        line = node.status_line()
        healthy = node.ticker.healthy()
    finally:
        close_node(node)
    db = node.writer.path
    ts = [r["ts_ms"] for r in h.db_rows(db, "SELECT ts_ms FROM host_samples ORDER BY ts_ms")]
    assert len(ts) == node.ticker.ticks >= 15, (len(ts), node.ticker.ticks)  # every tick's row is there
    gaps = [b - a for a, b in zip(ts, ts[1:], strict=False)]
    assert min(gaps) > 0 and max(gaps) < 60_000, (min(gaps), max(gaps))  # strictly increasing, no jump
    gpu_ts = h.db_rows(db, "SELECT count(DISTINCT ts_ms) AS n FROM gpu_samples")[0]["n"]
    assert gpu_ts == len(ts)
    events = h.db_rows(db, "SELECT ts_ms, severity, message, details FROM events WHERE kind = 'agent.clock_step' "
                           "ORDER BY id")
    steps = [json.loads(e["details"])["step_ms"] for e in events]
    assert len(steps) == 1 and abs(steps[0] - 8 * DAY_MS) < 60_000, steps  # the second: counted in the episode
    assert "8 d" in events[0]["message"] and "forward" in events[0]["message"]
    assert all(ts[0] <= e["ts_ms"] <= ts[-1] for e in events)  # stamped on the samples' timeline
    assert agent.clock_steps == 2 and abs(agent.clock_offset_ms - 7 * DAY_MS) < 60_000
    assert abs(agent.last_clock_step_ms + DAY_MS) < 60_000
    assert healthy and agent.store.dropped == 0
    assert "wall clock stepped (7 d 0 h 0 min 0 s ahead of the samples)" in line, line
