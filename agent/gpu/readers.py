"""The GPU sampler's readers: one per NVML surface, each filling its part of a GPU's row for one tick.

Every reader calls NVML only through `NvmlCaller`, so a failure leaves its own metrics NULL on that GPU and
nothing else; a reader keeps no state of its own between ticks beyond what it stores on the `Gpu`.
"""

from __future__ import annotations

from typing import Any

import pynvml

from lynxtop.agent.gpu.calls import REINIT_CODES, Gpu, Lost, NvmlCaller, Reinit, error_name
from lynxtop.agent.gpu.gpm import GpmReader
from lynxtop.agent.gpu.nvlink import NvlinkCounters

E = pynvml
NVLINK_PROBE_LINKS = 18
PROCESS_SM_WINDOW_US = 2_000_000  # NVML samples process utilisation every ~1/6 s; 2 s always holds some


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


class DeviceFacts:
    """The static facts of each GPU (name, UUID, PCI, compute capability, memory size, NVLinks, GPM support),
    read once per (re)initialisation; it also makes the GPU's GPM reader or NVLink counters."""

    def __init__(self, caller: NvmlCaller, gpm_enabled: bool):
        self._c = caller
        self.gpm_enabled = gpm_enabled

    def setup(self, i: int) -> Gpu:
        """GPU `i`; a GPU whose handle cannot be had is returned lost. Raises `Reinit` for the whole library."""
        c, b = self._c, self._c.b
        try:
            h = b.nvmlDeviceGetHandleByIndex(i)
        except pynvml.NVMLError as e:
            if e.value in REINIT_CODES:
                raise Reinit(e.value, f"nvmlDeviceGetHandleByIndex({i})") from None
            g = Gpu(idx=i, handle=None, lost=True)
            g.name = f"GPU {i} ({error_name(e.value)})"
            return g
        g = Gpu(idx=i, handle=h)
        try:
            g.uuid = _text(c.call(g, "nvmlDeviceGetUUID", h) or "")
            g.name = _text(c.call(g, "nvmlDeviceGetName", h) or "")
            pci = c.call(g, "nvmlDeviceGetPciInfo", h)
            g.pci_bus_id = _text(pci.busId) if pci is not None else ""
            g.cc = c.call(g, "nvmlDeviceGetCudaComputeCapability", h)
            mem = c.call(g, "nvmlDeviceGetMemoryInfo", h)
            g.mem_total = mem.total if mem is not None else None
            g.nvlink_count = self._link_count(g)
            sup = c.call(g, "nvmlGpmQueryDeviceSupport", h)
            g.gpm_supported = bool(sup is not None and sup.isSupportedDevice)
            if g.gpm_supported and self.gpm_enabled:
                try:
                    g.gpm = GpmReader(b, h, g.nvlink_count)
                except pynvml.NVMLError as e:
                    c.failed(g, "nvmlGpmSampleAlloc", e.value)
            if g.gpm is None and g.nvlink_count:
                g.counters = NvlinkCounters(b, h, g.nvlink_count)
        except Lost:
            g.lost = True
        return g

    def _link_count(self, g: Gpu) -> int:
        vals = self._c.call(g, "nvmlDeviceGetFieldValues", g.handle, [E.NVML_FI_DEV_NVLINK_LINK_COUNT])
        if vals is not None and vals[0].nvmlReturn == 0 and vals[0].value.uiVal > 0:
            return int(vals[0].value.uiVal)
        n = 0
        for link in range(NVLINK_PROBE_LINKS):
            try:
                self._c.b.nvmlDeviceGetNvLinkState(g.handle, link)
            except pynvml.NVMLError as e:
                if e.value == E.NVML_ERROR_GPU_IS_LOST:
                    raise Lost() from None
                break
            n += 1
        return n


class DeviceReadings:
    """The cheap per-tick readings: utilisation, memory, power, temperature, clocks, clock-event reasons.

    Falls back once and for good on an older driver: v1 memory info (no reserved figure) when v2 is missing,
    the older throttle-reason name when the clock-event one is."""

    def __init__(self, caller: NvmlCaller):
        self._c = caller

    def read(self, g: Gpu, row: dict) -> None:
        h = g.handle
        c = self._c
        call = c.call
        u = call(g, "nvmlDeviceGetUtilizationRates", h)
        if u is not None:
            row["util_gpu_pct"] = u.gpu
            row["util_mem_pct"] = u.memory
        self._memory(g, row)
        p = call(g, "nvmlDeviceGetPowerUsage", h)
        if p is not None:
            row["power_w"] = round(p / 1000)
        p = call(g, "nvmlDeviceGetEnforcedPowerLimit", h)
        if p is not None:
            row["power_limit_w"] = round(p / 1000)
        row["temp_c"] = call(g, "nvmlDeviceGetTemperature", h, E.NVML_TEMPERATURE_GPU)
        row["sm_clock_mhz"] = c.call_as(g, "clock_sm", "nvmlDeviceGetClockInfo", h, E.NVML_CLOCK_SM)
        row["mem_clock_mhz"] = c.call_as(g, "clock_mem", "nvmlDeviceGetClockInfo", h, E.NVML_CLOCK_MEM)
        if "nvmlDeviceGetCurrentClocksEventReasons" not in g.off:
            row["throttle_reasons"] = call(g, "nvmlDeviceGetCurrentClocksEventReasons", h)
        else:  # drivers before 535 only know the older name
            row["throttle_reasons"] = call(g, "nvmlDeviceGetCurrentClocksThrottleReasons", h)

    def _memory(self, g: Gpu, row: dict) -> None:
        h = g.handle
        if g.mem_v2:
            m = self._c.call_as(g, "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetMemoryInfo", h,
                                version=E.nvmlMemory_v2)
            if m is not None:
                row["mem_used_bytes"], row["mem_total_bytes"], row["mem_reserved_bytes"] = m.used, m.total, m.reserved
            elif "nvmlDeviceGetMemoryInfo_v2" in g.off:
                g.mem_v2 = False  # an older driver: the v1 struct has no reserved figure
        if not g.mem_v2:
            m = self._c.call(g, "nvmlDeviceGetMemoryInfo", h)
            if m is not None:
                row["mem_used_bytes"], row["mem_total_bytes"] = m.used, m.total


