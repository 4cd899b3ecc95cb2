"""The agent's clock: a slow GPU or host sampler never stalls the others; late ticks are counted, not queued."""

from __future__ import annotations

import time

import pytest
from support.node import close_node, open_node, run_clock

from lynxtop.agent.node import Node

pytestmark = pytest.mark.timeout(60)


class _Slow:
    """Wraps a real sampler; `method` sleeps first, like a driver call that blocks."""

    def __init__(self, real, method: str, delay: float):
        self._real, self._method, self._delay = real, method, delay

    def __getattr__(self, name):
        attr = getattr(self._real, name)
        if name != self._method:
            return attr

        def slow(*args, **kwargs):
            time.sleep(self._delay)
            return attr(*args, **kwargs)

        return slow


def _node(tmp_path, h) -> Node:
    return open_node(h.write_config(tmp_path, 'sample_interval_s = 0.1\nfake_nvml = "h200x8"'))


async def _run_clock(node: Node, seconds: float) -> None:
    await run_clock(node, seconds, settle_s=0.6)  # a straggling thread finishes before the writer closes


async def test_slow_nvml_leaves_host_and_store_on_time(tmp_path, h):
    node = _node(tmp_path, h)
    node.sampler = _Slow(node.sampler, "sample", 0.45)
    try:
        await _run_clock(node, 2.0)
        # host rows every tick; GPU rows only from the samples that finished (one at a time, never queued)
        assert node.ticker.ticks >= 10, node.ticker.ticks
        assert node.gpu_late >= 6, node.gpu_late
        assert node.status().agent.gpu_late_ticks == node.gpu_late
        node.writer.flush()
        host = h.db_rows(node.writer.path, "SELECT count(*) AS n FROM host_samples")[0]["n"]
        gpu_ticks = h.db_rows(node.writer.path, "SELECT count(DISTINCT ts_ms) AS n FROM gpu_samples")[0]["n"]
        assert host >= 10 and 1 <= gpu_ticks <= 6, (host, gpu_ticks)
        assert node.ticker.healthy()
    finally:
        close_node(node)


async def test_slow_tick_is_skipped_and_counted_not_queued(tmp_path, h):
    node = _node(tmp_path, h)
    node.host_sampler = _Slow(node.host_sampler, "sample", 0.35)
    try:
        await _run_clock(node, 2.0)
        # about one tick per 0.35 s ran; the due ticks in between were counted as missed, not run later
        assert 3 <= node.ticker.ticks <= 7, node.ticker.ticks
        assert node.ticker.missed_ticks >= 8, node.ticker.missed_ticks
        assert node.ticker.ticks + node.ticker.missed_ticks <= 22
    finally:
        close_node(node)


async def test_watchdog_health_needs_recent_ticks_and_a_live_writer(tmp_path, h):
    node = _node(tmp_path, h)
    await _run_clock(node, 0.5)
    assert node.ticker.healthy()
    node.writer.close()  # the store writer thread is gone: no more WATCHDOG=1
    assert not node.ticker.healthy()
    assert node.status().agent.healthy is False
