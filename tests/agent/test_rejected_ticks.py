"""A tick the database refuses (a value SQLite cannot hold) is a dropped tick: status shows it, the agent is not
healthy, and /metrics says lynxtop_agent_healthy 0 (issue 25.1, the writer's part)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from support.node import close_node, open_node, run_clock

from lynxtop.agent.metrics.exporter import SnapshotCollector

pytestmark = pytest.mark.timeout(60)


class _Huge:
    """Wraps the real host sampler; its rows carry a number no SQLite INTEGER holds while `on` is set."""

    def __init__(self, real):
        self._real, self.on = real, True

    def __getattr__(self, name):
        return getattr(self._real, name)

    def sample(self, *args, **kwargs):
        row = self._real.sample(*args, **kwargs)
        return {**row, "mem_used_bytes": 10**300} if self.on else row


def _healthy_gauge(node) -> str:
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(node.status))
    return next(line for line in generate_latest(reg).decode().splitlines()
                if line.startswith("lynxtop_agent_healthy "))


async def test_refused_ticks_count_as_dropped_and_make_the_agent_unhealthy(tmp_path, h):
    node = open_node(h.write_config(tmp_path, 'sample_interval_s = 0.1\nfake_nvml = "h200x8"'))
    huge = node.host_sampler = _Huge(node.host_sampler)
    try:
        huge.on = False
        await run_clock(node, 30, until=lambda: node.ticker.ticks >= 3, what="three good ticks")
        assert node.writer.flush(10)
        assert node.ticker.healthy() and _healthy_gauge(node) == "lynxtop_agent_healthy 1.0"
        huge.on = True
        await run_clock(node, 30, until=lambda: node.status().agent.store.rejected >= 5,
                        what="five ticks refused by the store")
        assert node.writer.flush(10)
        st = node.status().agent
        assert st.store.rejected >= 5 and st.store.dropped == st.store.rejected, st.store
        assert "rejected" in st.store.last_error
        assert not node.ticker.healthy() and st.healthy is False
        assert _healthy_gauge(node) == "lynxtop_agent_healthy 0.0"
        assert "ticks refused by the store" in node.status_line()  # systemd's STATUS= line says it too
        assert node.status().to_json()["agent"]["store"]["rejected"] == st.store.rejected  # served as JSON too
    finally:
        close_node(node)
