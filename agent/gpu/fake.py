"""A simulated NVML: pynvml-shaped answers computed from a `Scenario`, with real `pynvml.NVMLError`s.

`FakeNvml` is composed the way `GpuBackend` is (protocol.py): one small class per surface, each answering
that surface's calls from the driver core (fake_driver.py). Everything a real driver accumulates is accumulated
there too, so the sampler's arithmetic is exercised for real: energy (mJ) and NVLink field counters (KiB, with
µs timestamps) integrate the scenario's rates, and a GPM sample carries its time and the integrals of each
activity, so `nvmlGpmMetricsGet` on two samples yields the average over the interval, as on Hopper. Names say
"(simulated)" so no operator mistakes it for hardware. The scripted scenarios live in scripted.py.
"""

from __future__ import annotations

import ctypes
import struct
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pynvml

from lynxtop.agent.gpu.fake_driver import GPM_SCALAR, MIB, N_INTEGRALS, FakeDriver, Handle, Segment, err
from lynxtop.agent.gpu.scripted import (
    MISSING_FUNCTIONS,
    ScriptedNode,
    a100_specs,
    b200_specs,
    h200_specs,
    scripted_scenario,
)

__all__ = ["FakeNvml", "MISSING_FUNCTIONS", "ScriptedNode", "a100_specs", "b200_specs", "h200_specs",
           "scripted_scenario", "GIB", "MIB"]

GIB = 1024 * MIB


class FakeLibrary(FakeDriver):
    """nvmlInit/nvmlShutdown (reference-counted like the real library), versions, count and handles."""

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] = self.calls.get("nvmlInit", 0) + 1
        if self.init_error is not None:
            raise err(self.init_error)
        self._refs += 1  # each init needs its own shutdown
        self.initialized = True

    def nvmlShutdown(self) -> None:
        if not self.initialized:
            raise err(pynvml.NVML_ERROR_UNINITIALIZED)
        self._refs -= 1
        self.initialized = self._refs > 0

    def nvmlSystemGetDriverVersion(self) -> str:
        self._system("nvmlSystemGetDriverVersion")
        return self.scenario.driver_version()

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._system("nvmlSystemGetNVMLVersion")
        return "13." + self.scenario.driver_version() + " (simulated)"

    def nvmlDeviceGetCount(self) -> int:
        self._system("nvmlDeviceGetCount")
        return len(self._specs)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._system("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self._specs):
            raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        h = Handle(index)
        self._check(h, "nvmlDeviceGetHandleByIndex")
        return h

    def nvmlDeviceGetIndex(self, handle: Handle) -> int:
        self._system("nvmlDeviceGetIndex")
        return handle.index


class FakeDeviceFacts(FakeDriver):
    """Static facts straight from the GPU's `FakeGpuSpec`; no state is integrated for them."""

    def nvmlDeviceGetName(self, handle: Handle) -> str:
        name = self._answer(handle, "nvmlDeviceGetName")[0].name
        return name if "simulated" in name.lower() else f"{name} (simulated)"

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:
        spec = self._answer(handle, "nvmlDeviceGetUUID")[0]
        return spec.uuid or f"GPU-5111a7ed-0000-4000-8000-{spec.index:012x}"

    def nvmlDeviceGetSerial(self, handle: Handle) -> str:
        spec = self._answer(handle, "nvmlDeviceGetSerial")[0]
        return spec.serial or f"132{spec.index:010d}"  # 13 digits, as an H100's or H200's

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> Any:
        spec = self._answer(handle, "nvmlDeviceGetPciInfo")[0]
        bus = spec.pci_bus_id or f"00000000:{0x18 + 0x10 * spec.index:02X}:00.0"
        return SimpleNamespace(busId=bus.encode())  # the real struct's field is bytes too

    def nvmlDeviceGetCudaComputeCapability(self, handle: Handle) -> tuple[int, int]:
        return self._answer(handle, "nvmlDeviceGetCudaComputeCapability")[0].cc

    def nvmlGpmQueryDeviceSupport(self, handle: Handle) -> Any:
        spec = self._answer(handle, "nvmlGpmQueryDeviceSupport")[0]
        return SimpleNamespace(version=1, isSupportedDevice=int(spec.gpm))

    def nvmlDeviceGetNvLinkState(self, handle: Handle, link: int) -> int:
        spec = self._answer(handle, "nvmlDeviceGetNvLinkState")[0]
        if link >= spec.nvlink_count:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED if spec.nvlink_count == 0 else
                      pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 1


class FakeReadings(FakeDriver):
    """The per-tick readings, each from one look at the state (`_check`)."""

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> Any:
        st = self._check(handle, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=round(st.util_gpu_pct), memory=round(st.util_mem_pct))

    def nvmlDeviceGetMemoryInfo(self, handle: Handle, version: int | None = None) -> Any:
        spec, st = self._answer(handle, "nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo")
        used = st.mem_used_bytes
        if version:
            return SimpleNamespace(version=version, total=spec.mem_total_bytes, reserved=spec.mem_reserved_bytes,
                                   used=used, free=spec.mem_total_bytes - spec.mem_reserved_bytes - used)
        return SimpleNamespace(total=spec.mem_total_bytes, used=used + spec.mem_reserved_bytes,
                               free=spec.mem_total_bytes - spec.mem_reserved_bytes - used)

    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int:
        return int(self._check(handle, "nvmlDeviceGetPowerUsage").power_w * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Handle) -> int:
        return int(self._answer(handle, "nvmlDeviceGetEnforcedPowerLimit")[0].power_limit_w * 1000)

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:
        st = self._check(handle, "nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return round(st.temp_at(self.clock()))  # a die warming under a steady load: its course, read now

    def nvmlDeviceGetClockInfo(self, handle: Handle, clock_type: int) -> int:
        st = self._check(handle, "nvmlDeviceGetClockInfo")
        if clock_type == pynvml.NVML_CLOCK_SM:
            return st.sm_clock_mhz
        if clock_type == pynvml.NVML_CLOCK_MEM:
            return st.mem_clock_mhz
        raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Handle) -> int:
        return self._check(handle, "nvmlDeviceGetCurrentClocksEventReasons").throttle_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Handle) -> int:
        return self._check(handle, "nvmlDeviceGetCurrentClocksThrottleReasons").throttle_reasons

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[Any]:
        st = self._check(handle, "nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
                for pid, mem in st.processes]

    def nvmlDeviceGetProcessUtilization(self, handle: Handle, timeStamp: int) -> list[Any]:
        """One sample per process with an SM share, stamped now (µs); NOT_FOUND when none is newer than
        `timeStamp`, as NVML answers for a GPU nobody computed on."""
        shares = self._check(handle, "nvmlDeviceGetProcessUtilization").process_sm_pct
        now_us = int(self.clock() * 1e6)
        if not shares or now_us <= timeStamp:
            raise err(pynvml.NVML_ERROR_NOT_FOUND)
        return [SimpleNamespace(pid=pid, timeStamp=now_us, smUtil=int(sm), memUtil=0, encUtil=0, decUtil=0)
                for pid, sm in shares.items()]

    def nvmlDeviceGetFieldValues(self, handle: Handle, field_ids: list[Any]) -> Any:
        spec = self._answer(handle, "nvmlDeviceGetFieldValues")[0]
        t, seg = self._counters(handle.index)
        ts_us = int(t * 1e6)
        n = spec.nvlink_count
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
                first = N_INTEGRALS + (n if fid == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX else 0)
                v.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                v.value.ullVal = int(seg.value(first + scope, t) / 1024)  # KiB
            else:
                v.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values


