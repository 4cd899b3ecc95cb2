"""The agent's per-GPU reading path against a straightforward per-metric reader kept here (issue 29.3, session 9).

`ReferenceSampler` reads every metric the plain way: one `getattr(backend, name)(...)` a metric behind the
`g.off` check, a fresh row from the column template every tick, GPM answers read field by field from pynvml's
own struct and rounded one by one. Two samplers, each on its own fake node over the same scripted scenario and
the same manual clock, with the same errors injected per metric and per GPU over time (every error code, a lost
GPU that comes back, NaN from GPM, an ECC count that moves), must give the same rows (keys, values and key order),
the same NVLink and process rows, the same events and the same NVML calls in the same order.
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace

import pynvml
from gpu_fakes import Events, ManualClock, ScriptedNode

from lynxtop.agent.gpu.calls import Gpu
from lynxtop.agent.gpu.fake import MISSING_FUNCTIONS, FakeNvml
from lynxtop.agent.gpu.gpm import NVLINK_TOTALS, SCALAR_METRICS, link_metrics
from lynxtop.agent.gpu.protocol import FakeGpuSpec, FakeGpuState
from lynxtop.agent.gpu.readers import PROCESS_SM_WINDOW_US
from lynxtop.agent.gpu.sampler import GPU_COLUMNS, GpuSampler, GpuTick
from lynxtop.contract.columns import NVLINK_METRICS, names

E = pynvml
NVLINK_COLUMNS = names(NVLINK_METRICS)


# ---------------------------------------------------------------------- the reference: one metric at a time


def ref_call(c, g: Gpu, name: str, *args, key: str | None = None, **kw):
    """What a metric reads: None when switched off on this GPU or failed (booked by the shared error policy)."""
    key = key or name
    if key in g.off:
        return None
    try:
        return getattr(c.b, name)(*args, **kw)
    except pynvml.NVMLError as e:
        return c.failed(g, key, e.value, None if key == name else name)


class RefGpm:
    """GPM read field by field from pynvml's own metrics struct: a previous sample for the tick's figures, the
    sample of the last per-link read for the per-link rates, three buffers."""

    def __init__(self, b, h, nvlink_count: int):
        self.b, self.h = b, h
        self.fast = SCALAR_METRICS + (NVLINK_TOTALS if nvlink_count else ())
        self.links = link_metrics(nvlink_count)
        self.samples = [b.nvmlGpmSampleAlloc() for _ in range(3 if self.links else 2)]
        self.prev = self.base = None

    def _metrics(self, metrics, first, second) -> list[int | None]:
        mg = pynvml.c_nvmlGpmMetricsGet_t()
        mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(metrics)
        mg.sample1, mg.sample2 = first, second
        for i, (_, mid, _) in enumerate(metrics):
            mg.metrics[i].metricId = mid
        self.b.nvmlGpmMetricsGet(mg)
        out = []
        for i, (_, _, scale) in enumerate(metrics):
            m = mg.metrics[i]
            ok = m.nvmlReturn == 0 and math.isfinite(m.value) and abs(m.value) < 1e18
            out.append(round(m.value * scale) if ok else None)
        return out

    def sample(self, links: bool):
        cur = [i for i in range(len(self.samples)) if i not in (self.prev, self.base)][0]
        self.b.nvmlGpmSampleGet(self.h, self.samples[cur])
        prev, base, self.prev = self.prev, self.base, cur
        link_vals = None
        if links and self.links:
            self.base = cur
            if base is not None and base == prev:  # the per-link base is the previous sample: one call for both
                both = self._metrics(self.fast + self.links, self.samples[prev], self.samples[cur])
                return both[:len(self.fast)], both[len(self.fast):]
            if base is not None:
                link_vals = self._metrics(self.links, self.samples[base], self.samples[cur])
        vals = None if prev is None else self._metrics(self.fast, self.samples[prev], self.samples[cur])
        return vals, link_vals

    def reset(self):
        self.prev = self.base = None

    def close(self):
        for s in self.samples:
            self.b.nvmlGpmSampleFree(s)
        self.samples = []


def ref_link_row(gpu: int, columns: list[str], values) -> dict | None:
    if not values:
        return None
    row = {c: None for c in NVLINK_COLUMNS}
    row["gpu"] = gpu
    for col, v in zip(columns, values, strict=True):
        if v is not None:
            row[col] = round(v)
    return row


class ReferenceSampler(GpuSampler):
    """The production lifecycle (open, lost GPUs, re-initialisation, the refresh rule); each GPU's tick read
    the plain way."""

    def _try_open(self) -> None:
        super()._try_open()
        for g in self._gpus:
            if g.gpm is not None:
                g.gpm.close()
                g.gpm = RefGpm(self._c.b, g.handle, g.nvlink_count)

    def _sample_gpu(self, g, now, do_slow, vllm_pids, tick: GpuTick) -> None:
        c, h = self._c, g.handle
        row = {col: None for col in GPU_COLUMNS}
        row["gpu"] = g.idx
        row["lost"] = 0
        if g.denied_at:
            c.retry_denied(g, now)
        kept = self._refresh.due(g.kept_at, now)
        u = ref_call(c, g, "nvmlDeviceGetUtilizationRates", h)
        if u is not None:
            row["util_gpu_pct"], row["util_mem_pct"] = u.gpu, u.memory
        p = ref_call(c, g, "nvmlDeviceGetPowerUsage", h)
        if p is not None:
            row["power_w"] = round(p / 1000)
        row["sm_clock_mhz"] = ref_call(c, g, "nvmlDeviceGetClockInfo", h, E.NVML_CLOCK_SM, key="clock_sm")
        if "nvmlDeviceGetCurrentClocksEventReasons" not in g.off:
            row["throttle_reasons"] = ref_call(c, g, "nvmlDeviceGetCurrentClocksEventReasons", h)
        else:
            row["throttle_reasons"] = ref_call(c, g, "nvmlDeviceGetCurrentClocksThrottleReasons", h)
        if kept:
            self._ref_kept(g, now)
            self._ref_processes(g, vllm_pids)
        self._ref_activity(g, row, kept)
        if g.link_row is not None:
            tick.nvlink_rows.append(g.link_row)
        tick.process_rows.extend(g.proc_rows)
        if do_slow:
            g.slow_due = now + self.slow_interval_s
            e = ref_call(c, g, "nvmlDeviceGetTotalEnergyConsumption", h)
            g.slow = {"energy_j": None if e is None else e // 1000}
        row.update(g.kept)
        row.update(g.slow)
        tick.gpu_rows.append(row)

    def _ref_kept(self, g: Gpu, now: float) -> None:
        c, h = self._c, g.handle
        k: dict = {}
        if g.mem_v2:
            m = ref_call(c, g, "nvmlDeviceGetMemoryInfo", h, version=E.nvmlMemory_v2,
                         key="nvmlDeviceGetMemoryInfo_v2")
            if m is not None:
                k["mem_used_bytes"], k["mem_total_bytes"], k["mem_reserved_bytes"] = m.used, m.total, m.reserved
            elif "nvmlDeviceGetMemoryInfo_v2" in g.off:
                g.mem_v2 = False
        if not g.mem_v2:
            m = ref_call(c, g, "nvmlDeviceGetMemoryInfo", h)
            if m is not None:
                k["mem_used_bytes"], k["mem_total_bytes"] = m.used, m.total
        p = ref_call(c, g, "nvmlDeviceGetEnforcedPowerLimit", h)
        k["power_limit_w"] = None if p is None else round(p / 1000)
        k["temp_c"] = ref_call(c, g, "nvmlDeviceGetTemperature", h, E.NVML_TEMPERATURE_GPU)
        k["mem_clock_mhz"] = ref_call(c, g, "nvmlDeviceGetClockInfo", h, E.NVML_CLOCK_MEM, key="clock_mem")
        k["ecc_corrected"] = ref_call(c, g, "nvmlDeviceGetTotalEccErrors", h, E.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                      E.NVML_VOLATILE_ECC, key="ecc_corrected")
        k["ecc_uncorrected"] = ref_call(c, g, "nvmlDeviceGetTotalEccErrors", h,
                                        E.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, E.NVML_VOLATILE_ECC,
                                        key="ecc_uncorrected")
        rr = ref_call(c, g, "nvmlDeviceGetRemappedRows", h)
        k["remapped_rows_pending"] = None if rr is None else int(bool(rr[2]))
        k["remapped_rows_failed"] = None if rr is None else int(bool(rr[3]))
        g.kept, g.kept_at = k, now

    def _ref_processes(self, g: Gpu, vllm_pids) -> None:
        c = self._c
        procs = ref_call(c, g, "nvmlDeviceGetComputeRunningProcesses", g.handle)
        if not procs:
            g.proc_rows = []
            return
        newest: dict = {}
        for s in ref_call(c, g, "nvmlDeviceGetProcessUtilization", g.handle, g.sm_seen_us) or ():
            if s.pid not in newest or s.timeStamp > newest[s.pid].timeStamp:
                newest[s.pid] = s
        if newest:
            g.sm_seen_us = max(0, max(s.timeStamp for s in newest.values()) - PROCESS_SM_WINDOW_US)
        g.proc_rows = [{"gpu": g.idx, "pid": pr.pid, "used_mem_bytes": pr.usedGpuMemory,
                        "in_vllm_tree": pr.pid in vllm_pids,
                        "sm_util_pct": int(newest[pr.pid].smUtil) if pr.pid in newest else None} for pr in procs]

    def _ref_activity(self, g: Gpu, row: dict, links: bool) -> None:
        if g.gpm is not None and "nvmlGpmSampleGet" not in g.off:
            try:
                vals, link_vals = g.gpm.sample(links)
            except pynvml.NVMLError as e:
                if links:
                    g.link_row = None
                self._c.failed(g, "nvmlGpmSampleGet", e.value)
                return
            for (col, _, _), v in zip(g.gpm.fast, vals or [], strict=False):
                if v is not None:
                    row[col] = v
            if links:
                g.link_row = ref_link_row(g.idx, [col for col, _, _ in g.gpm.links], link_vals)
        elif g.counters is not None and "nvmlDeviceGetFieldValues" not in g.off:
            try:
                rates, link_rates, any_ok = g.counters.read(links)
            except pynvml.NVMLError as e:
                if links:
                    g.link_row = None
                self._c.failed(g, "nvmlDeviceGetFieldValues", e.value)
                return
            if not any_ok:
                g.counters = None
            tx, rx = rates[0::2], rates[1::2]
            if tx and None not in tx:
                row["nvlink_tx_bytes_per_s"] = round(sum(tx))
            if rx and None not in rx:
                row["nvlink_rx_bytes_per_s"] = round(sum(rx))
            if links:
                g.link_row = ref_link_row(g.idx, g.counters.columns if g.counters else [], link_rates) \
                    if any_ok else None
        elif links:
            g.link_row = None


# ---------------------------------------------------------------------- the scenario


class Logged(FakeNvml):
    """The fake NVML, logging every call it answers in order: (GPU or None, function)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.log: list[tuple[int | None, str]] = []

    def _check(self, handle, fn):
        self.log.append((handle.index, fn))
        return super()._check(handle, fn)

    def _system(self, fn):
        self.log.append((None, fn))
        return super()._system(fn)


