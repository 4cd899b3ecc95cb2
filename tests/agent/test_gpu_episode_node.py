"""XID episodes and GPU setup failures through the node's real path: the clock thread's GPU sample, the node's
GPU event collector, the one event path (`EventSink`, what the store writes and subscribers see)."""

from __future__ import annotations

from typing import Any

import pytest
from support.node import close_node, open_node, run_clock

from lynxtop.agent.gpu.fake import FakeNvml
from lynxtop.contract.events import Event

pytestmark = pytest.mark.timeout(60)
CONFIG = 'sample_interval_s = 0.1\nfake_nvml = "h200x8"'


def _record(node: Any) -> list[Event]:
    got: list[Event] = []
    node.event_sink.subscribe(got.append)
    return got


def _xids(got: list[Event]) -> list[Event]:
    return [e for e in got if str(e.kind) == "gpu.xid"]


async def test_a_flood_of_one_xid_reaches_the_event_path_as_one_event_and_one_count(tmp_path, h):
    node = open_node(h.write_config(tmp_path, CONFIG))
    got = _record(node)
    try:
        assert node.sampler._xid_episodes is not None
        node.sampler._xid_episodes.quiet_s = 1.0  # the episode quiets within the test
        for _ in range(30):
            node.sampler._c.b.inject_xid(4, 13)
        await run_clock(node, 20, until=lambda: len(_xids(got)) >= 2, what="the XID episode's two events")
        first, closing = _xids(got)[:2]
        assert first.details == {"gpu": 4, "xid": 13}
        assert closing.details is not None and closing.details["episode"] == "closed"
        assert closing.details["times"] == 30 and closing.details["count"] == 29
        assert sum(int((e.details or {}).get("count", 1)) for e in _xids(got)) == 30
    finally:
        close_node(node)


async def test_the_node_counts_every_xid_of_an_episode_as_it_is_read(tmp_path, h):
    """`lynxtop_gpu_xid_errors_total` rises with the flood, not when the episode's count event comes (60 s on)."""
    node = open_node(h.write_config(tmp_path, CONFIG))
    got = _record(node)
    try:
        episodes = node.sampler._xid_episodes
        assert episodes is not None
        for _ in range(30):
            node.sampler._c.b.inject_xid(4, 13)
        await run_clock(node, 20, until=lambda: node.xid_errors.get(4, 0) >= 30, what="every XID counted")
        assert node.xid_errors == {4: 30}
        assert len(episodes) == 1 and len(_xids(got)) <= 1  # the episode still open: only its first event
    finally:
        close_node(node)


class _SetupBug(FakeNvml):
    """GPU 3's name comes back as something no text is made of: a bug while setting it up, no NVMLError."""

    def nvmlDeviceGetName(self, handle: Any) -> Any:
        if handle.index == 3:
            raise RuntimeError("odd \x1b[31mname\x1b[0m answer")
        return super().nvmlDeviceGetName(handle)


async def test_a_gpu_left_out_by_a_setup_bug_reaches_the_event_path_once(tmp_path, h):
    node = open_node(h.write_config(tmp_path, CONFIG))
    got = _record(node)
    try:
        real = node.sampler._c.b
        node.sampler._factory = lambda: _SetupBug(real.scenario, clock=real.clock)
        node.sampler.close()  # the next tick opens NVML again, with GPU 3 failing its setup
        await run_clock(node, 20, until=lambda: any(str(e.kind) == "gpu.setup_failed" for e in got),
                        what="the setup failure on the event path")
        await run_clock(node, 1.0)  # more ticks: told once, not every tick
        failed = [e for e in got if str(e.kind) == "gpu.setup_failed"]
        assert len(failed) == 1
        ev = failed[0]
        assert str(ev.severity) == "error" and ev.details is not None
        assert ev.details["gpu"] == 3 and ev.details["facility"] == "gpu"
        assert "\x1b" not in ev.message and "\\x1b[31m" in ev.details["error"]
        assert [g["idx"] for g in node.sampler.static()] == [0, 1, 2, 4, 5, 6, 7]
    finally:
        close_node(node)