class FakeSlowCounters(FakeDriver):
    """Energy integrates the power; ECC counts and remapped rows come from the state."""

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Handle) -> int:
        self._check(handle, "nvmlDeviceGetTotalEnergyConsumption")
        t, seg = self._counters(handle.index)
        return int(seg.energy(t))

    def nvmlDeviceGetTotalEccErrors(self, handle: Handle, error_type: int, counter_type: int) -> int:
        st = self._check(handle, "nvmlDeviceGetTotalEccErrors")
        if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return st.ecc_corrected
        return st.ecc_uncorrected

    def nvmlDeviceGetRemappedRows(self, handle: Handle) -> tuple[int, int, int, int]:
        st = self._check(handle, "nvmlDeviceGetRemappedRows")
        return (0, 0, int(st.remapped_pending), int(st.remapped_failed))


# ---------------------------------------------------------------------- GPM

_GPM_NVL_TOTAL_RX = pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC
_GPM_NVL_TOTAL_TX = pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC
_GPM_NVL_FIRST = pynvml.NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC  # then L0 TX, L1 RX, L1 TX, ... L17 TX
_GPM_NVL_LAST = pynvml.NVML_GPM_METRIC_NVLINK_L17_TX_PER_SEC
_SLOTS: dict[int, dict[int, tuple[int, float]]] = {}
# one c_nvmlGpmMetric_t: metricId, nvmlReturn, value, then three name pointers (left NULL here)
_METRIC = struct.Struct("<IId24x")
# a sample pointer's address read straight from its memory (~0.4 µs; ctypes.cast builds a pointer, ~4 µs)
_ADDRESS = struct.Struct("@P").unpack_from