class Incidents:
    """A scripted node plus what it lacks: NaN from GPM on GPU 0 for a while, an ECC count that moves on GPU 1."""

    def __init__(self, node: ScriptedNode):
        self.node = node

    def driver_version(self):
        return self.node.driver_version()

    def gpus(self):
        return self.node.gpus()

    def state(self, index: int, now: float) -> FakeGpuState:
        st = self.node.state(index, now)
        t = now - (self.node.start or now)
        if index == 0 and 3.0 <= t < 4.5:
            st = replace(st, dram_bw_pct=float("nan"), xid_events=[])
        if index == 1 and t >= 6.0:
            st = replace(st, ecc_corrected=int(t - 5), ecc_uncorrected=int(t >= 9), remapped_pending=t >= 9,
                         xid_events=[])
        return st


def specs() -> list[FakeGpuSpec]:
    a100 = dict(name="NVIDIA A100-SXM4-80GB", cc=(8, 0), mem_total_bytes=81920 << 20, power_limit_w=400.0,
                nvlink_count=12, gpm=False)
    return [FakeGpuSpec(index=0), FakeGpuSpec(index=1, nvlink_count=2), FakeGpuSpec(index=2, **a100),
            FakeGpuSpec(index=3, nvlink_count=0),
            FakeGpuSpec(index=4, missing_functions=MISSING_FUNCTIONS - {"nvmlGpmQueryDeviceSupport"}),
            FakeGpuSpec(index=5, unsupported=frozenset({"nvmlDeviceGetProcessUtilization"}))]


