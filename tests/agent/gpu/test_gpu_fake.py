"""The fake NVML must behave like the real one where the sampler can tell: errors, counters, GPM averages."""

from __future__ import annotations

import ctypes
from dataclasses import replace

import pynvml
import pytest
from gpu_fakes import ConstantNode

from lynxtop.agent.gpu import backend
from lynxtop.agent.gpu.backend import RealNvml, open_backend
from lynxtop.agent.gpu.fake import FakeNvml, a100_specs, h200_specs, scripted_scenario
from lynxtop.agent.gpu.protocol import FakeGpuState


def test_real_pynvml_error_classes(clock):
    node = ConstantNode(h200_specs(2, missing_functions=frozenset({"nvmlDeviceGetPowerUsage"}),
                                   unsupported=frozenset({"nvmlDeviceGetTotalEccErrors"})))
    node.states[1] = FakeGpuState(lost=True)
    nv = FakeNvml(node, clock=clock)
    h0 = None
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nv.nvmlDeviceGetCount()
    nv.nvmlInit()
    h0 = nv.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        nv.nvmlDeviceGetPowerUsage(h0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nv.nvmlDeviceGetTotalEccErrors(h0, 0, 0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nv.nvmlDeviceGetHandleByIndex(1)
    nv.errors[(0, "nvmlDeviceGetTemperature")] = pynvml.NVML_ERROR_NO_PERMISSION
    with pytest.raises(pynvml.NVMLError) as exc:
        nv.nvmlDeviceGetTemperature(h0, pynvml.NVML_TEMPERATURE_GPU)
    assert exc.value.value == pynvml.NVML_ERROR_NO_PERMISSION


def test_no_driver_init_fails_like_a_machine_without_one():
    nv = open_backend("nodriver")
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        nv.nvmlInit()


def test_energy_integrates_power(clock):
    node = ConstantNode(h200_specs(1), [FakeGpuState(power_w=500.0)])
    nv = FakeNvml(node, clock=clock)
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    e0 = nv.nvmlDeviceGetTotalEnergyConsumption(h)
    clock.advance(10.0)
    e1 = nv.nvmlDeviceGetTotalEnergyConsumption(h)
    assert e1 - e0 == 500 * 10 * 1000  # mJ


def test_gpm_metrics_are_the_average_over_the_interval(clock):
    node = ConstantNode(h200_specs(1), [FakeGpuState(sm_active_pct=0.0)])
    nv = FakeNvml(node, clock=clock)
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    s1, s2 = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
    nv.nvmlGpmSampleGet(h, s1)
    clock.advance(5.0)
    node.states[0] = FakeGpuState(sm_active_pct=100.0, pcie_rx_bytes_per_s=2 * 1024 * 1024)
    nv.nvmlDeviceGetUtilizationRates(h)  # the fake notices the load change at its next look
    clock.advance(5.0)
    nv.nvmlGpmSampleGet(h, s2)
    mg = pynvml.c_nvmlGpmMetricsGet_t()
    mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = 3
    mg.sample1, mg.sample2 = s1, s2
    mg.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
    mg.metrics[1].metricId = pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC
    mg.metrics[2].metricId = 9999
    nv.nvmlGpmMetricsGet(mg)
    assert mg.metrics[0].nvmlReturn == 0 and mg.metrics[0].value == pytest.approx(50.0)
    assert mg.metrics[1].value == pytest.approx(1.0)  # MiB/s: half the interval at 2 MiB/s
    assert mg.metrics[2].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    mg.sample1, mg.sample2 = s2, s1  # samples out of order: refused like the real library
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nv.nvmlGpmMetricsGet(mg)
    nv.nvmlGpmSampleFree(s1)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nv.nvmlGpmSampleFree(s1)


def test_nvlink_field_counters_are_kib_with_microsecond_timestamps(clock):
    specs = a100_specs(1)
    rates = [float(1024 * 1000 * (k + 1)) for k in range(specs[0].nvlink_count)]
    node = ConstantNode(specs, [FakeGpuState(nvlink_tx_bytes_per_s=rates, nvlink_rx_bytes_per_s=rates)])
    nv = FakeNvml(node, clock=clock)
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    ids = [(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 3), (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 12)]
    a = nv.nvmlDeviceGetFieldValues(h, ids)
    clock.advance(2.0)
    b = nv.nvmlDeviceGetFieldValues(h, ids)
    assert b[0].nvmlReturn == 0 and b[0].valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    assert b[0].timestamp - a[0].timestamp == 2_000_000
    assert b[0].value.ullVal - a[0].value.ullVal == 4 * 1000 * 2  # link 3 at 4000 KiB/s for 2 s
    assert b[1].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED  # an A100 has links 0..11


def test_xids_fire_once_per_occurrence(clock):
    node = ConstantNode(h200_specs(2))
    nv = FakeNvml(node, clock=clock)
    nv.nvmlInit()
    es = nv.nvmlEventSetCreate()
    for i in range(2):
        nv.nvmlDeviceRegisterEvents(nv.nvmlDeviceGetHandleByIndex(i), pynvml.nvmlEventTypeXidCriticalError, es)
    with pytest.raises(pynvml.NVMLError_Timeout):
        nv.nvmlEventSetWait_v2(es, 10)
    node.states[1] = replace(node.states[1], xid_events=[79])
    clock.advance(1.0)
    data = nv.nvmlEventSetWait_v2(es, 10)
    assert (nv.nvmlDeviceGetIndex(data.device), data.eventData) == (1, 79)
    clock.advance(1.0)  # still "firing" in the scenario: not delivered twice
    with pytest.raises(pynvml.NVMLError_Timeout):
        nv.nvmlEventSetWait_v2(es, 10)


def test_simulated_hardware_is_labelled(clock):
    nv = FakeNvml(scripted_scenario("h200x8"), clock=clock)
    nv.nvmlInit()
    assert nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByIndex(0)) == "NVIDIA H200 (simulated)"
    assert "simulated" in nv.nvmlSystemGetNVMLVersion()


def test_gpm_sample_buffers_are_real_ctypes_pointers(clock):
    nv = FakeNvml(scripted_scenario("h200x8"), clock=clock)
    nv.nvmlInit()
    s = nv.nvmlGpmSampleAlloc()
    assert isinstance(s, pynvml.c_nvmlGpmSample_t) and ctypes.cast(s, ctypes.c_void_p).value


def test_open_backend_names():
    assert isinstance(open_backend(""), RealNvml)
    for name in ("h200x8", "a100x8", "lost", "missing", "xid", "nodriver"):
        assert isinstance(open_backend(name), FakeNvml)
    with pytest.raises(ValueError, match="unknown fake NVML scenario 'h100x3'"):
        open_backend("h100x3")


def test_the_simulated_node_is_injected_not_imported(tmp_path):
    """The GPU layer does not know the simulator: "sim" needs the scenario factory from whoever composes."""
    with pytest.raises(ValueError, match="needs its scenario factory"):
        open_backend("sim", str(tmp_path))
    seen = []

    def factory(state_dir):
        seen.append(state_dir)
        return scripted_scenario("a100x8")

    nv = open_backend("sim", str(tmp_path), factory)
    assert isinstance(nv, FakeNvml) and seen == [str(tmp_path)]
    backend.register_scenario("test-node", factory)
    try:
        assert isinstance(open_backend("test-node", "d"), FakeNvml) and seen[-1] == "d"
    finally:
        backend._registered.pop("test-node")


class _CountingState(FakeGpuState):
    """Counts how often the fake reads its SM activity: the figure only the counters' rates are made from."""

    reads = 0

    def __getattribute__(self, name):
        if name == "sm_active_pct":
            type(self).reads += 1
        return super().__getattribute__(name)


def test_a_state_answered_again_is_turned_into_counter_rates_once(clock):
    """Issue 29.3: the simulator's model answers one state object per 0.2 s step however often it is asked;
    the fake makes the counters' rates from a state once, not on every tick's look (10 Hz: every look is past
    the fake's 10 ms resolution). A new state object starts new rates; the GPM averages stay exact."""
    from lynxtop.agent.gpu.sampler import GpuSampler

    _CountingState.reads = 0
    node = ConstantNode(h200_specs(2), [_CountingState(sm_active_pct=40.0), _CountingState(sm_active_pct=70.0)])
    s = GpuSampler(lambda: FakeNvml(node, clock=clock), clock=clock, xid_events=False)
    assert s.open()["state"] == "ok"
    rows = []
    for _ in range(20):
        clock.advance(0.1)
        rows.append(s.sample().gpu_rows)
    assert _CountingState.reads == 2  # one per GPU, not one per GPU per tick (40)
    assert all(r[0]["sm_active_pct"] == 40 and r[1]["sm_active_pct"] == 70 for r in rows[1:])
    node.states[0] = replace(node.states[0], sm_active_pct=10.0)
    clock.advance(0.1)
    s.sample()  # the interval holds the change: GPM averages over it
    clock.advance(0.1)
    assert s.sample().gpu_rows[0]["sm_active_pct"] == 10 and _CountingState.reads == 3


def test_gpm_calls_read_sample_addresses_without_building_pointers(clock, monkeypatch):
    """Issue 29.3: the fake found a GPM sample's buffer by ctypes.cast (~4 µs, three a GPU a tick); it reads the
    address from the pointer's memory. Samples stay told apart: a freed or foreign one is INVALID_ARGUMENT."""
    from lynxtop.agent.gpu.sampler import GpuSampler

    node = ConstantNode(h200_specs(2), [FakeGpuState(sm_active_pct=40.0), FakeGpuState(sm_active_pct=70.0)])
    nv = FakeNvml(node, clock=clock)
    s = GpuSampler(lambda: nv, clock=clock, xid_events=False)
    assert s.open()["state"] == "ok"
    casts = []
    real_cast = ctypes.cast
    monkeypatch.setattr(ctypes, "cast", lambda *a: casts.append(a) or real_cast(*a))
    for _ in range(5):
        clock.advance(0.1)
        rows = s.sample().gpu_rows
    assert casts == [] and [r["sm_active_pct"] for r in rows] == [40, 70]
    monkeypatch.undo()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    a, b = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
    nv.nvmlGpmSampleGet(h, a)
    clock.advance(0.1)
    nv.nvmlGpmSampleGet(h, b)
    mg = pynvml.c_nvmlGpmMetricsGet_t()
    mg.version, mg.numMetrics, mg.sample1, mg.sample2 = pynvml.NVML_GPM_METRICS_GET_VERSION, 1, a, b
    mg.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
    assert nv.nvmlGpmMetricsGet(mg).metrics[0].value == pytest.approx(40.0)
    nv.nvmlGpmSampleFree(a)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nv.nvmlGpmMetricsGet(mg)
    foreign = ctypes.cast(ctypes.create_string_buffer(8), pynvml.c_nvmlGpmSample_t)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nv.nvmlGpmSampleGet(h, foreign)


def test_each_gpm_sample_works_out_its_counters_once(clock, monkeypatch):
    """Issue 29.3: a GPM sample is the second of one interval and the first of the next, and at 1 Hz two metrics
    structs (the tick's and the per-link one) read the same pair; the counters at a sample are worked out once
    (and not at all when the sample falls on its state's start), not once per interval and struct."""
    from lynxtop.agent.gpu import fake_driver
    from lynxtop.agent.gpu.sampler import GpuSampler

    node = ConstantNode(h200_specs(1), [FakeGpuState(sm_active_pct=40.0)])
    s = GpuSampler(lambda: FakeNvml(node, clock=clock), clock=clock, xid_events=False)
    assert s.open()["state"] == "ok"
    clock.advance(1.0)
    s.sample()
    worked: list[float] = []
    real_at = fake_driver.Segment.at
    monkeypatch.setattr(fake_driver.Segment, "at", lambda seg, t: worked.append(t) or real_at(seg, t))
    for k in range(10):
        node.states[0] = replace(node.states[0], sm_active_pct=40.0 + k)  # a new state every tick
        clock.advance(1.0)
        tick = s.sample()
    assert len(worked) <= 11, len(worked)  # one per new state (its segment's start) and the warm-up's sample
    # the last interval ran under the state set a tick before (a new state holds from the look that saw it)
    assert tick.gpu_rows[0]["sm_active_pct"] == 48 and len(tick.nvlink_rows) == 1


def test_counters_over_state_changes_are_worked_out_only_when_read_and_stay_exact(clock, monkeypatch):
    """Issue 29.3, session 9: at 10 Hz a simulated GPU's state changes every model step; a new state's counter
    values at its start are worked out only when something reads them (a field value, once a second): a GPM
    interval over one change is its two rates weighted by their times. 30 ticks with a new state each cost 2
    `Segment.at`s a change before (the new segment's start, the GPM sample before the change), now about one
    (the once-a-second field reads work the pending starts out; a chain of them never exceeds LAZY_SEGMENTS).
    The averages, the NVLink field counters and energy read what one exact integral gives, after more changes
    in a row than the chain holds."""
    from lynxtop.agent.gpu import fake_driver
    from lynxtop.agent.gpu.sampler import GpuSampler

    node = ConstantNode(h200_specs(1), [FakeGpuState(sm_active_pct=40.0)])
    made: list[FakeNvml] = []
    s = GpuSampler(lambda: made.append(FakeNvml(node, clock=clock)) or made[-1], clock=clock, xid_events=False)
    assert s.open()["state"] == "ok"
    clock.advance(0.1)
    s.sample()
    worked: list[float] = []
    real_at = fake_driver.Segment.at
    monkeypatch.setattr(fake_driver.Segment, "at", lambda seg, t: worked.append(t) or real_at(seg, t))
    rows = []
    for k in range(30):
        clock.advance(0.03)
        node.states[0] = replace(node.states[0], sm_active_pct=40.0 + k)  # a new state every tick...
        made[-1].nvmlDeviceGetPowerUsage(fake_driver.Handle(0))  # ...seen between two samples, as at 10 Hz
        clock.advance(0.07)
        rows.append(s.sample().gpu_rows[0]["sm_active_pct"])
    assert len(worked) <= 35, len(worked)  # about one a change, at the field reads (was 2 a change: 61)
    assert rows == [40 + k for k in range(30)]  # 0.3 of the interval under the last state, 0.7 under the new

    # the counters stay exact over more lazy starts in a row than the chain may hold
    nv = FakeNvml(ConstantNode(h200_specs(1), [FakeGpuState()]), clock=clock)
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    tx = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
    lazy_max = getattr(fake_driver, "LAZY_SEGMENTS", 0)
    n = 48  # three chains' worth
    for k in range(1, n + 1):
        clock.advance(0.125)
        nv.scenario.states[0] = FakeGpuState(nvlink_tx_bytes_per_s=[8192.0 * k] * 18, power_w=100.0 * k)
        nv.nvmlDeviceGetUtilizationRates(h)  # a look: the new state from now on
        assert getattr(nv._acc[0].seg, "lazy", 0) <= lazy_max
    clock.advance(0.125)
    kib = nv.nvmlDeviceGetFieldValues(h, [(tx, 3)])[0].value.ullVal
    assert kib == sum(8192 * k * 0.125 for k in range(1, n + 1)) / 1024  # exact: k KiB a step
    first = 75_000 * 0.125  # the state before the first change (75 W) held for one step
    assert nv.nvmlDeviceGetTotalEnergyConsumption(h) == first + sum(100_000 * k * 0.125 for k in range(1, n + 1))
