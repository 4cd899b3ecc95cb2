"""The header's "⚠ samples N old" counts from the agent's last sampling tick (`agent.last_tick_ms`), not from when
the agent answered.

It compared the status's `ts_ms`, which the agent stamps as it answers, so a sampler stalled for minutes (NVML hung,
the tick thread stuck) showed fresh numbers with `agent ✓`. The agent now says when its last tick was written, on
the same clock as `now_ms`; an agent without the field (older), or with one that is no time, is judged as before.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from support.agent_proc import Agent, e2e_config
from support.ports import free_port, short_dir
from support.status import T0, status_json
from support.tui import make_app, text_of, wait_for

from lynxtop.contract.status import ClusterNode, Status
from lynxtop.tui.cluster_source import ClusterSource
from lynxtop.tui.live_state import LiveState
from lynxtop.tui.widgets.node_header import NodeHeader, header_line


def answered(node_now: int, last_tick: object = None, **agent: object) -> dict:
    """A status as a current agent answers it: `ts_ms` and `now_ms` both the time of the answer."""
    d = status_json(ts_ms=node_now, agent={"last_tick_ms": last_tick, **agent} if last_tick is not None else agent)
    d["now_ms"] = node_now
    if last_tick is None:
        d["agent"].pop("last_tick_ms", None)
    return d


def header(d: dict, local_ms: int, later_ms: int = 0) -> str:
    state = LiveState()
    state.apply_status(Status.from_json(d), local_ms)
    return header_line(state, local_ms + later_ms, []).plain


def test_a_sampler_stalled_a_minute_shows_though_the_answer_is_fresh():
    text = header(answered(T0, last_tick=T0 - 60_000), T0)
    assert "⚠ samples 1m00s old" in text, text


def test_a_fresh_tick_shows_nothing():
    assert "old" not in header(answered(T0, last_tick=T0 - 900), T0)
    assert "old" not in header(answered(T0, last_tick=T0 - 4_000), T0)  # under the threshold (5 s at 1 Hz)


def test_the_threshold_is_the_existing_one_scaled_by_the_interval():
    slow = answered(T0, last_tick=T0 - 20_000, sample_interval_s=10.0)  # 3 intervals = 30 s
    assert "old" not in header(slow, T0)
    assert "samples 40s old" in header(slow, T0, later_ms=20_000)  # counted on: no new answer for 20 s


@pytest.mark.parametrize("skew_ms", [-3_600_000, 60_000])
def test_counted_on_the_nodes_clock_whatever_the_skew(skew_ms):
    assert "⚠ samples 1m00s old" in header(answered(T0 + skew_ms, last_tick=T0 + skew_ms - 60_000), T0)
    assert "old" not in header(answered(T0 + skew_ms, last_tick=T0 + skew_ms - 500), T0)


def test_without_the_field_the_answer_time_as_before():
    d = answered(T0)
    assert Status.from_json(d).agent.last_tick_ms is None
    assert "old" not in header(d, T0)
    d["ts_ms"] = T0 - 60_000  # an older agent's snapshot time
    assert "samples 1m00s old" in header(d, T0)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 2**64, -5, "x", True, [1], {"a": 1}, 2**53])
def test_a_last_tick_that_is_no_time_is_absent(value):
    d = answered(T0)
    d["agent"]["last_tick_ms"] = value
    st = Status.from_json(d)
    assert st.agent.last_tick_ms is None
    assert "old" not in header(d, T0)


def test_the_field_round_trips():
    st = Status.from_json(answered(T0, last_tick=T0 - 1234))
    assert st.agent.last_tick_ms == T0 - 1234
    assert st.to_json()["agent"]["last_tick_ms"] == T0 - 1234
    assert Status.from_json(st.to_json()).agent.last_tick_ms == T0 - 1234


async def test_pilot_header_of_a_stalled_node(agent):
    agent.status = answered(T0, last_tick=T0 - 90_000)
    app = make_app(agent.socket_path, clock=lambda: T0 / 1000)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.status is not None)
        app.screen.redraw()
        header = app.screen.query_one(NodeHeader)
        await wait_for(pilot, lambda: "samples 1m30s old" in text_of(header))


async def test_a_real_agent_says_when_it_last_ticked(tmp_path):
    """A real agent (simulated GPUs, 1 s ticks): once it has ticked, `agent.last_tick_ms` is on `now_ms`'s clock,
    within a few intervals of it, and moves on."""
    port = free_port()
    with short_dir() as d:
        cfg = e2e_config(tmp_path, autostart=False, sock=d / "w.sock",
                         extra_agent=f'metrics_listen = "127.0.0.1:{port}"\n')
        proc = Agent(tmp_path, cfg, name="ticks", sock=d / "w.sock")
        try:
            src = ClusterSource("/nonexistent.sock", port)
            node = ClusterNode(node_id="n", ip="127.0.0.1", gpus=8.0)
            seen: list[int] = []
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and len(set(seen)) < 2:
                row = await src._row(node, None)  # type: ignore[arg-type]
                st = row.status
                if st is not None and st.agent.last_tick_ms is not None:
                    assert st.now_ms is not None
                    age = st.now_ms - st.agent.last_tick_ms
                    assert 0 <= age < 15_000, (age, st.agent)
                    seen.append(st.agent.last_tick_ms)
                await asyncio.sleep(0.2)
            assert len(set(seen)) >= 2, seen
        finally:
            proc.stop()
