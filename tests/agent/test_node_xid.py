"""XID errors counted per GPU in the status: what `lynxtop_gpu_xid_errors_total` and the XID alert read."""

from __future__ import annotations

import threading

import pytest
from support.node import close_node, open_node, run_clock

from lynxtop.contract.status import GpuStatus

pytestmark = pytest.mark.timeout(60)


def test_xid_events_are_counted_per_gpu(tmp_path, h):
    node = open_node(h.write_config(tmp_path, 'fake_nvml = "h200x8"'))
    try:
        assert [g.xid_errors for g in node.view.gpu_statuses()] == [0] * 8
        for gpu in (3, 3, 5, None):  # a GPU NVML could not name counts nowhere
            node._count_xid(gpu)
        # events count nothing: an episode's first XID and its later count event are one XID each, counted as read
        node._gpu_event("gpu.xid", "error", "XID 79", {"gpu": 3, "xid": 79})
        node._gpu_event("gpu.lost", "critical", "GPU 2 lost", {"gpu": 2})
        gpus = node.view.gpu_statuses()
        assert [g.xid_errors for g in gpus] == [0, 0, 0, 2, 0, 1, 0, 0]
        assert GpuStatus.from_json(gpus[3].to_json()).xid_errors == 2  # on the wire too
        assert len(node._gpu_events.drain()) == 2  # every event still goes to the store
    finally:
        close_node(node)


async def test_an_xid_reaches_the_count_and_the_event_path_through_the_tick(tmp_path, h):
    """No XID thread: the clock thread's GPU sample reads the event set and the node counts what it finds."""
    node = open_node(h.write_config(tmp_path, 'fake_nvml = "h200x8"'))
    try:
        assert not [t for t in threading.enumerate() if t.name == "lynxtop-xid"]
        node.sampler._c.b.inject_xid(6, 95)
        assert node.xid_errors == {}  # nothing reads it before a tick
        await run_clock(node, 20, until=lambda: node.xid_errors.get(6) == 1, what="the XID counted")
        assert [g.xid_errors for g in node.view.gpu_statuses()] == [0, 0, 0, 0, 0, 0, 1, 0]
    finally:
        close_node(node)
