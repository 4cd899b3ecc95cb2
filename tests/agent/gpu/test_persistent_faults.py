"""A steady NVML fault is told once per episode: an event when it starts and one when it ends, never per tick.

Manual clock: an hour of ticks runs in seconds. Each test failed before the change it covers (the audit's proofs
in tests/test_zz_audit_faults_gpu.py): a re-init loop with no backoff and an event pair a second, one GPU's
re-init code tearing every GPU down, recoveries never told, a GPU whose every reading fails and XID waits that
fail told only in the log.
"""

from __future__ import annotations

import pynvml
import pytest
from gpu_fakes import Events, ManualClock

from lynxtop.agent.gpu.fake import FakeNvml, ScriptedNode, h200_specs, scripted_scenario
from lynxtop.agent.gpu.sampler import GpuSampler
from lynxtop.agent.gpu.unreadable import UnreadableGpus
from lynxtop.contract.events import Event


class _On(dict):
    """Injected errors: `code` for (gpu, function) pairs that `hit` accepts, while `on`."""

    def __init__(self, code: int, hit):
        super().__init__()
        self.code, self.hit, self.on = code, hit, True

    def __bool__(self) -> bool:
        return self.on

    def get(self, key, default=None):
        return self.code if self.on and self.hit(key) else default


def _sampler(clock: ManualClock, events: Events, errors: _On | None = None, init: dict | None = None,
             node=None, **kw) -> tuple[GpuSampler, list[FakeNvml]]:
    node = node or scripted_scenario("h200x8")
    made: list[FakeNvml] = []

    def factory() -> FakeNvml:
        nv = FakeNvml(node, clock=clock)
        if errors is not None:
            nv.errors = errors
        if init is not None:
            nv.init_error = init["code"]
        made.append(nv)
        return nv

    kw.setdefault("xid_events", False)
    return GpuSampler(factory, clock=clock, on_event=events, **kw), made


def _run(s: GpuSampler, clock: ManualClock, seconds: float, dt: float = 1.0) -> int:
    rows = 0
    for _ in range(round(seconds / dt)):
        clock.advance(dt)
        rows += len(s.sample(set()).gpu_rows)
    return rows


def _valid(events: Events) -> None:
    for e in events:
        Event(e[0], e[1], e[2], e[3])  # the store takes it


def test_reinit_loop_backs_off_and_is_one_episode(clock, events, monkeypatch):
    """nvmlInit works, every reading answers UNINITIALIZED (a wedged driver): an hour at 1 Hz."""
    broken = {"on": True}
    orig = FakeNvml.nvmlDeviceGetUtilizationRates

    def util(self, h):
        if broken["on"]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        return orig(self, h)

    monkeypatch.setattr(FakeNvml, "nvmlDeviceGetUtilizationRates", util)
    s, made = _sampler(clock, events)
    s.open()
    v0 = s.static_version
    _run(s, clock, 3600)
    # backoff 1, 2, 4 ... 60 s through the whole episode: ~65 tries an hour, not 3,600
    assert len(made) < 80 and s.static_version - v0 < 80
    assert [(k, sev) for k, sev, *_ in events] == [("nvml.reinit", "warning")]
    broken["on"] = False
    rows = _run(s, clock, 120)
    assert rows > 0 and s.status()["state"] == "ok"
    assert [(k, sev) for k, sev, *_ in events] == [("nvml.reinit", "warning"), ("nvml.reinit", "info")]
    d = events[-1][3]
    assert d["reinits"] == len(made) - 1 and d["gpus"] == 8 and d["span_s"] > 3500
    _run(s, clock, 600)
    assert len(events) == 2
    _valid(events)


def test_backoff_starts_over_only_after_nvml_sampled_cleanly_for_a_while(clock, events):
    """A driver reload after the outage has ended: its first retry comes after the initial delay again."""
    s, made = _sampler(clock, events, settle_s=60.0)
    s.open()
    _run(s, clock, 5)
    for _ in range(3):  # three reloads a few seconds apart: one outage, the backoff grows
        made[-1].fail_all = pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
        _run(s, clock, 10)
    assert s.status()["state"] == "ok" and s._retry.delay > 1.0
    _run(s, clock, 60)
    assert s._retry.delay == 1.0 and [sev for _, sev, *_ in events] == ["warning", "info"]
    assert events[-1][3]["reinits"] == 3


def test_one_gpu_answering_a_reinit_code_after_a_fresh_init_is_that_gpus_failure(clock, events):
    """GPU 3 alone answers DRIVER_NOT_LOADED to one reading: the other GPUs keep every row (10 Hz, an hour)."""
    errors = _On(pynvml.NVML_ERROR_DRIVER_NOT_LOADED, lambda key: key == (3, "nvmlDeviceGetPowerUsage"))
    s, made = _sampler(clock, events, errors)
    s.open()
    rows = 0
    tick = None
    for _ in range(36000):
        clock.advance(0.1)
        tick = s.sample(set())
        rows += len(tick.gpu_rows)
    assert len(made) == 2  # the first answer re-initialised NVML once; the fresh one reproduced it on GPU 3 only
    assert rows >= 36000 * 8 - 8 * 20  # every GPU's rows but the second the re-initialisation took
    assert tick.gpu_rows[3]["power_w"] is None and tick.gpu_rows[3]["util_gpu_pct"] is not None
    assert all(r["power_w"] is not None for i, r in enumerate(tick.gpu_rows) if i != 3)
    assert [(k, sev) for k, sev, *_ in events] == [("nvml.reinit", "warning"), ("nvml.reinit", "info")]
    assert events[-1][3]["gpu_failures"] == [3] and "GPU 3" in events[-1][2]
    _valid(events)


