"""A failure while setting the GPUs up stays local: the GPU or the facility that failed is left out, the tick goes on.

The sampler's rule (agent/gpu/sampler.py) is errors per metric and per GPU, never an exception out of `sample()`:
an exception that is no NVMLError, raised while opening NVML (a GPU's GPM reader, the XID event set), must not
escape `sample()` either, or GpuSource (agent/sampling.py) re-raises it and every tick fails, host row included.
"""

from __future__ import annotations

import logging

from gpu_fakes import ConstantNode

from lynxtop.agent.gpu.fake import FakeNvml, h200_specs
from lynxtop.agent.gpu.sampler import GpuSampler


class _GpmAllocBug(FakeNvml):
    """GPU 1's GPM sample allocation fails with a bug, not an NVMLError."""

    def nvmlGpmQueryDeviceSupport(self, handle):
        self._gpm_query_gpu = self.nvmlDeviceGetIndex(handle)
        return super().nvmlGpmQueryDeviceSupport(handle)

    def nvmlGpmSampleAlloc(self):
        if getattr(self, "_gpm_query_gpu", None) == 1:
            raise RuntimeError("GPM allocation bug")
        return super().nvmlGpmSampleAlloc()


class _EventSetBug(FakeNvml):
    """Creating the XID event set fails with a bug, not an NVMLError."""

    def nvmlEventSetCreate(self):
        raise RuntimeError("event set bug")


def _sampler(cls, clock, events, xid_events=False):
    node = ConstantNode(h200_specs(4))
    return GpuSampler(lambda: cls(node, clock=clock), clock=clock, on_event=events, xid_events=xid_events)


def test_gpm_setup_bug_on_one_gpu_leaves_only_gpm_out(clock, events, caplog):
    """A non-NVML error in one GPU's GPM setup neither escapes sample() nor costs any GPU its row: every GPU keeps
    its readings, and the failure is logged once, not on every tick."""
    sampler = _sampler(_GpmAllocBug, clock, events)
    with caplog.at_level(logging.ERROR, logger="lynxtop"):
        for _ in range(3):
            clock.advance(1.0)
            tick = sampler.sample()
    assert sampler.status()["state"] == "ok"
    assert [r["gpu"] for r in tick.gpu_rows] == [0, 1, 2, 3]
    assert all(r["util_gpu_pct"] is not None for r in tick.gpu_rows)
    assert tick.gpu_rows[0]["sm_active_pct"] is not None  # the other GPUs keep GPM
    assert tick.gpu_rows[1]["sm_active_pct"] is None  # GPU 1 without GPM
    # told once, not on every tick: one event (the sink logs it: one journal line, session 23)
    assert sum(e[0] == "gpu.setup_failed" and "GPU 1" in e[2] for e in events) == 1


def test_xid_setup_bug_leaves_only_xids_out(clock, events):
    """A non-NVML error while starting the XID watcher neither escapes sample() nor stops GPU rows: the sampler
    opens without XID events, and every tick carries every GPU."""
    sampler = _sampler(_EventSetBug, clock, events, xid_events=True)
    for _ in range(3):
        clock.advance(1.0)
        tick = sampler.sample()
    assert sampler.status()["state"] == "ok"
    assert len(tick.gpu_rows) == 4
    assert all(r["util_gpu_pct"] is not None for r in tick.gpu_rows)


class _DriverVersionBug(FakeNvml):
    """The driver version comes back as something no text can be made of: a bug while opening, not an NVMLError."""

    def nvmlSystemGetDriverVersion(self):
        raise ValueError("odd driver version")


def test_open_bug_makes_nvml_an_error_state_not_an_exception(clock, events):
    """A non-NVML error while enumerating after nvmlInit does not escape sample(): NVML is reported unavailable
    once and retried with backoff, and sample() returns an empty tick each time."""
    sampler = _sampler(_DriverVersionBug, clock, events)
    for _ in range(3):
        clock.advance(60.0)
        tick = sampler.sample()
        assert tick.gpu_rows == []
    assert sampler.status()["state"] == "error"
    assert events.kinds().count("nvml.unavailable") == 1
