"""The NVML backend seam and the shape of a simulated GPU node: the only agent module the simulator imports.

`GpuBackend` lists exactly the pynvml functions the sampler, the XID watcher, the GPM reader and the NVLink
counters call, under pynvml's names, as the union of one small protocol per surface (library, device facts,
per-tick readings, slow counters, GPM, events), so the real library (`backend.RealNvml`), the scripted fake
(`fake.FakeNvml`) and the simulator-coupled node are checked against one list (tests/agent/gpu/test_gpu_protocol.py)
instead of failing on a missing name at run time. Constants and structs still come from `pynvml` itself.

A fake node is described by `Scenario`: static facts per GPU (`FakeGpuSpec`) and the state at a moment
(`FakeGpuState`). Scripted test nodes and the simulator's coupled node (`lynxtop.sim.gpus`) implement
it; the fake NVML turns it into pynvml-shaped answers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


class NvmlLibrary(Protocol):
    """The library as a whole: init/shutdown, versions, and the handles of its GPUs."""

    simulated: bool  # True on a fake node: the status says "(simulated)"

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str: ...
    def nvmlSystemGetNVMLVersion(self) -> str: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetIndex(self, handle: Any) -> int: ...


class NvmlDeviceFacts(Protocol):
    """What a GPU is: read once per (re)initialisation, never per tick."""

    def nvmlDeviceGetUUID(self, handle: Any) -> str: ...
    # the serial printed on the board (a vendor's RMA asks for it); NOT_SUPPORTED on boards that keep none
    def nvmlDeviceGetSerial(self, handle: Any) -> str: ...
    def nvmlDeviceGetName(self, handle: Any) -> str: ...
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]: ...
    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int: ...
    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any: ...


class NvmlReadings(Protocol):
    """The cheap per-tick readings: utilisation, memory, power, temperature, clocks, processes, field values."""

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any, *, version: int | None = None) -> Any: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...
    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int: ...
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int: ...
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]: ...
    # per-process SM share: samples newer than `timeStamp` (µs); NOT_FOUND when there are none (normal)
    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[Any]: ...
    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[Any]) -> Any: ...


class NvmlSlowCounters(Protocol):
    """Readings that cost milliseconds on a real H200 (energy) or change rarely: read at the slow cadence."""

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int: ...
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int: ...
    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]: ...


class NvmlGpm(Protocol):
    """GPM (Hopper+): sample buffers and the metrics between two samples."""

    def nvmlGpmSampleAlloc(self) -> Any: ...
    def nvmlGpmSampleFree(self, sample: Any) -> None: ...
    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any: ...
    def nvmlGpmMetricsGet(self, metrics_get: Any) -> Any: ...


class NvmlEvents(Protocol):
    """XID events: an event set the sampler polls once a tick (a wait with no timeout, xid.py)."""

    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None: ...
    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any: ...
    def nvmlEventSetFree(self, event_set: Any) -> None: ...


SURFACES: tuple[type, ...] = (NvmlLibrary, NvmlDeviceFacts, NvmlReadings, NvmlSlowCounters, NvmlGpm, NvmlEvents)


@runtime_checkable
class GpuBackend(NvmlLibrary, NvmlDeviceFacts, NvmlReadings, NvmlSlowCounters, NvmlGpm, NvmlEvents, Protocol):
    """What the GPU sampling code calls on a backend: the union of the surfaces above, nothing else (see the test
    above). Each surface is small and owned by one reader of the sampler and one part of the fake."""


def backend_members() -> frozenset[str]:
    """Every name a backend must answer (the functions and the `simulated` flag), over all the surfaces."""
    names: set[str] = set()
    for surface in SURFACES:
        names |= {n for n in vars(surface) if n.startswith("nvml")}
        names |= set(vars(surface).get("__annotations__", {}))
    return frozenset(names)


# ---------------------------------------------------------------------- a fake node


@dataclass(frozen=True)
class FakeGpuSpec:
    index: int
    name: str = "NVIDIA H200"
    uuid: str = ""
    pci_bus_id: str = ""
    serial: str = ""  # "": the fake's own per index (unsupported={"nvmlDeviceGetSerial"}: a board without one)
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
    temp_c: float = 30.0  # the die at `temp_t`; with `temp_tau_s` > 0 it tends to `temp_target_c` from then on
    temp_t: float = 0.0
    temp_target_c: float = 0.0
    temp_tau_s: float = 0.0  # 0: `temp_c` holds (a scripted state)
    sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 2619
    throttle_reasons: int = 0x1  # idle
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    remapped_pending: bool = False
    remapped_failed: bool = False
    processes: list[tuple[int, int]] = field(default_factory=list)  # (host pid, used memory bytes)
    process_sm_pct: dict[int, float] = field(default_factory=dict)  # host pid -> SM share (no entry: no sample)
    lost: bool = False  # every call on this GPU raises GPU_IS_LOST
    xid_events: list[int] = field(default_factory=list)  # XIDs that fire at this moment (delivered once)

    def temp_at(self, t: float) -> float:
        """The die temperature at monotonic `t`: a thermal lag is a function of time, worked out when read (as
        the fake's counters are), so a die still warming under an unchanged load needs no new state object."""
        if self.temp_tau_s <= 0.0 or t <= self.temp_t:
            return self.temp_c
        return self.temp_target_c + (self.temp_c - self.temp_target_c) * math.exp((self.temp_t - t) / self.temp_tau_s)


class Scenario(Protocol):
    def driver_version(self) -> str: ...

    def gpus(self) -> list[FakeGpuSpec]: ...

    def state(self, index: int, now: float) -> FakeGpuState:
        """The GPU's state at monotonic time `now` (seconds). The fake takes a state object answered again as
        unchanged in its rates (counters, GPM activity): answer a new object when they change.

        A scenario may also answer `unchanged_until(index, now) -> float`: the monotonic time before which
        `state` answers the same object for that GPU (the simulator's model steps every 0.2 s); the fake then
        does not ask again before it. Without it the fake asks at most every `resolution_s`."""
        ...


# state directory (None: the simulator's default) -> the scenario; passed in by whoever composes the agent
ScenarioFactory = Callable[[str | None], Scenario]
