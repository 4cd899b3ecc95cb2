"""Simulated GPUs coupled to the simulated vLLM server: a `Scenario` read from the engines' state files.

With no simulated server running this is an idle 8×H200 node. Each live EngineCore (see state.py) adds its
memory on the GPUs it uses and drives their activity: prefill is tensor-core heavy, decode DRAM-bandwidth
heavy, both push NVLink all-reduce traffic; power follows activity and temperature follows power with a
thermal lag. Memory disappears only when the processes that hold it are gone, as with a real driver.

No two GPUs read alike (a fixed spread per GPU index, see `gpu_spread`), and an engine started with
`--sim-fail straggler=K` has one slow GPU: hot, clock held down (SW thermal slowdown), while the rest of its
group waits for it in the all-reduce with lower SM activity; that is what an operator hunting a straggler sees.

This module imports nothing from the agent but the backend protocol (`lynxtop.agent.gpu.protocol`).
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from lynxtop.agent.gpu.protocol import FakeGpuSpec, FakeGpuState
from lynxtop.sim.flags import default_state_dir
from lynxtop.sim.model import SimParams
from lynxtop.sim.state import EngineState, PidWatch, StateCache, StateFiles, read_states

DRIVER_VERSION = "580.95.05"
REREAD_S = 0.2  # the state directory is listed at most this often: the GPU model's time step
STALE_S = 3.0  # an engine that has not published for this long is treated as doing nothing
IDLE_SM_CLOCK_MHZ = 345
BUSY_SM_CLOCK_MHZ = 1980
MEM_CLOCK_MHZ = 3201


@dataclass
class _Load:
    """What the engines on one GPU add up to at one look."""

    mem: int = 0
    procs: list[tuple[int, int]] = field(default_factory=list)
    sm: float = 0.0
    tensor: float = 0.0
    dram: float = 0.0
    busy: float = 0.0
    link_rate: float = 0.0
    pcie_rx: float = 0.0
    hung: bool = False
    straggler: bool = False  # this GPU is the slow one of its group
    slowdown: float = 1.0


def gpu_spread(index: int, p: SimParams) -> tuple[float, float, float]:
    """(activity factor, power factor, temperature offset °C) of GPU `index`: fixed per index, never random
    between runs, so a TP group never reads alike to the digit (as on a real board) and tests stay exact."""
    rng = random.Random(0x5111A0 + index)
    return (1.0 + p.gpu_spread * rng.uniform(-1, 1), 1.0 + p.gpu_spread * rng.uniform(-1, 1),
            p.gpu_temp_spread_c * rng.uniform(-1, 1))


def _sm_clock(active: bool, slowdown: float) -> int:
    return round(BUSY_SM_CLOCK_MHZ / slowdown) if active else IDLE_SM_CLOCK_MHZ


def _clock_reasons(active: bool, hot: bool, at_power_cap: bool) -> int:
    """NVML's clock-event reasons: idle, SW power cap, SW thermal slowdown."""
    if not active:
        return 0x1
    return (0x4 if at_power_cap else 0x0) | (0x20 if hot else 0x0)


