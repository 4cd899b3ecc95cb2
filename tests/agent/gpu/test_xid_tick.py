"""XIDs read by the sampler's tick (issue 29.3): a poll of NVML's event set with no timeout at the start of each
tick, from the sampling thread; no thread of their own. What it must keep: every XID once, with the tick after it
happened; the event set made with the sampler's NVML session and freed before nvmlShutdown; every error path (a
GPU refusing registration, no event support, a failing wait) said once, never a failed tick, never a spin."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pynvml
from gpu_fakes import ConstantNode, Events, ManualClock

from lynxtop.agent.gpu.fake import FakeNvml, h200_specs, scripted_scenario
from lynxtop.agent.gpu.sampler import GpuSampler
from lynxtop.agent.gpu.xid import XIDS_PER_TICK


class Recording(FakeNvml):
    """A fake that records each event-set wait (thread, timeout) and the order of frees and shutdowns, and whose
    waits fail with `wait_error` while it is set."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.waits: list[tuple[str, int]] = []
        self.order: list[str] = []
        self.wait_error: int | None = None
        self.create_error: int | None = None

    def nvmlEventSetCreate(self) -> Any:
        if self.create_error is not None:
            raise pynvml.NVMLError(self.create_error)
        return super().nvmlEventSetCreate()

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        self.waits.append((threading.current_thread().name, timeout_ms))
        if self.wait_error is not None:
            raise pynvml.NVMLError(self.wait_error)
        return super().nvmlEventSetWait_v2(event_set, timeout_ms)

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self.order.append("free")
        super().nvmlEventSetFree(event_set)

    def nvmlShutdown(self) -> None:
        self.order.append("shutdown")
        super().nvmlShutdown()


def _sampler(clock: ManualClock, events: Events, node: Any = None, **kw: Any) -> tuple[GpuSampler, list[Recording]]:
    made: list[Recording] = []

    def factory() -> Recording:
        made.append(Recording(node or ConstantNode(h200_specs(4)), clock=clock))
        return made[-1]

    return GpuSampler(factory, clock=clock, on_event=events, **kw), made


def _tick(s: GpuSampler, clock: ManualClock, dt: float = 1.0) -> Any:
    clock.advance(dt)
    return s.sample(set())


def _xids(events: Events) -> list[tuple[int | None, int]]:
    return [(e[3]["gpu"], e[3]["xid"]) for e in events if e[0] == "gpu.xid"]


def test_an_xid_between_two_ticks_is_delivered_by_the_next_tick_from_the_sampling_thread(clock, events):
    s, made = _sampler(clock, events)
    s.open()
    try:
        assert not [t for t in threading.enumerate() if t.name == "lynxtop-xid"]  # no thread of its own
        _tick(s, clock)
        made[0].inject_xid(2, 79)
        made[0].inject_xid(0, 13)
        assert events == []  # nothing reads the event set between ticks
        _tick(s, clock)
        assert _xids(events) == [(2, 79), (0, 13)]  # each once, in NVML's order
        _tick(s, clock)
        assert len(_xids(events)) == 2
        # one wait a tick, with no timeout, from the thread that samples
        me = threading.current_thread().name
        assert made[0].waits == [(me, 0)] * 5  # a poll reads until NVML says TIMEOUT: 1 + (2 + 1) + 1
    finally:
        s.close()


def test_the_event_set_is_freed_before_nvml_shuts_down(clock, events):
    s, made = _sampler(clock, events)
    s.open()
    _tick(s, clock)
    s.close()
    assert made[0].order == ["free", "shutdown"]
    assert made[0]._event_sets == {}


def test_a_burst_is_read_over_ticks_at_most_the_limit_each(clock, events):
    s, made = _sampler(clock, events)
    s.open()
    try:
        for k in range(XIDS_PER_TICK + 6):
            made[0].inject_xid(k % 4, 31)
        _tick(s, clock)
        assert s._xid is not None and s._xid.delivered == XIDS_PER_TICK
        _tick(s, clock)
        assert s._xid.delivered == XIDS_PER_TICK + 6
        assert _xids(events) == [(0, 31), (1, 31), (2, 31), (3, 31)]  # one event per episode of (GPU, XID)
    finally:
        s.close()