class ProcessReadings:
    """The compute processes on each GPU, with their memory and SM share; one row per process."""

    def __init__(self, caller: NvmlCaller):
        self._c = caller

    def read(self, g: Gpu, vllm_pids: Any, out: list[dict]) -> None:
        procs = self._c.call(g, "nvmlDeviceGetComputeRunningProcesses", g.handle)
        if not procs:
            return
        sm = self._process_sm(g)
        for pr in procs:
            out.append({"gpu": g.idx, "pid": pr.pid, "used_mem_bytes": pr.usedGpuMemory,
                        "in_vllm_tree": pr.pid in vllm_pids, "sm_util_pct": sm.get(pr.pid)})

    def _process_sm(self, g: Gpu) -> dict[int, int]:
        """Each process's SM share over the last PROCESS_SM_WINDOW_US of NVML's samples (its newest sample).

        NVML answers the samples newer than the time stamp asked for; asking from a window before the newest
        one seen keeps a steady share instead of flickering to "none" between its sampling periods. NOT_FOUND
        (no sample: nobody computed) is normal and gives none; NOT_SUPPORTED switches the call off on this GPU
        only (`call`). The time stamps are NVML's own, never compared with this host's clock."""
        samples = self._c.call(g, "nvmlDeviceGetProcessUtilization", g.handle, g.sm_seen_us)
        newest: dict[int, Any] = {}
        for s in samples or ():
            if s.pid not in newest or s.timeStamp > newest[s.pid].timeStamp:
                newest[s.pid] = s
        if newest:
            g.sm_seen_us = max(0, max(s.timeStamp for s in newest.values()) - PROCESS_SM_WINDOW_US)
        return {pid: int(s.smUtil) for pid, s in newest.items()}


class ActivityReadings:
    """SM/tensor/DRAM activity and PCIe rates from GPM, NVLink rates from GPM or (no GPM) the field counters.

    Writes the scalar columns into the GPU's row and returns the per-link rates (NVLINK_METRICS columns); a GPU
    whose field counters all read NOT_SUPPORTED is not asked again."""

    def __init__(self, caller: NvmlCaller):
        self._c = caller

    def read(self, g: Gpu, row: dict) -> list[tuple[str, float | None]]:
        if g.gpm is not None and "nvmlGpmSampleGet" not in g.off:
            return self._gpm(g, g.gpm, row)
        if g.counters is not None and "nvmlDeviceGetFieldValues" not in g.off:
            return self._counters(g, g.counters, row)
        return []

    def _gpm(self, g: Gpu, gpm: GpmReader, row: dict) -> list[tuple[str, float | None]]:
        try:
            vals = gpm.read()
        except pynvml.NVMLError as e:
            self._c.failed(g, "nvmlGpmSampleGet", e.value)
            return []
        if vals is None:
            return []
        n = gpm.n_scalar
        for col, v in zip(gpm.columns[:n], vals[:n], strict=True):
            if v is not None:
                row[col] = round(v)
        return list(zip(gpm.columns[n:], vals[n:], strict=True))

    def _counters(self, g: Gpu, counters: NvlinkCounters, row: dict) -> list[tuple[str, float | None]]:
        try:
            links, any_ok = counters.read()
        except pynvml.NVMLError as e:
            self._c.failed(g, "nvmlDeviceGetFieldValues", e.value)
            links, any_ok = [], True
        if not any_ok:
            g.counters = None  # no NVLink counters on this GPU: stop asking
        tx = [v for c, v in links if c.endswith("_tx_bytes_per_s")]
        rx = [v for c, v in links if c.endswith("_rx_bytes_per_s")]
        if tx and None not in tx:
            row["nvlink_tx_bytes_per_s"] = round(sum(tx))
        if rx and None not in rx:
            row["nvlink_rx_bytes_per_s"] = round(sum(rx))
        return links


class SlowReadings:
    """Energy (≈4 ms of CPU per call on an H200), ECC and remapped rows: once per slow interval per GPU, the
    last readings carried forward on the ticks between."""

    def __init__(self, caller: NvmlCaller, slow_interval_s: float):
        self._c = caller
        self.slow_interval_s = slow_interval_s

    def read(self, g: Gpu, now: float) -> None:
        c = self._c
        h = g.handle
        g.slow_due = now + self.slow_interval_s
        s: dict[str, Any] = {}
        e = c.call(g, "nvmlDeviceGetTotalEnergyConsumption", h)
        s["energy_j"] = None if e is None else e // 1000
        s["ecc_corrected"] = c.call_as(g, "ecc_corrected", "nvmlDeviceGetTotalEccErrors", h,
                                       E.NVML_MEMORY_ERROR_TYPE_CORRECTED, E.NVML_VOLATILE_ECC)
        s["ecc_uncorrected"] = c.call_as(g, "ecc_uncorrected", "nvmlDeviceGetTotalEccErrors", h,
                                         E.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, E.NVML_VOLATILE_ECC)
        rr = c.call(g, "nvmlDeviceGetRemappedRows", h)
        s["remapped_rows_pending"] = None if rr is None else int(bool(rr[2]))
        s["remapped_rows_failed"] = None if rr is None else int(bool(rr[3]))
        g.slow = s
