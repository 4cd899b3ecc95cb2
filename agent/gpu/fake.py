"""A simulated NVML: pynvml-shaped answers computed from a `Scenario`, with real `pynvml.NVMLError`s.

Everything a real driver accumulates is accumulated here too, so the sampler's arithmetic is exercised for
real: energy (mJ) and NVLink field counters (KiB, with µs timestamps) integrate the scenario's rates, and a
GPM sample carries its time and the integrals of each activity, so `nvmlGpmMetricsGet` on two samples yields
the average over the interval, as on Hopper. Names say "(simulated)" so no operator mistakes it for hardware.
"""

from __future__ import annotations

import ctypes
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import pynvml

from lynxtop.agent.gpu.protocol import FakeGpuSpec, FakeGpuState, Scenario

MIB = 1024 * 1024
GIB = 1024 * MIB

# GPM metric id -> (FakeGpuState attribute, scale from the state's unit to GPM's unit)
_GPM_SCALAR = {
    pynvml.NVML_GPM_METRIC_SM_UTIL: ("sm_active_pct", 1.0),
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: ("sm_occupancy_pct", 1.0),
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: ("tensor_active_pct", 1.0),
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: ("dram_bw_pct", 1.0),
    pynvml.NVML_GPM_METRIC_FP16_UTIL: ("fp16_active_pct", 1.0),
    pynvml.NVML_GPM_METRIC_FP32_UTIL: ("fp32_active_pct", 1.0),
    pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: ("pcie_tx_bytes_per_s", 1.0 / MIB),
    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: ("pcie_rx_bytes_per_s", 1.0 / MIB),
}
_GPM_NVL_TOTAL_RX = pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC
_GPM_NVL_TOTAL_TX = pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC
_GPM_NVL_FIRST = pynvml.NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC  # then L0 TX, L1 RX, L1 TX, ... L17 TX
_GPM_NVL_LAST = pynvml.NVML_GPM_METRIC_NVLINK_L17_TX_PER_SEC
_SCALAR_POS = {mid: k for k, mid in enumerate(_GPM_SCALAR)}
_N_INTEGRALS = len(_GPM_SCALAR) + 2  # scalars, nvlink total rx, nvlink total tx (per-link kept apart)


_SLOTS: dict[int, dict[int, tuple[int, float]]] = {}


def _slots(links: int) -> dict[int, tuple[int, float]]:
    """GPM metric id -> (index into a record's `flat`, scale), for a GPU with `links` NVLinks; index -1: a link
    the GPU does not have (reads 0). Ids missing here are not supported."""
    table = _SLOTS.get(links)
    if table is None:
        table = {mid: (k, 1.0) for mid, k in _SCALAR_POS.items()}
        table[_GPM_NVL_TOTAL_RX] = (_N_INTEGRALS - 2, 1.0)
        table[_GPM_NVL_TOTAL_TX] = (_N_INTEGRALS - 1, 1.0)
        for mid in range(_GPM_NVL_FIRST, _GPM_NVL_LAST + 1):
            link, is_tx = divmod(mid - _GPM_NVL_FIRST, 2)
            table[mid] = ((_N_INTEGRALS + links * is_tx + link) if link < links else -1, 1.0 / MIB)
        table = _SLOTS.setdefault(links, table)
    return table


def _err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@dataclass
class _GpuAcc:
    """What the fake driver accumulates for one GPU since 'driver load'."""

    last_t: float  # counters are integrated up to here
    last_state: FakeGpuState
    state_t: float  # when last_state was read from the scenario
    energy_mj: float = 0.0
    integrals: list[float] = field(default_factory=lambda: [0.0] * _N_INTEGRALS)
    link_tx: list[float] = field(default_factory=list)  # bytes, per link
    link_rx: list[float] = field(default_factory=list)
    prev_xids: list[int] = field(default_factory=list)


@dataclass
class _Handle:
    index: int

    def __repr__(self) -> str:
        return f"<simulated GPU {self.index}>"