# (elapsed tick, gpu, function, code or None to clear): every metric's function fails somewhere, with every code
ERRORS = [
    (5, 0, "nvmlDeviceGetUtilizationRates", E.NVML_ERROR_UNKNOWN), (8, 0, "nvmlDeviceGetUtilizationRates", None),
    (6, 1, "nvmlDeviceGetPowerUsage", E.NVML_ERROR_NO_PERMISSION), (40, 1, "nvmlDeviceGetPowerUsage", None),
    (7, 2, "nvmlDeviceGetClockInfo", E.NVML_ERROR_NOT_FOUND), (19, 2, "nvmlDeviceGetClockInfo", None),
    (9, 3, "nvmlDeviceGetCurrentClocksEventReasons", E.NVML_ERROR_FUNCTION_NOT_FOUND),
    (10, 0, "nvmlGpmSampleGet", E.NVML_ERROR_UNKNOWN), (13, 0, "nvmlGpmSampleGet", None),
    (11, 1, "nvmlDeviceGetMemoryInfo_v2", E.NVML_ERROR_UNKNOWN), (25, 1, "nvmlDeviceGetMemoryInfo_v2", None),
    (12, 5, "nvmlDeviceGetTemperature", E.NVML_ERROR_NOT_SUPPORTED),
    (14, 0, "nvmlDeviceGetTotalEccErrors", E.NVML_ERROR_NO_PERMISSION),
    (60, 0, "nvmlDeviceGetTotalEccErrors", None),
    (15, 2, "nvmlDeviceGetFieldValues", E.NVML_ERROR_UNKNOWN), (18, 2, "nvmlDeviceGetFieldValues", None),
    (16, 3, "nvmlDeviceGetRemappedRows", E.NVML_ERROR_UNKNOWN), (33, 3, "nvmlDeviceGetRemappedRows", None),
    (17, 1, "nvmlDeviceGetComputeRunningProcesses", E.NVML_ERROR_UNKNOWN),
    (30, 1, "nvmlDeviceGetComputeRunningProcesses", None),
    (20, 4, "nvmlDeviceGetEnforcedPowerLimit", E.NVML_ERROR_NOT_SUPPORTED),
    (21, 5, "nvmlDeviceGetTotalEnergyConsumption", E.NVML_ERROR_UNKNOWN),
    (45, 5, "nvmlDeviceGetTotalEnergyConsumption", None),
    (22, 3, "nvmlDeviceGetUtilizationRates", E.NVML_ERROR_GPU_IS_LOST),  # lost, and back once cleared
    (35, 3, "nvmlDeviceGetUtilizationRates", None),
    (24, 0, "nvmlGpmMetricsGet", E.NVML_ERROR_UNKNOWN), (26, 0, "nvmlGpmMetricsGet", None),
    (27, 1, "nvmlGpmSampleGet", E.NVML_ERROR_NOT_SUPPORTED),
    (28, 0, "nvmlDeviceGetPowerUsage", E.NVML_ERROR_NOT_SUPPORTED),
    (50, 4, "nvmlDeviceGetClockInfo", E.NVML_ERROR_FUNCTION_NOT_FOUND),
]