def test_a_failing_wait_is_said_once_per_episode_and_never_fails_the_tick(clock, events, caplog):
    s, made = _sampler(clock, events)
    s.open()
    caplog.set_level(logging.WARNING, logger="lynxtop.gpu.xid")
    try:
        made[0].wait_error = pynvml.NVML_ERROR_UNKNOWN
        made[0].inject_xid(1, 48)
        for _ in range(5):
            tick = _tick(s, clock)
            assert len(tick.gpu_rows) == 4
        assert len(made[0].waits) == 5  # one failing wait a tick: no retry loop
        # one event per episode (the sink logs it: one journal line, session 23)
        failed = [e for e in events if "waiting for XID events failed" in e[2]]
        assert len(failed) == 1
        made[0].wait_error = None
        _tick(s, clock)
        assert _xids(events) == [(1, 48)]  # still queued: nothing lost while the wait failed
        made[0].wait_error = pynvml.NVML_ERROR_UNKNOWN  # a new episode is said again
        _tick(s, clock)
        failed = [e for e in events if "waiting for XID events failed" in e[2]]
        assert len(failed) == 2
    finally:
        s.close()


def test_a_gpu_refusing_registration_leaves_the_others_reported(clock, events):
    made: list[Recording] = []

    def factory() -> Recording:
        nv = Recording(ConstantNode(h200_specs(4)), clock=clock)
        nv.errors[(1, "nvmlDeviceRegisterEvents")] = pynvml.NVML_ERROR_NOT_SUPPORTED
        made.append(nv)
        return nv

    s = GpuSampler(factory, clock=clock, on_event=events)
    s.open()
    try:
        assert s._xid is not None and s._xid.registered == [0, 2, 3]
        made[0].inject_xid(1, 48)  # not watched: never reported
        made[0].inject_xid(3, 48)
        _tick(s, clock)
        assert _xids(events) == [(3, 48)]
    finally:
        s.close()


def test_no_event_support_means_no_event_set_and_no_polls(clock, events):
    def refusing() -> Recording:
        nv = Recording(ConstantNode(h200_specs(2)), clock=clock)
        nv.errors.update({(i, "nvmlDeviceRegisterEvents"): pynvml.NVML_ERROR_NOT_SUPPORTED for i in range(2)})
        made.append(nv)
        return nv

    def no_sets() -> Recording:
        nv = Recording(ConstantNode(h200_specs(2)), clock=clock)
        nv.create_error = pynvml.NVML_ERROR_NOT_SUPPORTED
        made.append(nv)
        return nv

    for factory in (refusing, no_sets):
        made: list[Recording] = []
        s = GpuSampler(factory, clock=clock, on_event=events)
        s.open()
        for _ in range(3):
            assert len(_tick(s, clock).gpu_rows) == 2
        s.close()
        assert made[0].waits == []
        assert made[0]._event_sets == {}  # an event set no GPU joined is freed at once
    assert _xids(events) == []


def test_a_driver_reinit_frees_the_set_and_the_new_session_reports_xids(clock, events):
    s, made = _sampler(clock, events, retry_initial_s=1.0)
    s.open()
    try:
        _tick(s, clock)
        made[0].fail_all = pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
        _tick(s, clock)  # the wait fails too (logged), then the readings ask for a re-initialisation
        assert made[0].order == ["free", "shutdown"]
        _tick(s, clock, 2.0)
        assert len(made) == 2 and s.status()["state"] == "ok"
        made[1].inject_xid(2, 94)
        _tick(s, clock)
        assert _xids(events) == [(2, 94)]
    finally:
        s.close()


def test_a_lost_gpu_does_not_stop_the_others_xids(clock, events):
    node = ConstantNode(h200_specs(4))
    s, made = _sampler(clock, events, node=node)
    s.open()
    try:
        _tick(s, clock)
        node.states[2] = type(node.states[2])(lost=True)
        made[0].inject_xid(2, 79)  # fallen off the bus: the XID comes first, then the GPU is lost
        tick = _tick(s, clock)
        assert [r["lost"] for r in tick.gpu_rows] == [0, 0, 1, 0]
        assert events.kinds().index("gpu.xid") < events.kinds().index("gpu.lost")
        made[0].inject_xid(0, 31)
        _tick(s, clock)
        assert _xids(events) == [(2, 79), (0, 31)]
    finally:
        s.close()


def test_the_scripted_xid_node_fires_each_xid_once_at_any_sampling_interval(clock, events):
    """XIDs 31, 48, 94 at 5/10/15 s: at 1 Hz each with the tick of its second; at one tick every 3 s (no tick in
    the first second of 31 or 48) with the first tick after it."""
    for dt in (1.0, 3.0):
        got = Events()
        c = ManualClock()
        s = GpuSampler(lambda c=c: FakeNvml(scripted_scenario("xid"), clock=c), clock=c, on_event=got)
        s.open()  # the scenario's time starts here
        at = []
        try:
            for _ in range(int(20 / dt)):
                c.advance(dt)
                before = len(got)
                s.sample(set())
                at += [c.t - 1000.0] * (len(got) - before)
        finally:
            s.close()
        assert _xids(got) == [(1, 31), (2, 48), (0, 94)]
        assert at == ([5.0, 10.0, 15.0] if dt == 1.0 else [6.0, 12.0, 15.0])