def sim_gpu_specs(n: int = 8) -> list[FakeGpuSpec]:
    return [FakeGpuSpec(index=i, name="NVIDIA H200", uuid=f"GPU-51m0000{i}-c0de-4a11-8b0b-00000000000{i}",
                        pci_bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0") for i in range(n)]


class SimScenario:
    """`Scenario` of a simulated node; `state_dir` defaults to $LYNXTOP_SIM_STATE_DIR (see flags.py)."""

    def __init__(self, state_dir: str | os.PathLike | None = None, gpus: int = 8, params: SimParams | None = None):
        self.state_dir = Path(state_dir) if state_dir else default_state_dir()
        self.p = params or SimParams()
        self._specs = sim_gpu_specs(gpus)
        self._lock = threading.Lock()
        self._states: list[EngineState] = []
        self._read_at: float | None = None
        self._parsed: StateCache = {}  # state files parsed, liveness verdicts (read_states reuses them)
        self._watch = PidWatch()  # the holders' pidfds: their liveness without reading /proc each second
        self._files = StateFiles()  # the state files kept open: a publish is one pread (written in place)
        self._loads: list[_Load] = []
        self._looks: dict[int, FakeGpuState] = {}  # GPU -> its state in the current step
        self._built: dict[int, FakeGpuState] = {}  # GPU -> its last state built (its die's thermal course)
        self._tau = max(self.p.temp_time_constant_s, 1e-3)
        self._spread = [gpu_spread(i, self.p) for i in range(gpus)]

    def driver_version(self) -> str:
        return DRIVER_VERSION

    def gpus(self) -> list[FakeGpuSpec]:
        return list(self._specs)

    def engines(self, now: float) -> list[EngineState]:
        with self._lock:
            self._step(now)
            return self._states

    def _step(self, now: float) -> list[_Load]:
        """Every GPU's load for the model's time step holding `now` (the lock is held).

        The engines publish their state twice a second, so the model steps when the state directory is read
        again (REREAD_S): one pass over the engines gives all GPUs' loads, and each GPU's state is then
        built once per step (`_looks`), however many NVML calls ask for it. A GPU whose load is what it was
        keeps its state object, its die still warming or cooling included (the state carries the thermal
        course, `FakeGpuState.temp_at`): the fake NVML then keeps its counters' segment too."""
        back = self._read_at is not None and now < self._read_at  # a clock gone back: every GPU is built again
        if self._read_at is None or now >= self._read_at + REREAD_S or back:  # (`unchanged_until`'s sum)
            self._states = read_states(self.state_dir, self._parsed, now, watch=self._watch,
                                       files=self._files)
            self._read_at = now
            loads, old = self._all_loads(self._states), self._loads
            self._looks = {} if back or len(old) != len(loads) else {
                i: st for i, st in self._looks.items() if loads[i] == old[i]}
            self._loads = loads
        return self._loads

    def unchanged_until(self, index: int, now: float) -> float:
        """Before this monotonic time `state(index, ...)` answers what it answered at `now`: the next step."""
        with self._lock:
            at = self._read_at
        return now if at is None or now < at else at + REREAD_S

    def state(self, index: int, now: float) -> FakeGpuState:
        with self._lock:
            ld = self._step(now)[index]
            st = self._looks.get(index)
            if st is None:
                st = self._looks[index] = self._build(index, now, ld)
            return st

    def _build(self, index: int, now: float, ld: _Load) -> FakeGpuState:
        spec = self._specs[index]
        act, power_f, temp_off = self._spread[index]
        sm, tensor, dram = min(ld.sm * act, 100.0), min(ld.tensor * act, 100.0), min(ld.dram * act, 100.0)
        busy = min(ld.busy, 1.0)
        util_gpu = 100.0 if ld.hung else 100.0 * busy
        if ld.hung:
            sm, dram = max(sm, 8.0), max(dram, 2.0)
        activity = min(0.6 * sm / 100 + 0.25 * tensor / 100 + 0.15 * dram / 100, 1.0)
        power = (self.p.idle_power_w + (self.p.max_power_w - self.p.idle_power_w) * activity) * power_f
        if ld.mem:
            power += 25.0  # resident contexts keep clocks and memory awake
        if ld.hung:
            power += 110.0
        power = min(power, spec.power_limit_w)
        active = util_gpu > 0 or ld.mem > 0
        hot = ld.straggler and active  # the straggler: a thermally throttled GPU, its clock held down
        target = self.p.ambient_temp_c + temp_off + (self.p.straggler_temp_rise_c if hot else 0.0) + (
            self.p.temp_c_per_w * power)
        last = self._built.get(index)  # the die's course so far: where it is now, tending to the new power's
        temp = target if last is None else last.temp_at(now)
        links = spec.nvlink_count
        per_link = ld.link_rate / links if links else 0.0
        st = self._built[index] = FakeGpuState(
            util_gpu_pct=util_gpu, util_mem_pct=dram * 0.8, sm_active_pct=sm, sm_occupancy_pct=sm * 0.45,
            tensor_active_pct=tensor, dram_bw_pct=dram, fp16_active_pct=tensor * 0.08, fp32_active_pct=sm * 0.06,
            pcie_tx_bytes_per_s=2e7 + (1.5e8 if busy else 0.0), pcie_rx_bytes_per_s=3e7 + ld.pcie_rx,
            nvlink_tx_bytes_per_s=[per_link] * links, nvlink_rx_bytes_per_s=[per_link * 0.99] * links,
            mem_used_bytes=min(ld.mem, spec.mem_total_bytes), power_w=power, temp_c=temp, temp_t=now,
            temp_target_c=target, temp_tau_s=self._tau,
            sm_clock_mhz=_sm_clock(active, ld.slowdown if hot else 1.0), mem_clock_mhz=MEM_CLOCK_MHZ,
            throttle_reasons=_clock_reasons(active, hot, power >= 0.97 * spec.power_limit_w), processes=ld.procs,
            # NVML's per-process SM share: the GPU's SM activity split over its holders; none while idle (no sample)
            process_sm_pct={pid: sm / len(ld.procs) for pid, _ in ld.procs} if sm > 0 and ld.procs else {},
        )
        return st

    def _all_loads(self, engines: list[EngineState]) -> list[_Load]:
        """What the live engines put on each GPU: memory, processes and the activity of their phases."""
        loads = [_Load() for _ in self._specs]
        wall = time.time()
        n = len(loads)
        for eng in engines:
            for h in eng.holders:
                if 0 <= h.gpu < n and h.gpu in eng.gpus:
                    ld = loads[h.gpu]
                    ld.mem += h.mem_bytes
                    ld.procs.append((h.pid, h.mem_bytes))
            if wall - eng.updated_unix < STALE_S and eng.phase not in ("orphaned", "dead"):
                for index in set(eng.gpus):
                    if 0 <= index < n:
                        self._add_activity(loads[index], eng, index)
        return loads

    def _add_activity(self, ld: _Load, eng: EngineState, index: int) -> None:
        if eng.phase == "hung":
            ld.hung = True  # NCCL spin: the GPU looks 100 % "utilized" while nothing progresses
            return
        if eng.phase == "loading weights":
            ld.pcie_rx += 4.5e9  # weights streaming in from host memory
            ld.sm += 3.0
            ld.busy += 0.05
            return
        if eng.phase in ("kv cache", "cuda graphs"):
            ld.sm += 45.0
            ld.tensor += 30.0
            ld.dram += 25.0
            ld.busy += 0.6
            return
        # the group steps at its straggler's pace: the others finish early and wait in the all-reduce
        wait = 1.0
        if eng.straggler_gpu is not None:
            ld.straggler = ld.straggler or eng.straggler_gpu == index
            ld.slowdown = max(ld.slowdown, eng.straggler_slowdown)
            wait = 1.0 if eng.straggler_gpu == index else 1.0 / max(eng.straggler_slowdown, 1.0)
        fill = min(eng.mean_batch / 16.0, 1.0)
        pf, df = eng.prefill_frac, eng.decode_frac
        ld.sm += wait * 100 * (0.95 * pf + (0.35 + 0.35 * fill) * df)
        ld.tensor += wait * 100 * (0.85 * pf + (0.08 + 0.27 * fill) * df)
        ld.dram += wait * 100 * (0.30 * pf + (0.70 + 0.15 * fill) * df)
        ld.busy += eng.busy_frac
        ld.link_rate += (eng.prompt_tokens_per_s + eng.generation_tokens_per_s) * self.p.nvlink_bytes_per_token