def run(sampler_cls, steps: list[float]) -> tuple[list, Events, list]:
    """Every tick's rows (as item lists, so key order counts) and the NVML calls each tick made."""
    clock = ManualClock()
    node = Incidents(ScriptedNode(specs(), processes={0: [(4242, 80 << 30), (777, 1 << 30)], 5: [(4243, 1 << 30)]},
                                  process_sm={0: {4242: 61.0}, 5: {4243: 12.0}}))
    made: list[Logged] = []

    def factory():
        made.append(Logged(node, clock=clock))
        return made[-1]

    events = Events()
    s = sampler_cls(factory, clock=clock, on_event=events, xid_events=False, slow_interval_s=2.0, lost_probe_s=1.0,
                    lost_settle_s=5.0)
    assert s.open()["state"] == "ok"
    made[0].log.clear()
    out, calls = [], []
    for k, dt in enumerate(steps):
        for at, gpu, fn, code in ERRORS:
            if at == k:
                if code is None:
                    made[-1].errors.pop((gpu, fn), None)
                else:
                    made[-1].errors[(gpu, fn)] = code
        clock.advance(dt)
        tick = s.sample({4242})
        out.append(([list(r.items()) for r in tick.gpu_rows], [list(r.items()) for r in tick.nvlink_rows],
                     [list(r.items()) for r in tick.process_rows]))
        calls.append(list(made[-1].log))
        made[-1].log.clear()
    s.close()
    return out, events, calls