@dataclass
class _GpmRecord:
    gpu: int
    t: float
    flat: tuple[float, ...]  # the integrals, then each link's rx, then each link's tx: what `_slots` indexes
    links: int


class FakeNvml:
    """A simulated NVML library for one node, driven by `scenario` and `clock` (monotonic seconds)."""

    simulated = True

    def __init__(self, scenario: Scenario, clock: Callable[[], float] = time.monotonic,
                 init_error: int | None = None, resolution_s: float = 0.01):
        self.scenario = scenario
        self.clock = clock
        # the scenario is re-read at most this often; integrals stay exact (timestamps are the read times)
        self.resolution_s = resolution_s
        # nvmlInit raises this code while set (e.g. LIBRARY_NOT_FOUND: a machine without a driver)
        self.init_error = init_error
        # every device call raises this code while set (e.g. LIB_RM_VERSION_MISMATCH after a driver upgrade)
        self.fail_all: int | None = None
        # (gpu index, function name) -> error code raised by that call on that GPU (tests' error injection)
        self.errors: dict[tuple[int, str], int] = {}
        self.calls: dict[str, int] = {}  # call counts by function name, for tests
        self.gpu_calls: dict[tuple[int, str], int] = {}  # and by (GPU, function)
        self.initialized = False
        self._refs = 0
        self._lock = threading.RLock()
        self._xid_ready = threading.Condition(self._lock)
        self._specs = list(scenario.gpus())
        self._acc: dict[int, _GpuAcc] = {}
        self._gpm: dict[int, _GpmRecord | None] = {}  # sample buffer address -> record
        self._gpm_buffers: dict[int, Any] = {}
        self._views: dict[int, tuple[Any, list[Any]]] = {}  # id(metrics struct) -> (struct, its entries)
        self._pending_xids: list[tuple[int, int]] = []
        self._event_sets: dict[int, set[int]] = {}

    # ------------------------------------------------------------------ plumbing

    def _spec(self, handle: Any, fn: str) -> FakeGpuSpec:
        self.calls[fn] = self.calls.get(fn, 0) + 1
        key = (handle.index, fn)
        self.gpu_calls[key] = self.gpu_calls.get(key, 0) + 1
        if not self.initialized:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        if self.fail_all is not None:
            raise _err(self.fail_all)
        spec = self._specs[handle.index]
        if fn in spec.missing_functions:
            raise _err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if self._state(handle.index).lost:
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in spec.unsupported:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if self.errors:
            code = self.errors.get((handle.index, fn))
            if code is not None:
                raise _err(code)
        return spec

    def _state(self, index: int, force: bool = False) -> FakeGpuState:
        """The state now, after integrating the rates since the last look (left Riemann sum).

        The scenario is read again once its last look is `resolution_s` old; counters (`force`) always integrate
        up to now, so two GPM samples or field reads never share a timestamp.
        """
        if not force:  # an instantaneous reading of a fresh look: no integration, no lock
            acc = self._acc.get(index)
            if acc is not None and 0.0 < (now := self.clock()) - acc.state_t < self.resolution_s:
                return acc.last_state
        with self._lock:
            now = self.clock()
            acc = self._acc.get(index)
            if acc is None:
                st = self.scenario.state(index, now)
                acc = self._acc[index] = _GpuAcc(last_t=now, last_state=st, state_t=now)
                n = self._specs[index].nvlink_count
                acc.link_tx, acc.link_rx = [0.0] * n, [0.0] * n
                acc.prev_xids = list(st.xid_events)
                self._queue_xids(index, st.xid_events)
                return st
            recent = 0.0 <= now - acc.state_t < self.resolution_s
            if now <= acc.last_t or recent and not force:
                return acc.last_state
            dt = now - acc.last_t
            st = acc.last_state
            acc.energy_mj += st.power_w * 1000.0 * dt
            ints = acc.integrals
            for k, (attr, scale) in enumerate(_GPM_SCALAR.values()):
                ints[k] += getattr(st, attr) * scale * dt
            n = self._specs[index].nvlink_count
            if n:
                tx = (st.nvlink_tx_bytes_per_s + [0.0] * n)[:n]
                rx = (st.nvlink_rx_bytes_per_s + [0.0] * n)[:n]
                acc.link_tx = [a + r * dt for a, r in zip(acc.link_tx, tx, strict=True)]
                acc.link_rx = [a + r * dt for a, r in zip(acc.link_rx, rx, strict=True)]
                ints[-2] += sum(rx) / MIB * dt
                ints[-1] += sum(tx) / MIB * dt
            acc.last_t = now
            if recent:  # counters integrated; the scenario is not read again within its resolution
                return st
            new = self.scenario.state(index, now)
            # XIDs "fire at this moment": deliver each one that was not already pending at the last look
            fresh = list(new.xid_events)
            for x in acc.prev_xids:
                if x in fresh:
                    fresh.remove(x)
            self._queue_xids(index, fresh)
            acc.prev_xids = list(new.xid_events)
            acc.state_t, acc.last_state = now, new
            return new

    def _queue_xids(self, index: int, xids: list[int]) -> None:
        for x in xids:
            self._pending_xids.append((index, x))
        if xids:
            self._xid_ready.notify_all()

    def inject_xid(self, index: int, xid: int) -> None:
        """Test hook: an XID fires on GPU `index` now."""
        with self._lock:
            self._queue_xids(index, [xid])

    # ------------------------------------------------------------------ library

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] = self.calls.get("nvmlInit", 0) + 1
        if self.init_error is not None:
            raise _err(self.init_error)
        self._refs += 1  # reference-counted like the real library: each init needs its own shutdown
        self.initialized = True

    def nvmlShutdown(self) -> None:
        if not self.initialized:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        self._refs -= 1
        self.initialized = self._refs > 0

    def _system(self, fn: str) -> None:
        self.calls[fn] = self.calls.get(fn, 0) + 1
        if not self.initialized:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        if self.fail_all is not None:
            raise _err(self.fail_all)

    def nvmlSystemGetDriverVersion(self) -> str:
        self._system("nvmlSystemGetDriverVersion")
        return self.scenario.driver_version()

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._system("nvmlSystemGetNVMLVersion")
        return "13." + self.scenario.driver_version() + " (simulated)"

    def nvmlDeviceGetCount(self) -> int:
        self._system("nvmlDeviceGetCount")
        return len(self._specs)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._system("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self._specs):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        h = _Handle(index)
        self._spec(h, "nvmlDeviceGetHandleByIndex")
        return h

    def nvmlDeviceGetIndex(self, handle: _Handle) -> int:
        self._system("nvmlDeviceGetIndex")
        return handle.index

    # ------------------------------------------------------------------ static facts

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        name = self._spec(handle, "nvmlDeviceGetName").name
        return name if "simulated" in name.lower() else f"{name} (simulated)"

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        spec = self._spec(handle, "nvmlDeviceGetUUID")
        return spec.uuid or f"GPU-5111a7ed-0000-4000-8000-{spec.index:012x}"

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> Any:
        spec = self._spec(handle, "nvmlDeviceGetPciInfo")
        bus = spec.pci_bus_id or f"00000000:{0x18 + 0x10 * spec.index:02X}:00.0"
        return SimpleNamespace(busId=bus.encode())  # the real struct's field is bytes too

    def nvmlDeviceGetCudaComputeCapability(self, handle: _Handle) -> tuple[int, int]:
        return self._spec(handle, "nvmlDeviceGetCudaComputeCapability").cc

    def nvmlGpmQueryDeviceSupport(self, handle: _Handle) -> Any:
        spec = self._spec(handle, "nvmlGpmQueryDeviceSupport")
        return SimpleNamespace(version=1, isSupportedDevice=int(spec.gpm))

    def nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int) -> int:
        spec = self._spec(handle, "nvmlDeviceGetNvLinkState")
        if link >= spec.nvlink_count:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED if spec.nvlink_count == 0 else
                       pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 1

    # ------------------------------------------------------------------ per tick

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> Any:
        self._spec(handle, "nvmlDeviceGetUtilizationRates")
        st = self._state(handle.index)
        return SimpleNamespace(gpu=round(st.util_gpu_pct), memory=round(st.util_mem_pct))

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> Any:
        spec = self._spec(handle, "nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo")
        st = self._state(handle.index)
        used = st.mem_used_bytes
        if version:
            return SimpleNamespace(version=version, total=spec.mem_total_bytes, reserved=spec.mem_reserved_bytes,
                                   used=used, free=spec.mem_total_bytes - spec.mem_reserved_bytes - used)
        return SimpleNamespace(total=spec.mem_total_bytes, used=used + spec.mem_reserved_bytes,
                               free=spec.mem_total_bytes - spec.mem_reserved_bytes - used)

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        self._spec(handle, "nvmlDeviceGetPowerUsage")
        return int(self._state(handle.index).power_w * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:
        return int(self._spec(handle, "nvmlDeviceGetEnforcedPowerLimit").power_limit_w * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: _Handle) -> int:
        self._spec(handle, "nvmlDeviceGetTotalEnergyConsumption")
        self._state(handle.index, force=True)
        return int(self._acc[handle.index].energy_mj)

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        self._spec(handle, "nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return round(self._state(handle.index).temp_c)

    def nvmlDeviceGetClockInfo(self, handle: _Handle, clock_type: int) -> int:
        self._spec(handle, "nvmlDeviceGetClockInfo")
        st = self._state(handle.index)
        if clock_type == pynvml.NVML_CLOCK_SM:
            return st.sm_clock_mhz
        if clock_type == pynvml.NVML_CLOCK_MEM:
            return st.mem_clock_mhz
        raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        self._spec(handle, "nvmlDeviceGetCurrentClocksEventReasons")
        return self._state(handle.index).throttle_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: _Handle) -> int:
        self._spec(handle, "nvmlDeviceGetCurrentClocksThrottleReasons")
        return self._state(handle.index).throttle_reasons

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, error_type: int, counter_type: int) -> int:
        self._spec(handle, "nvmlDeviceGetTotalEccErrors")
        st = self._state(handle.index)
        if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return st.ecc_corrected
        return st.ecc_uncorrected

    def nvmlDeviceGetRemappedRows(self, handle: _Handle) -> tuple[int, int, int, int]:
        self._spec(handle, "nvmlDeviceGetRemappedRows")
        st = self._state(handle.index)
        return (0, 0, int(st.remapped_pending), int(st.remapped_failed))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[Any]:
        self._spec(handle, "nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
                for pid, mem in self._state(handle.index).processes]

    def nvmlDeviceGetProcessUtilization(self, handle: _Handle, timeStamp: int) -> list[Any]:
        """One sample per process with an SM share, stamped now (µs); NOT_FOUND when none is newer than
        `timeStamp`, as NVML answers for a GPU nobody computed on."""
        self._spec(handle, "nvmlDeviceGetProcessUtilization")
        now_us = int(self.clock() * 1e6)
        shares = self._state(handle.index).process_sm_pct
        if not shares or now_us <= timeStamp:
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return [SimpleNamespace(pid=pid, timeStamp=now_us, smUtil=int(sm), memUtil=0, encUtil=0, decUtil=0)
                for pid, sm in shares.items()]

    def nvmlDeviceGetFieldValues(self, handle: _Handle, field_ids: list[Any]) -> Any:
        spec = self._spec(handle, "nvmlDeviceGetFieldValues")
        self._state(handle.index, force=True)
        acc = self._acc[handle.index]
        ts_us = int(acc.last_t * 1e6)
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for i, fid in enumerate(field_ids):
            fid, scope = fid if isinstance(fid, tuple) else (fid, 0)
            v = values[i]
            v.fieldId, v.scopeId, v.timestamp = fid, scope, ts_us
            v.nvmlReturn = pynvml.NVML_SUCCESS
            if fid == pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT:
                v.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                v.value.uiVal = spec.nvlink_count
            elif fid in (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX):
                if not spec.nvlink_field_counters or scope >= spec.nvlink_count:
                    v.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                    continue
                counter = acc.link_tx if fid == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX else acc.link_rx
                v.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                v.value.ullVal = int(counter[scope] / 1024)  # KiB
            else:
                v.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    # ------------------------------------------------------------------ GPM

    def nvmlGpmSampleAlloc(self) -> Any:
        self._system("nvmlGpmSampleAlloc")
        buf = ctypes.create_string_buffer(8)
        addr = ctypes.addressof(buf)
        with self._lock:
            self._gpm_buffers[addr] = buf  # keeps the address alive and unique
            self._gpm[addr] = None
        return ctypes.cast(buf, pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._system("nvmlGpmSampleFree")
        addr = ctypes.cast(sample, ctypes.c_void_p).value or 0
        with self._lock:
            if addr not in self._gpm:
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            del self._gpm[addr]
            del self._gpm_buffers[addr]

    def nvmlGpmSampleGet(self, handle: _Handle, sample: Any) -> Any:
        spec = self._spec(handle, "nvmlGpmSampleGet")
        if not spec.gpm:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._state(handle.index, force=True)
        acc = self._acc[handle.index]
        addr = ctypes.cast(sample, ctypes.c_void_p).value or 0
        with self._lock:
            if addr not in self._gpm:
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            self._gpm[addr] = _GpmRecord(handle.index, acc.last_t, (*acc.integrals, *acc.link_rx, *acc.link_tx),
                                         len(acc.link_rx))
        return sample

    def nvmlGpmMetricsGet(self, mg: Any) -> Any:
        self._system("nvmlGpmMetricsGet")
        if mg.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise _err(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        a = self._gpm.get(ctypes.cast(mg.sample1, ctypes.c_void_p).value or 0)
        b = self._gpm.get(ctypes.cast(mg.sample2, ctypes.c_void_p).value or 0)
        if a is None or b is None or a.gpu != b.gpu or b.t <= a.t:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        dt = b.t - a.t
        slots = _slots(b.links)
        fa, fb = a.flat, b.flat
        for m in self._metric_views(mg):
            slot = slots.get(m.metricId)
            if slot is None:
                m.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                m.value = 0.0
                continue
            m.nvmlReturn = pynvml.NVML_SUCCESS
            i, scale = slot
            m.value = 0.0 if i < 0 else (fb[i] - fa[i]) * scale / dt
        return mg

    def _metric_views(self, mg: Any) -> list[Any]:
        """The struct's first numMetrics entries as ctypes views, made once per struct (the sampler reuses its
        struct every tick, as with the real library; a view costs as much as the rest of the call)."""
        n = mg.numMetrics
        cached = self._views.get(id(mg))
        if cached is None or cached[0] is not mg or len(cached[1]) != n:
            metrics = mg.metrics
            cached = self._views[id(mg)] = (mg, [metrics[i] for i in range(n)])
        return cached[1]

    # ------------------------------------------------------------------ events

    def nvmlEventSetCreate(self) -> Any:
        self._system("nvmlEventSetCreate")
        es = SimpleNamespace(id=len(self._event_sets) + 1)
        self._event_sets[es.id] = set()
        return es

    def nvmlDeviceRegisterEvents(self, handle: _Handle, event_types: int, event_set: Any) -> None:
        self._spec(handle, "nvmlDeviceRegisterEvents")
        if event_types & pynvml.nvmlEventTypeXidCriticalError:
            self._event_sets[event_set.id].add(handle.index)

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        self._system("nvmlEventSetWait_v2")
        deadline = time.monotonic() + timeout_ms / 1000.0
        watched = self._event_sets[event_set.id]
        while True:
            now = self.clock()
            for i in watched:
                acc = self._acc.get(i)
                if acc is None or now - acc.state_t >= 1.0:
                    self._state(i)  # nobody looked for a while: advance the scenario, which may fire XIDs
            with self._xid_ready:
                for k, (gpu, xid) in enumerate(self._pending_xids):
                    if gpu in watched:
                        del self._pending_xids[k]
                        return SimpleNamespace(device=_Handle(gpu), eventType=pynvml.nvmlEventTypeXidCriticalError,
                                               eventData=xid, gpuInstanceId=0xFFFFFFFF,
                                               computeInstanceId=0xFFFFFFFF)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _err(pynvml.NVML_ERROR_TIMEOUT)
                # injected XIDs and those the sampler's looks fire wake this at once; otherwise the
                # scenario is looked at once a second at most (a real wait sleeps in the driver)
                self._xid_ready.wait(min(left, 1.0))

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._system("nvmlEventSetFree")
        self._event_sets.pop(event_set.id, None)


# ---------------------------------------------------------------------- scripted scenarios


def _wave(t: float, period: float, phase: float) -> float:
    """0..1, smooth, so the demo's charts move without looking random."""
    return 0.5 + 0.5 * math.sin(2 * math.pi * (t / period + phase))


class ScriptedNode:
    """A serving node under a steady, slowly breathing load; time is seconds since the first look.

    `events` maps elapsed seconds -> (gpu, change) for scripted incidents: "lost", or an XID number.
    `processes` maps a GPU index to (pid, bytes) pairs, so tests can put real pids on a GPU; `process_sm` maps a
    GPU index to {pid: SM share %} (NVML's process utilisation).
    """

    def __init__(self, specs: list[FakeGpuSpec], driver: str = "580.159.04",
                 lost: dict[int, float] | None = None, xids: list[tuple[float, int, int]] | None = None,
                 processes: dict[int, list[tuple[int, int]]] | None = None, load: float = 1.0,
                 process_sm: dict[int, dict[int, float]] | None = None):
        self._specs = specs
        self._driver = driver
        self.lost = dict(lost or {})  # gpu -> elapsed seconds after which it is lost
        self.xids = list(xids or [])  # (elapsed seconds, gpu, xid): fires for 1 s
        self.processes = dict(processes or {})
        self.process_sm = dict(process_sm or {})
        self.load = load  # 0 = idle node, 1 = busy serving
        self.start: float | None = None

    def driver_version(self) -> str:
        return self._driver

    def gpus(self) -> list[FakeGpuSpec]:
        return list(self._specs)

    def state(self, index: int, now: float) -> FakeGpuState:
        if self.start is None:
            self.start = now
        t = now - self.start
        spec = self._specs[index]
        busy = self.load * (0.55 + 0.4 * _wave(t, 40.0, index * 0.02))
        decode = _wave(t, 7.0, 0.1)  # 1 = decode-heavy (memory bound), 0 = prefill-heavy (tensor bound)
        hopper = spec.cc[0] >= 9
        link_rate = self.load * (12e9 + 8e9 * _wave(t, 5.0, 0.3)) / max(spec.nvlink_count, 1)
        sm = 100 * busy
        st = FakeGpuState(
            util_gpu_pct=min(100.0, 100 * busy + 35) if self.load else 0.0,
            util_mem_pct=60 * busy * decode,
            sm_active_pct=sm,
            sm_occupancy_pct=sm * (0.2 + 0.5 * decode),
            tensor_active_pct=sm * (0.9 - 0.6 * decode),
            dram_bw_pct=sm * (0.2 + 0.7 * decode),
            fp16_active_pct=sm * 0.05,
            fp32_active_pct=sm * 0.08,
            pcie_tx_bytes_per_s=self.load * 2e8,
            pcie_rx_bytes_per_s=self.load * 6e8,
            nvlink_tx_bytes_per_s=[link_rate] * spec.nvlink_count,
            nvlink_rx_bytes_per_s=[link_rate * 0.98] * spec.nvlink_count,
            mem_used_bytes=int(spec.mem_total_bytes * (0.9 if self.load else 0.0)),
            power_w=(90 + (spec.power_limit_w - 140) * busy) if self.load else 85.0,
            temp_c=32 + 40 * busy,
            sm_clock_mhz=1980 if hopper else 1410,
            mem_clock_mhz=3201 if hopper else 1593,
            throttle_reasons=0x4 if busy > 0.9 else (0x0 if self.load else 0x1),
            processes=list(self.processes.get(index, [])),
            process_sm_pct=dict(self.process_sm.get(index, {})),
        )
        lost_after = self.lost.get(index)
        if lost_after is not None and t >= lost_after:
            st = replace(st, lost=True)
        st.xid_events = [x for (at, gpu, x) in self.xids if gpu == index and at <= t < at + 1.0]
        return st


def h200_specs(n: int = 8, **overrides: Any) -> list[FakeGpuSpec]:
    return [FakeGpuSpec(index=i, name="NVIDIA H200", **overrides) for i in range(n)]


def a100_specs(n: int = 8, **overrides: Any) -> list[FakeGpuSpec]:
    base = dict(name="NVIDIA A100-SXM4-80GB", cc=(8, 0), mem_total_bytes=81920 * MIB, power_limit_w=400.0,
                nvlink_count=12, gpm=False, nvlink_field_counters=True)
    base.update(overrides)
    return [FakeGpuSpec(index=i, **base) for i in range(n)]


def b200_specs(n: int = 8, **overrides: Any) -> list[FakeGpuSpec]:
    """HGX B200: Blackwell (SM100), 183,359 MiB as NVML reports it (~179 GiB of the 192 GB HBM3e), NVLink 5."""
    base = dict(name="NVIDIA B200", cc=(10, 0), mem_total_bytes=183359 * MIB, power_limit_w=1000.0,
                nvlink_count=18, gpm=True, nvlink_field_counters=True)
    base.update(overrides)
    return [FakeGpuSpec(index=i, **base) for i in range(n)]


# an old driver: no GPM, no v2 memory info, no clock-event names (only the older throttle-reason call)
MISSING_FUNCTIONS = frozenset({"nvmlGpmQueryDeviceSupport", "nvmlGpmSampleGet", "nvmlDeviceGetMemoryInfo_v2",
                               "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetRemappedRows"})


def scripted_scenario(name: str, **kwargs: Any) -> ScriptedNode:
    """The named scripted node (see `FAKE_SCENARIOS` in backend.py); kwargs go to `ScriptedNode`."""
    if name == "h200x8":
        return ScriptedNode(h200_specs(), **kwargs)
    if name == "a100x8":
        return ScriptedNode(a100_specs(), driver="535.183.01", **kwargs)
    if name == "b200x8":
        return ScriptedNode(b200_specs(), driver="570.133.20", **kwargs)
    if name == "lost":
        kwargs.setdefault("lost", {3: 30.0})
        kwargs.setdefault("xids", [(29.0, 3, 79)])  # "fallen off the bus" comes first, as on real nodes
        return ScriptedNode(h200_specs(), **kwargs)
    if name == "missing":
        return ScriptedNode(h200_specs(missing_functions=MISSING_FUNCTIONS,
                                       unsupported=frozenset({"nvmlDeviceGetTotalEnergyConsumption"})),
                            driver="470.256.02", **kwargs)
    if name == "xid":
        kwargs.setdefault("xids", [(5.0, 1, 31), (10.0, 2, 48), (15.0, 0, 94)])
        return ScriptedNode(h200_specs(), **kwargs)
    raise ValueError(f"unknown fake NVML scenario {name!r} (known: h200x8, a100x8, b200x8, lost, missing, xid, sim)")
