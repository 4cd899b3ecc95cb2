"""GpuSampler against the fake NVML: what each tick records, and how every kind of failure stays local."""

from __future__ import annotations

import pynvml
import pytest
from gpu_fakes import ConstantNode, Events, ScriptedNode, make

from lynxtop.agent.gpu.backend import RealNvml, open_backend
from lynxtop.agent.gpu.fake import FakeNvml, a100_specs, h200_specs, scripted_scenario
from lynxtop.agent.gpu.protocol import FakeGpuState
from lynxtop.agent.gpu.sampler import GPU_COLUMNS, GpuSampler
from lynxtop.contract.columns import NVLINK_METRICS, names

GPM_COLUMNS = ("sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "dram_bw_pct", "fp16_active_pct",
               "fp32_active_pct", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s")
MIB = 1024 * 1024


def busy_state(nlinks: int, **kw) -> FakeGpuState:
    base = dict(util_gpu_pct=99, util_mem_pct=40, sm_active_pct=73.0, sm_occupancy_pct=21.0, tensor_active_pct=64.0,
                dram_bw_pct=35.0, fp16_active_pct=3.0, fp32_active_pct=7.0, pcie_tx_bytes_per_s=10 * MIB,
                pcie_rx_bytes_per_s=30 * MIB, nvlink_tx_bytes_per_s=[100 * MIB * (k + 1) for k in range(nlinks)],
                nvlink_rx_bytes_per_s=[50 * MIB] * nlinks, mem_used_bytes=100 << 30, power_w=612.0, temp_c=71,
                sm_clock_mhz=1980, mem_clock_mhz=3201, throttle_reasons=0x4, ecc_corrected=3)
    base.update(kw)
    return FakeGpuState(**base)


def run_ticks(sampler, clock, n, dt=1.0, pids=frozenset()):
    tick = None
    for _ in range(n):
        clock.advance(dt)
        tick = sampler.sample(pids)
    return tick


def test_h200_tick_records_every_column_with_gpm(clock, events):
    specs = h200_specs(8)
    node = ConstantNode(specs, [busy_state(18) for _ in specs])
    s, _ = make(node, clock, events)
    assert s.open()["state"] == "ok"
    first = s.sample(set())
    assert all(r["sm_active_pct"] is None for r in first.gpu_rows)  # GPM needs two samples
    tick = run_ticks(s, clock, 1)
    assert len(tick.gpu_rows) == 8
    row = tick.gpu_rows[5]
    assert set(row) == set(GPU_COLUMNS) | {"gpu"} and row["gpu"] == 5
    assert (row["sm_active_pct"], row["sm_occupancy_pct"], row["tensor_active_pct"], row["dram_bw_pct"]) == \
        (73, 21, 64, 35)
    assert (row["fp16_active_pct"], row["fp32_active_pct"]) == (3, 7)
    assert row["pcie_tx_bytes_per_s"] == 10 * MIB and row["pcie_rx_bytes_per_s"] == 30 * MIB
    assert row["nvlink_tx_bytes_per_s"] == sum(100 * MIB * (k + 1) for k in range(18))
    assert row["nvlink_rx_bytes_per_s"] == 18 * 50 * MIB
    assert (row["util_gpu_pct"], row["power_w"], row["power_limit_w"], row["temp_c"]) == (99, 612, 700, 71)
    assert row["mem_used_bytes"] == 100 << 30 and row["mem_reserved_bytes"] == 512 * MIB
    assert row["throttle_reasons"] == 0x4 and row["ecc_corrected"] == 3 and row["lost"] == 0
    nl = tick.nvlink_rows[5]
    assert set(nl) == set(names(NVLINK_METRICS)) | {"gpu"}
    assert nl["l0_tx_bytes_per_s"] == 100 * MIB and nl["l17_tx_bytes_per_s"] == 1800 * MIB
    static = s.static()
    assert [g["idx"] for g in static] == list(range(8))
    assert static[0]["arch"] == "Hopper" and static[0]["cc_major"] == 9 and static[0]["gpm_supported"] is True
    assert static[0]["nvlink_count"] == 18 and len({g["uuid"] for g in static}) == 8
    assert events == []  # a healthy node reports nothing


def test_a100_without_gpm_leaves_sm_columns_null_and_reads_nvlink_counters(clock, events):
    specs = a100_specs(2)
    node = ConstantNode(specs, [busy_state(12, util_gpu_pct=100) for _ in specs])
    s, _ = make(node, clock, events)
    s.open()
    s.sample(set())
    tick = run_ticks(s, clock, 3, dt=2.0)
    row = tick.gpu_rows[1]
    assert row["util_gpu_pct"] == 100
    assert all(row[c] is None for c in GPM_COLUMNS)  # NULL, not util.gpu copied
    # rate = Δvalue/Δtimestamp of the KiB counters
    assert row["nvlink_tx_bytes_per_s"] == sum(100 * MIB * (k + 1) for k in range(12))
    nl = tick.nvlink_rows[1]
    assert nl["l11_tx_bytes_per_s"] == 1200 * MIB and nl["l11_rx_bytes_per_s"] == 50 * MIB
    assert nl["l12_tx_bytes_per_s"] is None  # an A100 has 12 links
    assert s.static()[0]["arch"] == "Ampere" and s.static()[0]["gpm_supported"] is False


def test_gpm_switch_off(clock, events):
    node = ConstantNode(h200_specs(1), [busy_state(18)])
    s, made = make(node, clock, events, gpm_enabled=False)
    s.open()
    tick = run_ticks(s, clock, 3)
    assert tick.gpu_rows[0]["sm_active_pct"] is None and tick.gpu_rows[0]["util_gpu_pct"] == 99
    assert made[0].calls.get("nvmlGpmSampleGet", 0) == 0
    assert tick.gpu_rows[0]["nvlink_tx_bytes_per_s"] is not None  # NVLink falls back to the field counters
    assert events.kinds() == ["gpu.gpm_disabled"]


def test_single_gpu_without_nvlink_is_normal(clock, events):
    node = ConstantNode(h200_specs(1, nvlink_count=0), [busy_state(0)])
    s, _ = make(node, clock, events)
    s.open()
    tick = run_ticks(s, clock, 3)
    assert tick.gpu_rows[0]["sm_active_pct"] == 73
    assert tick.gpu_rows[0]["nvlink_tx_bytes_per_s"] is None and tick.nvlink_rows == []
    assert s.static()[0]["nvlink_count"] == 0
    assert events == []


# function -> the columns it fills
COLUMNS_OF = {
    "nvmlDeviceGetUtilizationRates": ("util_gpu_pct", "util_mem_pct"),
    "nvmlDeviceGetPowerUsage": ("power_w",),
    "nvmlDeviceGetEnforcedPowerLimit": ("power_limit_w",),
    "nvmlDeviceGetTemperature": ("temp_c",),
    "nvmlDeviceGetClockInfo": ("sm_clock_mhz", "mem_clock_mhz"),
    "nvmlDeviceGetTotalEnergyConsumption": ("energy_j",),
    "nvmlDeviceGetTotalEccErrors": ("ecc_corrected", "ecc_uncorrected"),
    "nvmlDeviceGetRemappedRows": ("remapped_rows_pending", "remapped_rows_failed"),
    "nvmlGpmSampleGet": GPM_COLUMNS + ("nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s"),
}
CODES = {
    "NOT_SUPPORTED": pynvml.NVML_ERROR_NOT_SUPPORTED,
    "NO_PERMISSION": pynvml.NVML_ERROR_NO_PERMISSION,
    "NOT_FOUND": pynvml.NVML_ERROR_NOT_FOUND,
    "FUNCTION_NOT_FOUND": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    "UNKNOWN": pynvml.NVML_ERROR_UNKNOWN,
}


@pytest.mark.parametrize("code_name", list(CODES))
@pytest.mark.parametrize("fn", list(COLUMNS_OF))
def test_a_failing_call_nulls_only_its_metric_on_that_gpu(clock, fn, code_name):
    code = CODES[code_name]
    specs = h200_specs(3)
    node = ConstantNode(specs, [busy_state(18) for _ in specs])
    events = Events()
    s, made = make(node, clock, events, slow_interval_s=5.0)
    s.open()
    made[0].errors[(1, fn)] = code
    s.sample(set())
    tick = run_ticks(s, clock, 2)
    bad, good = tick.gpu_rows[1], tick.gpu_rows[2]
    for col in COLUMNS_OF[fn]:
        assert bad[col] is None, col
        assert good[col] is not None, col
    others = [c for c in GPU_COLUMNS if c not in COLUMNS_OF[fn]]
    assert all(bad[c] is not None for c in others if c not in ("mem_reserved_bytes",)), others
    assert bad["lost"] == 0 and len(tick.gpu_rows) == 3

    calls_before = made[0].gpu_calls.get((1, fn), 0)
    run_ticks(s, clock, 6)  # past one slow interval
    again = made[0].gpu_calls.get((1, fn), 0) - calls_before
    if code_name in ("NOT_SUPPORTED", "FUNCTION_NOT_FOUND"):
        assert again == 0  # never asked again on that GPU
    else:
        assert again > 0  # transient or permission: asked again (NO_PERMISSION at the slow cadence)
    if code_name == "FUNCTION_NOT_FOUND":
        assert events.kinds() == ["nvml.missing_function"]  # once, however many ticks
        assert fn in events[0][2] and events[0][1] == "warning"
    elif code_name == "NO_PERMISSION":
        assert events.kinds() == ["nvml.no_permission"] and "GPU 1" in events[0][2]
    else:
        assert events == []


def test_missing_functions_scenario_falls_back_and_reports_once(clock, events):
    s, made = make(scripted_scenario("missing"), clock, events)
    s.open()
    run_ticks(s, clock, 5)
    tick = run_ticks(s, clock, 1)
    row = tick.gpu_rows[0]
    assert row["mem_used_bytes"] is not None and row["mem_reserved_bytes"] is None  # v1 memory info
    assert row["throttle_reasons"] is not None  # the older throttle-reason call
    assert row["sm_active_pct"] is None and row["energy_j"] is None and row["remapped_rows_failed"] is None
    assert set(events.kinds()) == {"nvml.missing_function"}
    fns = {e[3]["function"] for e in events}
    assert {"nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetRemappedRows", "nvmlGpmQueryDeviceSupport"} <= fns
    assert len(events) == len(fns)  # each reported once, not once per GPU or per tick


def test_lost_gpu_others_keep_sampling_event_once(clock, events):
    node = ScriptedNode(h200_specs(4), lost={2: 3.0})
    s, made = make(node, clock, events, lost_probe_s=10.0)
    s.open()
    tick = run_ticks(s, clock, 2)
    assert [r["lost"] for r in tick.gpu_rows] == [0, 0, 0, 0]
    tick = run_ticks(s, clock, 2)
    assert [r["lost"] for r in tick.gpu_rows] == [0, 0, 1, 0]
    lost_row = tick.gpu_rows[2]
    assert all(lost_row[c] is None for c in GPU_COLUMNS if c not in ("lost", "mem_total_bytes"))
    assert tick.gpu_rows[3]["util_gpu_pct"] is not None and tick.gpu_rows[3]["sm_active_pct"] is not None
    n_calls = sum(made[0].calls.values())
    tick = run_ticks(s, clock, 5)
    assert tick.gpu_rows[2]["lost"] == 1
    # the lost GPU is not hammered: 3 healthy GPUs' calls per tick, plus no more than a probe
    per_tick = (sum(made[0].calls.values()) - n_calls) / 5
    assert per_tick < 3 * 16
    assert events.kinds() == ["gpu.lost"] and events[0][1] == "critical" and events[0][3]["gpu"] == 2


def test_lost_gpu_that_answers_again_recovers(clock, events):
    node = ConstantNode(h200_specs(2), [busy_state(18), busy_state(18)])
    s, _ = make(node, clock, events, lost_probe_s=3.0, lost_settle_s=10.0)
    s.open()
    run_ticks(s, clock, 2)
    node.states[1] = FakeGpuState(lost=True)
    assert run_ticks(s, clock, 1).gpu_rows[1]["lost"] == 1
    node.states[1] = busy_state(18)
    tick = run_ticks(s, clock, 4)
    assert tick.gpu_rows[1]["lost"] == 0 and tick.gpu_rows[1]["temp_c"] == 71
    assert events.kinds() == ["gpu.lost"]  # sampled again at once; told recovered once it answered 10 s (s22)
    run_ticks(s, clock, 10)
    assert events.kinds() == ["gpu.lost", "gpu.recovered"]


def test_gpu_lost_before_enumeration(clock, events):
    node = ConstantNode(h200_specs(3), [busy_state(18), FakeGpuState(lost=True), busy_state(18)])
    s, _ = make(node, clock, events)
    assert s.open()["state"] == "ok"
    assert [g["idx"] for g in s.static()] == [0, 2]  # no UUID can be read from a lost GPU
    tick = run_ticks(s, clock, 2)
    assert [r["lost"] for r in tick.gpu_rows] == [0, 1, 0]
    assert events.kinds() == ["gpu.lost"]


def test_no_driver_is_a_state_and_the_driver_may_come_later(clock, events):
    init_error = {"code": pynvml.NVML_ERROR_LIBRARY_NOT_FOUND}
    node = scripted_scenario("h200x8")

    def factory():
        return FakeNvml(node, clock=clock, init_error=init_error["code"])

    s = GpuSampler(factory, clock=clock, on_event=events, xid_events=False, retry_initial_s=2.0)
    st = s.open()
    assert st["state"] == "no-driver" and "no NVIDIA driver" in st["message"]
    assert s.sample({1}).gpu_rows == [] and s.static() == []
    init_error["code"] = None
    clock.advance(1.0)
    assert s.sample(set()).gpu_rows == []  # still backing off
    clock.advance(1.5)
    assert len(s.sample(set()).gpu_rows) == 8 and s.status()["state"] == "ok"
    assert events.kinds() == ["nvml.unavailable"]  # the end is told once NVML has sampled cleanly for 60 s
    run_ticks(s, clock, 60)
    assert events.kinds() == ["nvml.unavailable", "nvml.available"] and events[-1][1] == "info"
    assert events[-1][3]["failed_tries"] == 1 and events[-1][3]["gpus"] == 8
    run_ticks(s, clock, 120)
    assert len(events) == 2  # told once


def test_real_backend_without_a_driver_on_this_machine(events):
    """This machine has no NVIDIA driver: the real pynvml path must end in the 'no-driver' state."""
    s = GpuSampler(RealNvml, on_event=events)
    st = s.open()
    if st["state"] == "ok":
        s.close()
        pytest.skip("a real NVIDIA driver is present here")
    assert st["state"] == "no-driver", st
    assert "NVML_ERROR_LIBRARY_NOT_FOUND" in st["message"]
    assert s.sample(set()).gpu_rows == []
    s.close()


def test_version_mismatch_reinitialises_with_backoff(clock, events):
    node = ConstantNode(h200_specs(2), [busy_state(18), busy_state(18)])
    made: list[FakeNvml] = []
    fail_inits = {"n": 0}

    def factory():
        nv = FakeNvml(node, clock=clock)
        if fail_inits["n"] > 0:
            fail_inits["n"] -= 1
            nv.init_error = pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
        made.append(nv)
        return nv

    s = GpuSampler(factory, clock=clock, on_event=events, xid_events=False, retry_initial_s=1.0)
    s.open()
    run_ticks(s, clock, 2)
    v0 = s.static_version
    made[-1].fail_all = pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH  # the driver was upgraded under us
    fail_inits["n"] = 2
    assert run_ticks(s, clock, 1).gpu_rows == []
    assert s.status()["state"] == "error" and "LIB_RM_VERSION_MISMATCH" in s.status()["message"]
    attempts = []
    for _ in range(8):
        clock.advance(0.5)
        n = len(made)
        tick = s.sample(set())
        if len(made) > n:
            attempts.append(clock.t)
    # backoff doubles: tries 1 s, then 1 s, then 2 s apart (the first retry after the failure uses the initial)
    assert len(attempts) == 3
    assert attempts[2] - attempts[1] > attempts[1] - attempts[0]
    assert s.status()["state"] == "ok" and len(tick.gpu_rows) == 2 and s.static_version == v0 + 1
    assert events.kinds().count("nvml.reinit") == 1  # the end is told once NVML has sampled cleanly for 60 s
    run_ticks(s, clock, 60)
    kinds = events.kinds()
    assert kinds[0] == "nvml.reinit" and kinds[-1] == "nvml.reinit" and events[-1][1] == "info"
    assert "nvml.unavailable" in kinds  # the failing re-init attempts are reported once
    assert events[-1][3]["reinits"] == 1 and events[-1][3]["failed_tries"] == 2


def test_process_rows_are_tagged_with_the_vllm_tree(clock):
    node = ScriptedNode(h200_specs(2), processes={0: [(4242, 80 << 30), (777, 1 << 30)], 1: [(4243, 80 << 30)]})
    s, _ = make(node, clock)
    s.open()
    tick = run_ticks(s, clock, 1, pids={4242, 4243, 4244})
    got = {(p["gpu"], p["pid"]): (p["used_mem_bytes"], p["in_vllm_tree"]) for p in tick.process_rows}
    assert got == {(0, 4242): (80 << 30, True), (0, 777): (1 << 30, False), (1, 4243): (80 << 30, True)}


def test_slow_readings_at_their_own_cadence(clock):
    node = ConstantNode(h200_specs(4), [busy_state(18) for _ in range(4)])
    s, made = make(node, clock, slow_interval_s=60.0)
    s.open()
    fn = "nvmlDeviceGetTotalEnergyConsumption"
    t0 = s.sample(set())
    assert made[0].calls[fn] == 4  # the first tick reads every GPU
    energies = [r["energy_j"] for r in t0.gpu_rows]
    run_ticks(s, clock, 30)
    assert made[0].calls[fn] == 4
    tick = run_ticks(s, clock, 1)
    assert [r["energy_j"] for r in tick.gpu_rows] == energies  # carried forward between slow reads
    run_ticks(s, clock, 29)  # t = 60 s: every GPU is due, but one GPU's slow reads per tick at most
    assert made[0].calls[fn] == 5
    counts = []
    for _ in range(5):
        clock.advance(1.0)
        s.sample(set())
        counts.append(made[0].calls[fn])
    assert counts == [6, 7, 8, 8, 8]
    assert made[0].calls["nvmlDeviceGetPowerUsage"] == 66 * 4  # fast metrics every tick


def test_never_calls_the_blocking_pcie_throughput(clock):
    s, made = make(scripted_scenario("h200x8"), clock)
    s.open()
    run_ticks(s, clock, 5)
    assert "nvmlDeviceGetPcieThroughput" not in made[0].calls


def test_xid_events_are_delivered_with_the_xid_number(clock, events):
    node = ConstantNode(h200_specs(2), [busy_state(18), busy_state(18)])
    made: list[FakeNvml] = []

    def factory():
        made.append(FakeNvml(node, clock=clock))
        return made[-1]

    s = GpuSampler(factory, clock=clock, on_event=events)
    s.open()
    made[0].inject_xid(1, 48)
    assert events == []  # nothing reads the event set between ticks
    run_ticks(s, clock, 1)
    s.close()
    assert events.kinds() == ["gpu.xid"]
    kind, severity, message, details = events[0]
    assert details == {"gpu": 1, "xid": 48} and severity == "critical" and "double-bit ECC" in message


def test_a_bug_on_one_gpu_costs_only_that_gpu_its_row(clock, events):
    class Broken(FakeNvml):
        def nvmlDeviceGetUtilizationRates(self, handle):
            if handle.index == 1:
                raise RuntimeError("bug in a backend")
            return super().nvmlDeviceGetUtilizationRates(handle)

    s = GpuSampler(lambda: Broken(scripted_scenario("h200x8"), clock=clock), clock=clock, xid_events=False)
    s.open()
    tick = run_ticks(s, clock, 2)
    assert [r["gpu"] for r in tick.gpu_rows] == [0, 2, 3, 4, 5, 6, 7]
    s.close()


def test_nan_from_gpm_is_null_not_a_crash(clock, events):
    """Seen on a real H200: GPM answered SUCCESS with NaN for a metric."""
    node = ConstantNode(h200_specs(2), [busy_state(18, dram_bw_pct=float("nan")), busy_state(18)])
    s, _ = make(node, clock, events)
    s.open()
    tick = run_ticks(s, clock, 3)
    assert tick.gpu_rows[0]["dram_bw_pct"] is None and tick.gpu_rows[0]["sm_active_pct"] == 73
    assert tick.gpu_rows[1]["dram_bw_pct"] == 35


def test_scripted_xid_then_lost_gpu(clock, events):
    """The 'lost' scenario's order on a real node: XID 79 (fallen off the bus), then GPU_IS_LOST."""
    node = scripted_scenario("lost", lost={3: 4.0}, xids=[(3.0, 3, 79)])
    s = GpuSampler(lambda: FakeNvml(node, clock=clock), clock=clock, on_event=events)
    s.open()
    try:
        tick = run_ticks(s, clock, 6)
    finally:
        s.close()
    assert [r["lost"] for r in tick.gpu_rows] == [0, 0, 0, 1, 0, 0, 0, 0]
    xids = [e for e in events if e[0] == "gpu.xid"]
    assert len(xids) == 1 and xids[0][3] == {"gpu": 3, "xid": 79} and "fallen off the bus" in xids[0][2]
    assert events.kinds().count("gpu.lost") == 1
    assert events.kinds().index("gpu.xid") < events.kinds().index("gpu.lost")


def test_simulator_backend_opens_as_simulated(tmp_path):
    from lynxtop.sim.gpus import SimScenario

    s = GpuSampler(lambda: open_backend("sim", str(tmp_path), SimScenario), xid_events=False)
    try:
        st = s.open()
        assert st["state"] == "ok" and "simulated" in st["message"]
        assert all("(simulated)" in g["name"] for g in s.static())
        assert len(s.sample(set()).gpu_rows) == len(s.static()) > 0
    finally:
        s.close()


def test_static_facts_are_built_once_per_initialisation(clock, events):
    """Every tick hands static() to the node's view; the rows are made once per (re)initialisation, and a
    re-initialisation with another driver gives new ones (issue 29.3: no dicts rebuilt per tick)."""
    node = ConstantNode(h200_specs(2))
    s, made = make(node, clock, events)
    s.open()
    first = s.static()
    run_ticks(s, clock, 3)
    again = s.static()
    assert again == first and all(a is b for a, b in zip(again, first, strict=True))
    node._driver = "590.10.01"  # an upgraded driver: NVML is re-initialised
    made[-1].fail_all = pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
    run_ticks(s, clock, 1)
    assert s.static() == []
    clock.advance(5.0)
    run_ticks(s, clock, 1)
    assert s.status()["state"] == "ok" and [g["driver_version"] for g in s.static()] == ["590.10.01"] * 2
    s.close()
    assert s.static() == []


def _agent_lines_in_one_tick(clock, nlinks: int, state: FakeGpuState) -> tuple[int, list[dict]]:
    """Python lines the agent's GPM/NVLink reading (gpm.py, readers.py) runs in one 1 Hz tick of one GPU."""
    import sys

    node = ConstantNode(h200_specs(1, nvlink_count=nlinks), [state])
    s = GpuSampler(lambda: FakeNvml(node, clock=clock), clock=clock, xid_events=False)
    s.open()
    run_ticks(s, clock, 2)
    lines = 0

    def tracer(frame, event, arg):
        nonlocal lines
        if event == "line" and frame.f_code.co_filename.endswith(("/gpu/gpm.py", "/gpu/readers.py")):
            lines += 1
        return tracer

    clock.advance(1.0)
    sys.settrace(tracer)
    try:
        tick = s.sample(set())
    finally:
        sys.settrace(None)
    s.close()
    return lines, tick.gpu_rows + tick.nvlink_rows


def test_a_gpm_answer_is_read_without_a_python_step_per_metric(clock):
    """Issue 29.3: a GPM answer (the scalar columns, and 36 per-link figures once a second) is checked, scaled,
    rounded and put in its rows by C-level passes; the agent's Python lines for a GPU do not grow with its
    metrics (2 links against 18), and the rows are what the per-value path gave: a NaN still reads NULL."""
    two, rows2 = _agent_lines_in_one_tick(clock, 2, busy_state(2))
    eighteen, rows18 = _agent_lines_in_one_tick(clock, 18, busy_state(18))
    assert two == eighteen, (two, eighteen)
    gpu, links = rows18
    assert gpu["sm_active_pct"] == 73 and gpu["pcie_rx_bytes_per_s"] == 30 * MIB
    assert gpu["nvlink_tx_bytes_per_s"] == sum(100 * MIB * (k + 1) for k in range(18))
    assert links["l17_tx_bytes_per_s"] == 1800 * MIB and links["l0_rx_bytes_per_s"] == 50 * MIB
    assert rows2[1]["l1_tx_bytes_per_s"] == 200 * MIB and rows2[1]["l2_tx_bytes_per_s"] is None
    _, nan_rows = _agent_lines_in_one_tick(clock, 18, busy_state(18, dram_bw_pct=float("nan")))
    assert nan_rows[0]["dram_bw_pct"] is None and nan_rows[0]["sm_active_pct"] == 73


class MovingNode(ConstantNode):
    """Every look a new state (activity, PCIe and per-link NVLink rates moving with time): each GPM interval
    spans state changes, as under a streamed load."""

    def state(self, index: int, now: float) -> FakeGpuState:
        n = self.specs[index].nvlink_count
        w = (now * 7.3 + index) % 11
        return busy_state(n, sm_active_pct=40.0 + w, dram_bw_pct=20.0 + w / 3, pcie_tx_bytes_per_s=(10 + w) * MIB,
                          nvlink_tx_bytes_per_s=[(100 + w) * MIB * (k + 1) for k in range(n)],
                          nvlink_rx_bytes_per_s=[(50 + w / 7) * MIB] * n)


def test_at_1hz_one_gpm_metrics_call_answers_the_tick_and_its_per_link_rates(clock):
    """Issue 29.3, session 12: at 1 Hz (per-link rates read every tick) the per-link base is the previous sample,
    so the tick's figures and the per-link rates are over one interval and one nvmlGpmMetricsGet answers both:
    one call a GPU a tick instead of two. The rows are those of two separate calls; at 10 Hz, where the per-link
    base is a second old, the per-link tick still makes two."""
    specs = h200_specs(2) + a100_specs(1)  # the A100 has no GPM: its field counters are untouched
    node = MovingNode(specs)
    one, made_one = make(node, clock)
    two, made_two = make(node, clock)
    one.open()
    two.open()
    for g in two._gpus:
        if g.gpm is not None:
            g.gpm._both = None  # the per-link rates from a call of their own, as before
    for k, dt in enumerate([1.0] * 6 + [0.1] * 12 + [1.0] * 3):
        clock.advance(dt)
        before = made_one[0].calls.get("nvmlGpmMetricsGet", 0), made_two[0].calls.get("nvmlGpmMetricsGet", 0)
        a, b = one.sample({4242}), two.sample({4242})
        for rows_a, rows_b in ((a.gpu_rows, b.gpu_rows), (a.nvlink_rows, b.nvlink_rows)):
            assert [list(r.items()) for r in rows_a] == [list(r.items()) for r in rows_b], k
        calls = (made_one[0].calls.get("nvmlGpmMetricsGet", 0) - before[0],
                 made_two[0].calls.get("nvmlGpmMetricsGet", 0) - before[1])
        if 1 <= k < 6 or k >= 19:  # 1 Hz, past the first tick (no previous sample) and a per-link base a second old
            assert calls == (2, 4), k
            assert a.gpu_rows[0]["sm_active_pct"] is not None and len(a.nvlink_rows) == 3
        else:  # the first tick, 10 Hz, and the first 1 Hz tick after it: the calls as before
            assert calls[0] == calls[1], k
    assert {r["gpu"] for r in a.nvlink_rows} == {0, 1, 2}