def steps() -> list[float]:
    """10 Hz with jitter, a 1 Hz stretch, a stall, then 10 Hz again."""
    jitter = [0.1 + 0.03 * math.sin(k) for k in range(60)]
    return jitter + [1.0] * 6 + [3.5] + [0.1] * 40


def test_rows_events_and_calls_match_the_per_metric_reader():
    new, new_events, new_calls = run(GpuSampler, steps())
    ref, ref_events, ref_calls = run(ReferenceSampler, steps())
    for k, (a, b) in enumerate(zip(new, ref, strict=True)):
        assert a == b, f"tick {k} differs"
    for k, (a, b) in enumerate(zip(new_calls, ref_calls, strict=True)):
        assert a == b, f"tick {k}: other NVML calls"
    assert new_events == ref_events
    # the scenario did what it says: NULLs from failures, a lost GPU and its return, NaN, ECC, links, processes
    rows = [r for gpu_rows, _, _ in new for r in map(dict, gpu_rows)]
    assert any(r["gpu"] == 0 and r["util_gpu_pct"] is None for r in rows)
    assert any(r["gpu"] == 3 and r["lost"] == 1 for r in rows) and rows[-1]["lost"] == 0
    assert any(r["gpu"] == 0 and r["dram_bw_pct"] is None and r["sm_active_pct"] is not None for r in rows)
    assert {r["ecc_corrected"] for r in rows if r["gpu"] == 1} >= {0, 2, 5}
    assert any(r["gpu"] == 1 and r["mem_total_bytes"] is None and r["util_gpu_pct"] is not None for r in rows)
    assert any(r["gpu"] == 4 and r["throttle_reasons"] is not None for r in rows)
    assert {dict(r)["gpu"] for _, links, _ in new for r in links} == {0, 1, 2, 5}
    assert any(dict(p)["sm_util_pct"] == 61 for _, _, procs in new for p in procs)
    assert {e[0] for e in new_events} >= {"gpu.lost", "gpu.recovered", "nvml.missing_function",
                                          "nvml.no_permission"}


def test_a_10hz_tick_runs_six_agent_frames_a_gpu():
    """Issue 29.3, session 9: on a tick that reads only the per-tick metrics (9 in 10 at 10 Hz), each GPU costs
    the agent six Python frames (the GPU's tick, the refresh rule, the readings written out on functions bound
    once, the activity reader, the GPM sample, its rounded answer); the call wrappers, the look-up of GPM's next
    buffer and the per-tick row template copies took 13 before. Counted, not timed: the machine is noisy."""
    clock = ManualClock()
    node = ScriptedNode([FakeGpuSpec(index=i) for i in range(4)])
    s = GpuSampler(lambda: FakeNvml(node, clock=clock), clock=clock, xid_events=False)
    s.open()
    for _ in range(12):  # past the first tick's reads of everything
        clock.advance(0.1)
        s.sample(set())
    agent = ("/gpu/readers.py", "/gpu/gpm.py", "/gpu/calls.py", "/gpu/sampler.py", "/gpu/refresh.py")
    frames: list[str] = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.endswith(agent):
            frames.append(frame.f_code.co_name)

    clock.advance(0.1)
    sys.setprofile(profile)
    try:
        tick = s.sample(set())
    finally:
        sys.setprofile(None)
    s.close()
    assert len(tick.gpu_rows) == 4 and tick.gpu_rows[3]["sm_active_pct"] is not None
    assert tick.gpu_rows[3]["mem_used_bytes"] is not None  # carried from the last once-a-second read
    assert frames[:2] == ["sample", "tick"] and "read_kept" not in frames, frames  # the sampler's, once a tick
    assert (len(frames) - 2) / 4 <= 6, frames