def _pair_reader(mg_type: Any) -> Any:
    """Reads a metrics struct's sample1 and sample2 addresses in one call."""
    first, second = mg_type.sample1.offset, mg_type.sample2.offset
    assert second == first + ctypes.sizeof(ctypes.c_void_p)
    return struct.Struct(f"@{first}xPP").unpack_from


def _slots(links: int) -> dict[int, tuple[int, float]]:
    """GPM metric id -> (index into a record's counters, `Segment.at`, scale), for a GPU with `links` NVLinks;
    index -1: a link the GPU does not have (reads 0). Ids missing here are not supported."""
    table = _SLOTS.get(links)
    if table is None:
        table = {mid: (k, 1.0) for k, mid in enumerate(GPM_SCALAR)}
        table[_GPM_NVL_TOTAL_RX] = (N_INTEGRALS - 2, 1.0)
        table[_GPM_NVL_TOTAL_TX] = (N_INTEGRALS - 1, 1.0)
        for mid in range(_GPM_NVL_FIRST, _GPM_NVL_LAST + 1):
            link, is_tx = divmod(mid - _GPM_NVL_FIRST, 2)
            table[mid] = ((N_INTEGRALS + links * is_tx + link) if link < links else -1, 1.0 / MIB)
        table = _SLOTS.setdefault(links, table)
    return table


@dataclass
class _GpmRecord:
    gpu: int
    t: float
    seg: Segment  # the counters at `t` are `seg.at(t)`: the integrals, each link's rx, each link's tx (`_slots`)
    links: int
    flat: tuple[float, ...] | None = None  # `seg.at(t)` and a last slot reading 0, once something needed it

    def counters(self) -> tuple[float, ...]:
        """Worked out once per sample: a sample is the second of one interval and the first of the next."""
        if self.flat is None:
            seg = self.seg
            self.flat = (*(seg.flat if self.t == seg.t0 else seg.at(self.t)), 0.0)
        return self.flat


@dataclass
class _MetricsLayout:
    """A caller's metrics struct as the fake writes it: its ids, read once, and one packer for all entries."""

    struct_ref: Any
    ids: list[int]
    offset: int
    packer: struct.Struct
    by_links: dict[int, list[tuple[int, float]]]  # NVLinks of the GPU -> `FakeGpm._pairs`
    template: list[Any]  # (id, return, value) per entry, flat, as the packer takes them
    samples: Any  # reads (sample1 address, sample2 address) from the struct