def test_a_single_gpu_answering_a_reinit_code_is_still_the_library(clock, events):
    """With one GPU nothing tells the GPU from the library: NVML is re-initialised, with backoff."""
    errors = _On(pynvml.NVML_ERROR_DRIVER_NOT_LOADED, lambda key: key == (0, "nvmlDeviceGetPowerUsage"))
    s, made = _sampler(clock, events, errors, node=ScriptedNode(h200_specs(1)))
    s.open()
    _run(s, clock, 600)
    assert 5 < len(made) < 20 and events.kinds() == ["nvml.reinit"]


def test_nvml_failing_at_start_then_working_is_told_over(clock, events):
    init = {"code": pynvml.NVML_ERROR_UNKNOWN}
    s, made = _sampler(clock, events, init=init)
    s.open()
    _run(s, clock, 3600)
    assert events.kinds() == ["nvml.unavailable"] and len(made) < 80
    init["code"] = None
    assert _run(s, clock, 120) > 0
    assert [(k, sev) for k, sev, *_ in events] == [("nvml.unavailable", "error"), ("nvml.available", "info")]
    assert events[-1][3]["failed_tries"] == len(made) - 1 and "NVML available" in events[-1][2]
    _valid(events)


def test_driver_reload_ending_on_a_no_driver_try_is_told_over(clock, events):
    init = {"code": None}
    s, made = _sampler(clock, events, init=init)
    s.open()
    _run(s, clock, 5)
    made[-1].fail_all = pynvml.NVML_ERROR_DRIVER_NOT_LOADED  # the module unloaded (reload, upgrade)
    init["code"] = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    _run(s, clock, 600)
    assert s.status()["state"] == "no-driver"
    init["code"] = None
    assert _run(s, clock, 600) > 0
    assert [k for k, *_ in events] == ["nvml.reinit", "nvml.unavailable", "nvml.reinit"]
    assert events[-1][1] == "info" and events[-1][3]["failed_tries"] >= 1


def test_a_gpu_whose_every_reading_fails_is_one_unreadable_episode(clock, events):
    errors = _On(pynvml.NVML_ERROR_UNKNOWN, lambda key: key[0] == 3)
    errors.on = False
    s, _ = _sampler(clock, events, errors)
    s.open()
    _run(s, clock, 5)
    errors.on = True
    _run(s, clock, 3, dt=1.0)  # a blip: 3 ticks, no event
    errors.on = False
    _run(s, clock, 5)
    assert events.kinds() == []
    errors.on = True
    _run(s, clock, 1, dt=0.1)  # 10 ticks but one second: not yet
    assert events.kinds() == []
    _run(s, clock, 3600)
    assert [(k, sev) for k, sev, *_ in events] == [("gpu.unreadable", "warning")]
    assert events[0][3]["gpu"] == 3
    errors.on = False
    tick = None
    for _ in range(60):
        clock.advance(1.0)
        tick = s.sample(set())
    assert tick.gpu_rows[3]["util_gpu_pct"] is not None
    assert [(k, sev) for k, sev, *_ in events] == [("gpu.unreadable", "warning"), ("gpu.readable", "info")]
    assert 3600 <= events[-1][3]["lasted_s"] < 3620 and events[-1][3]["gpu"] == 3
    _valid(events)


def test_an_unreadable_episode_outlives_a_reinit(clock, events):
    # GPU 3's readings fail (its handle and facts answer: it is not lost when NVML is opened again)
    errors = _On(pynvml.NVML_ERROR_UNKNOWN, lambda key: key[0] == 3 and key[1].startswith("nvmlDeviceGet")
                 and key[1] not in ("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID"))
    s, made = _sampler(clock, events, errors)
    s.open()
    _run(s, clock, 30)
    made[-1].fail_all = pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
    _run(s, clock, 30)
    assert len(made) == 2 and events.kinds() == ["gpu.unreadable", "nvml.reinit"]
    errors.on = False
    _run(s, clock, 60)
    assert events.kinds() == ["gpu.unreadable", "nvml.reinit", "gpu.readable", "nvml.reinit"]


def test_a_healthy_tick_never_looks_for_unreadable_gpus(clock, events, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("looked at a healthy GPU")

    monkeypatch.setattr(UnreadableGpus, "check", boom)
    s, _ = _sampler(clock, events)
    s.open()
    assert _run(s, clock, 30, dt=0.1) == 300 * 8  # check raising would have lost a GPU's row
    assert events.kinds() == []


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_UNKNOWN, pynvml.NVML_ERROR_CORRUPTED_INFOROM])
def test_xid_wait_failing_is_one_episode(clock, events, code):
    s, made = _sampler(clock, events, xid_events=True)
    s.open()
    _run(s, clock, 5)
    nv = made[-1]
    real = nv.nvmlEventSetWait_v2

    def failing(es, timeout):
        raise pynvml.NVMLError(code)

    nv.nvmlEventSetWait_v2 = failing
    _run(s, clock, 3600)
    assert [(k, sev) for k, sev, *_ in events] == [("gpu.setup_failed", "warning")]
    assert events[0][3]["facility"] == "xid_wait" and events[0][3]["gpu"] is None
    assert "waiting for XID events failed" in events[0][2]
    nv.nvmlEventSetWait_v2 = real
    _run(s, clock, 60)
    assert [(k, sev) for k, sev, *_ in events] == [("gpu.setup_failed", "warning"), ("gpu.recovered", "info")]
    assert events[-1][3] == {"gpu": None, "facility": "xid_wait"}
    _valid(events)
