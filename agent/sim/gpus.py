"""Simulated GPUs coupled to the simulated vLLM server: a `Scenario` read from the engines' state files.

With no simulated server running this is an idle 8×H200 node. Each live EngineCore (see state.py) adds its
memory on the GPUs it uses and drives their activity: prefill is tensor-core heavy, decode DRAM-bandwidth
heavy, both push NVLink all-reduce traffic; power follows activity and temperature follows power with a
thermal lag. Memory disappears only when the processes that hold it are gone, as with a real driver.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from lynxtop.agent.gpu.protocol import FakeGpuSpec, FakeGpuState
from lynxtop.agent.sim.flags import default_state_dir
from lynxtop.agent.sim.model import SimParams
from lynxtop.agent.sim.state import EngineState, read_states

DRIVER_VERSION = "580.95.05"
REREAD_S = 0.2  # the state directory is listed at most this often (8 GPUs ask once per tick each)
STALE_S = 3.0  # an engine that has not published for this long is treated as doing nothing
IDLE_SM_CLOCK_MHZ = 345
BUSY_SM_CLOCK_MHZ = 1980
MEM_CLOCK_MHZ = 3201


@dataclass
class _Thermal:
    last: float
    temp_c: float


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
        self._thermal: dict[int, _Thermal] = {}

    def driver_version(self) -> str:
        return DRIVER_VERSION

    def gpus(self) -> list[FakeGpuSpec]:
        return list(self._specs)

    def engines(self, now: float) -> list[EngineState]:
        with self._lock:
            if self._read_at is None or now - self._read_at >= REREAD_S or now < self._read_at:
                self._states = read_states(self.state_dir)
                self._read_at = now
            return self._states

    def state(self, index: int, now: float) -> FakeGpuState:
        spec = self._specs[index]
        wall = time.time()
        mem = 0
        procs: list[tuple[int, int]] = []
        sm = tensor = dram = busy = 0.0
        link_rate = 0.0
        pcie_rx = 0.0
        hung = False
        for eng in self.engines(now):
            if index not in eng.gpus:
                continue
            for h in eng.holders:
                if h.gpu == index:
                    mem += h.mem_bytes
                    procs.append((h.pid, h.mem_bytes))
            fresh = wall - eng.updated_unix < STALE_S
            if not fresh or eng.phase in ("orphaned", "dead"):
                continue
            if eng.phase == "hung":
                hung = True  # NCCL spin: the GPU looks 100 % "utilized" while nothing progresses
                continue
            if eng.phase == "loading weights":
                pcie_rx += 4.5e9  # weights streaming in from host memory
                sm += 3.0
                busy += 0.05
                continue
            if eng.phase in ("kv cache", "cuda graphs"):
                sm += 45.0
                tensor += 30.0
                dram += 25.0
                busy += 0.6
                continue
            fill = min(eng.mean_batch / 16.0, 1.0)
            pf, df = eng.prefill_frac, eng.decode_frac
            sm += 100 * (0.95 * pf + (0.35 + 0.35 * fill) * df)
            tensor += 100 * (0.85 * pf + (0.08 + 0.27 * fill) * df)
            dram += 100 * (0.30 * pf + (0.70 + 0.15 * fill) * df)
            busy += eng.busy_frac
            link_rate += (eng.prompt_tokens_per_s + eng.generation_tokens_per_s) * self.p.nvlink_bytes_per_token
        sm, tensor, dram, busy = min(sm, 100.0), min(tensor, 100.0), min(dram, 100.0), min(busy, 1.0)
        util_gpu = 100.0 if hung else 100.0 * busy
        if hung:
            sm, dram = max(sm, 8.0), max(dram, 2.0)
        activity = min(0.6 * sm / 100 + 0.25 * tensor / 100 + 0.15 * dram / 100, 1.0)
        power = self.p.idle_power_w + (self.p.max_power_w - self.p.idle_power_w) * activity
        if mem:
            power += 25.0  # resident contexts keep clocks and memory awake
        if hung:
            power += 110.0
        power = min(power, spec.power_limit_w)
        temp = self._temperature(index, now, power)
        links = spec.nvlink_count
        per_link = link_rate / links if links else 0.0
        active = util_gpu > 0 or mem > 0
        throttle = 0x1 if not active else (0x4 if power >= 0.97 * spec.power_limit_w else 0x0)
        return FakeGpuState(
            util_gpu_pct=util_gpu, util_mem_pct=dram * 0.8, sm_active_pct=sm, sm_occupancy_pct=sm * 0.45,
            tensor_active_pct=tensor, dram_bw_pct=dram, fp16_active_pct=tensor * 0.08, fp32_active_pct=sm * 0.06,
            pcie_tx_bytes_per_s=2e7 + (1.5e8 if busy else 0.0), pcie_rx_bytes_per_s=3e7 + pcie_rx,
            nvlink_tx_bytes_per_s=[per_link] * links, nvlink_rx_bytes_per_s=[per_link * 0.99] * links,
            mem_used_bytes=min(mem, spec.mem_total_bytes), power_w=power, temp_c=temp,
            sm_clock_mhz=BUSY_SM_CLOCK_MHZ if active else IDLE_SM_CLOCK_MHZ, mem_clock_mhz=MEM_CLOCK_MHZ,
            throttle_reasons=throttle, processes=procs,
        )

    def _temperature(self, index: int, now: float, power_w: float) -> float:
        target = self.p.ambient_temp_c + self.p.temp_c_per_w * power_w
        with self._lock:
            th = self._thermal.get(index)
            if th is None:
                th = self._thermal[index] = _Thermal(last=now, temp_c=target)
            dt = max(now - th.last, 0.0)
            tau = max(self.p.temp_time_constant_s, 1e-3)
            th.temp_c += (target - th.temp_c) * (1 - math.exp(-dt / tau))
            th.last = now
            return th.temp_c