class FakeGpm(FakeDriver):
    """GPM sample buffers (real ctypes memory, so addresses are unique) holding the integrals at their time."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._gpm: dict[int, _GpmRecord | None] = {}  # sample buffer address -> record
        self._gpm_buffers: dict[int, Any] = {}
        self._layouts: dict[int, _MetricsLayout] = {}  # id(metrics struct) -> its layout

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
                raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            del self._gpm[addr]
            del self._gpm_buffers[addr]

    def nvmlGpmSampleGet(self, handle: Handle, sample: Any) -> Any:
        spec = self._answer(handle, "nvmlGpmSampleGet")[0]
        if not spec.gpm:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        t, seg = self._counters(handle.index)
        addr = _ADDRESS(sample)[0]
        with self._lock:
            if addr not in self._gpm:
                raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            self._gpm[addr] = _GpmRecord(handle.index, t, seg, spec.nvlink_count)
        return sample

    def nvmlGpmMetricsGet(self, mg: Any) -> Any:
        self._system("nvmlGpmMetricsGet")
        if mg.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise err(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        lay = self._layout(mg)
        first, second = lay.samples(mg)
        a, b = self._gpm.get(first), self._gpm.get(second)
        if a is None or b is None or a.gpu != b.gpu or b.t <= a.t:
            raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        pairs = lay.by_links.get(b.links)
        if pairs is None:
            pairs = lay.by_links[b.links] = self._pairs(lay, b.links, N_INTEGRALS + 2 * b.links)
        entries = lay.template.copy()
        if a.seg is b.seg:  # one state over the interval: the average is its rate (the last slot reads 0)
            rb = (*b.seg.rates, 0.0)
            entries[2::3] = [rb[i] * scale for i, scale in pairs]
        elif b.seg.prev is a.seg and a.t <= b.seg.t0:  # one state change: the rates weighted by their times
            wa, wb = (b.seg.t0 - a.t) / (b.t - a.t), (b.t - b.seg.t0) / (b.t - a.t)
            ra, rb = (*a.seg.rates, 0.0), (*b.seg.rates, 0.0)
            entries[2::3] = [(ra[i] * wa + rb[i] * wb) * scale for i, scale in pairs]
        else:
            per_s = 1.0 / (b.t - a.t)
            fa, fb = a.counters(), b.counters()
            entries[2::3] = [(fb[i] - fa[i]) * scale * per_s for i, scale in pairs]
        lay.packer.pack_into(mg, lay.offset, *entries)  # one write for every entry, as the C library fills it
        return mg

    @staticmethod
    def _pairs(lay: _MetricsLayout, links: int, zero: int) -> list[tuple[int, float]]:
        """(index into a record's counters, scale) per entry; `zero` for a link the GPU lacks or an id
        that is not supported (their returns are set in `template`)."""
        table = _slots(links)
        out = []
        for k, mid in enumerate(lay.ids):
            slot = table.get(mid)
            lay.template[3 * k + 1] = pynvml.NVML_SUCCESS if slot is not None else pynvml.NVML_ERROR_NOT_SUPPORTED
            out.append((zero, 1.0) if slot is None or slot[0] < 0 else slot)
        return out

    def _layout(self, mg: Any) -> _MetricsLayout:
        """Made once per struct: the sampler reuses its struct every tick, as with the real library."""
        n = mg.numMetrics
        lay = self._layouts.get(id(mg))
        if lay is None or lay.struct_ref is not mg or len(lay.ids) != n:
            assert ctypes.sizeof(type(mg.metrics[0])) == _METRIC.size  # the layout the packer writes
            ids = [mg.metrics[i].metricId for i in range(n)]
            template: list[Any] = [x for mid in ids for x in (mid, pynvml.NVML_SUCCESS, 0.0)]
            lay = self._layouts[id(mg)] = _MetricsLayout(mg, ids, type(mg).metrics.offset,
                                                         struct.Struct("<" + "IId24x" * n), {}, template,
                                                         _pair_reader(type(mg)))
        return lay


class FakeEvents(FakeDriver):
    """XID event sets: a wait returns a pending XID of a watched GPU, or TIMEOUT. As a driver's queue holds every
    XID until read, a wait first looks at every watched GPU now (the scenario may fire XIDs): a poll with no timeout
    (the sampler's, once a tick) sees what fired up to the call."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._event_sets: dict[int, set[int]] = {}

    def nvmlEventSetCreate(self) -> Any:
        self._system("nvmlEventSetCreate")
        es = SimpleNamespace(id=len(self._event_sets) + 1)
        self._event_sets[es.id] = set()
        return es

    def nvmlDeviceRegisterEvents(self, handle: Handle, event_types: int, event_set: Any) -> None:
        self._check(handle, "nvmlDeviceRegisterEvents")
        if event_types & pynvml.nvmlEventTypeXidCriticalError:
            self._event_sets[event_set.id].add(handle.index)

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        self._system("nvmlEventSetWait_v2")
        deadline = time.monotonic() + timeout_ms / 1000.0
        watched = self._event_sets[event_set.id]
        first = True
        while True:
            now = self.clock()
            for i in watched:
                acc = self._acc.get(i)
                if first or acc is None or now - acc.state_t >= 1.0:
                    self._state(i)  # the scenario now (a fresh look is reused), which may fire XIDs
            first = False
            with self._xid_ready:
                for k, (gpu, xid) in enumerate(self._pending_xids):
                    if gpu in watched:
                        del self._pending_xids[k]
                        return SimpleNamespace(device=Handle(gpu), eventType=pynvml.nvmlEventTypeXidCriticalError,
                                               eventData=xid, gpuInstanceId=0xFFFFFFFF,
                                               computeInstanceId=0xFFFFFFFF)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise err(pynvml.NVML_ERROR_TIMEOUT)
                # injected XIDs and those the sampler's looks fire wake this at once; otherwise the
                # scenario is looked at once a second at most (a real wait sleeps in the driver)
                self._xid_ready.wait(min(left, 1.0))

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._system("nvmlEventSetFree")
        self._event_sets.pop(event_set.id, None)


class FakeNvml(FakeLibrary, FakeDeviceFacts, FakeReadings, FakeSlowCounters, FakeGpm, FakeEvents):
    """A simulated NVML library for one node, driven by `scenario` and `clock` (monotonic seconds): the union
    of the per-surface fakes, as `GpuBackend` is the union of the per-surface protocols."""
