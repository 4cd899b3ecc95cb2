"""What a fake GPU node looks like from the outside: static facts and the state at a moment.

The fake NVML backend (`fake.py`) turns a `Scenario` into pynvml-shaped answers: it integrates rates into
cumulative counters (energy, NVLink field counters, GPM samples) and raises real `pynvml.NVMLError`s. Scripted
test scenarios and the simulator's coupled node (`lynxtop.agent.sim.gpus`) both implement `Scenario`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class FakeGpuSpec:
    index: int
    name: str = "NVIDIA H200"
    uuid: str = ""
    pci_bus_id: str = ""
    cc: tuple[int, int] = (9, 0)
    mem_total_bytes: int = 143771 * 1024 * 1024
    mem_reserved_bytes: int = 512 * 1024 * 1024
    power_limit_w: float = 700.0
    nvlink_count: int = 18  # 0 = no NVLink (every NVLink call NOT_SUPPORTED, GPM NVLink totals read 0)
    gpm: bool = True  # GPM supported (Hopper and newer)
    nvlink_field_counters: bool = True  # cumulative NVLink throughput field values supported
    # pynvml function names that raise FUNCTION_NOT_FOUND on this GPU (old driver), e.g. {"nvmlGpmSampleGet"}
    missing_functions: frozenset[str] = frozenset()
    # pynvml function names that raise NOT_SUPPORTED on this GPU
    unsupported: frozenset[str] = frozenset()


@dataclass
class FakeGpuState:
    util_gpu_pct: float = 0.0
    util_mem_pct: float = 0.0
    sm_active_pct: float = 0.0
    sm_occupancy_pct: float = 0.0
    tensor_active_pct: float = 0.0
    dram_bw_pct: float = 0.0
    fp16_active_pct: float = 0.0
    fp32_active_pct: float = 0.0
    pcie_tx_bytes_per_s: float = 0.0
    pcie_rx_bytes_per_s: float = 0.0
    # per-link rates in bytes/s; the totals are their sums
    nvlink_tx_bytes_per_s: list[float] = field(default_factory=list)
    nvlink_rx_bytes_per_s: list[float] = field(default_factory=list)
    mem_used_bytes: int = 0
    power_w: float = 75.0
    temp_c: float = 30.0
    sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 2619
    throttle_reasons: int = 0x1  # idle
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    remapped_pending: bool = False
    remapped_failed: bool = False
    processes: list[tuple[int, int]] = field(default_factory=list)  # (host pid, used memory bytes)
    lost: bool = False  # every call on this GPU raises GPU_IS_LOST
    xid_events: list[int] = field(default_factory=list)  # XIDs that fire at this moment (delivered once)


class Scenario(Protocol):
    def driver_version(self) -> str: ...

    def gpus(self) -> list[FakeGpuSpec]: ...

    def state(self, index: int, now: float) -> FakeGpuState:
        """The GPU's state at monotonic time `now` (seconds)."""
        ...
