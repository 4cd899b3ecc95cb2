"""The GPU sampler's readers: one per NVML surface, each filling its part of a GPU's row for one tick.

Every reader calls NVML only through `NvmlCaller`, so a failure leaves its own metrics NULL on that GPU and
nothing else; a reader keeps no state of its own between ticks beyond what it stores on the `Gpu`. NVML's "not
available" answers (0xFFFFFFFF for a 32-bit reading, 0xFFFFFFFFFFFFFFFF for a 64-bit count) and figures no GPU
can give (a percentage past 100, a power past `MAX_POWER_MW`) are no reading either: NULL, that metric alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pynvml

from lynxtop.agent.gpu.calls import REINIT_CODES, Gpu, Lost, NvmlCaller, Reinit, error_name
from lynxtop.agent.gpu.gpm import GpmReader
from lynxtop.agent.gpu.nvlink import NvlinkCounters
from lynxtop.contract.columns import NVLINK_METRICS, names

E = pynvml
NVLINK_COLUMNS = names(NVLINK_METRICS)
_LINK_TEMPLATE: dict[str, Any] = {**dict.fromkeys(NVLINK_COLUMNS), "gpu": None}  # a link row's keys, in order
NVLINK_PROBE_LINKS = 18
PROCESS_SM_WINDOW_US = 2_000_000  # NVML samples process utilisation every ~1/6 s; 2 s always holds some
_UTIL, _POWER = "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage"
_REASONS, _OLD_REASONS = "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"
_CLOCK_SM = E.NVML_CLOCK_SM
U32_NA = 0xFFFFFFFF  # NVML's "not available" for an unsigned int reading (NVML_VALUE_NOT_AVAILABLE_uint)
COUNT_END = 1 << 63  # a 64-bit count at or past this is "not available" (0xFFFFFFFFFFFFFFFF) or garbage
MAX_POWER_MW = 100_000_000  # 100 kW: past any GPU board; the u32 "not available" is 4.3 MW


def _u32(v: int | None) -> int | None:
    """A 32-bit reading, None for none or NVML's "not available"."""
    return None if v is None or v >= U32_NA else v


def _count(v: int | None) -> int | None:
    """A 64-bit count (ECC errors, mJ), None for none, NVML's "not available" or anything an SQLite INTEGER
    cannot hold."""
    return v if v is not None and 0 <= v < COUNT_END else None


def _watts(mw: int | None) -> int | None:
    """Milliwatts as whole watts, None for none or a figure past MAX_POWER_MW ("not available" among them)."""
    return None if mw is None or not 0 <= mw < MAX_POWER_MW else round(mw / 1000)


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


class DeviceFacts:
    """The static facts of each GPU (name, UUID, PCI, serial, compute capability, memory size, NVLinks, GPM support),
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
            serial = c.call(g, "nvmlDeviceGetSerial", h)  # None where the board keeps none: nothing else off
            g.serial = (_text(serial).strip() or None) if serial is not None else None
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
    """The per-GPU readings: those that move at the tick's rate (utilisation, power, SM clock, clock-event reasons)
    every tick; those that do not (memory, power limit, temperature, memory clock, ECC counts, remapped rows) about
    once a second (`read_kept`), kept in `Gpu.kept` and copied into every row until read again
    (agent/gpu/refresh.py).

    Falls back once and for good on an older driver: v1 memory info (no reserved figure) when v2 is missing,
    the older throttle-reason name when the clock-event one is."""

    def __init__(self, caller: NvmlCaller):
        self._c = caller
        self._bound: Any = None  # the backend `_fns` were taken from
        self._fns: tuple = ()

    def _bind(self) -> tuple:
        """The per-tick functions of the open backend, looked up once per backend rather than once per call."""
        b = self._bound = self._c.b
        self._fns = (b.nvmlDeviceGetUtilizationRates, b.nvmlDeviceGetPowerUsage, b.nvmlDeviceGetClockInfo,
                     b.nvmlDeviceGetCurrentClocksEventReasons, b.nvmlDeviceGetCurrentClocksThrottleReasons)
        return self._fns

    def read(self, g: Gpu, row: dict) -> None:
        """The tick's readings into `row`, whose columns start None. Each is `NvmlCaller.call` written out (the
        same `g.off` check, the same calls in the same order, a failure booked by `failed` and its columns left
        None) on functions bound once: no wrapper frame and no look-up by name per call, ~40 % of this."""
        fns = self._fns if self._bound is self._c.b else self._bind()
        util, power, clock, reasons, old_reasons = fns
        h, off, failed = g.handle, g.off, self._c.failed
        if _UTIL not in off:
            try:
                u = util(h)
            except pynvml.NVMLError as e:
                failed(g, _UTIL, e.value)
            else:
                if u is not None:  # a percentage past 100 is "not available" (0xFFFFFFFF) or garbage
                    if u.gpu <= 100:
                        row["util_gpu_pct"] = u.gpu
                    if u.memory <= 100:
                        row["util_mem_pct"] = u.memory
        if _POWER not in off:
            try:
                p = power(h)
            except pynvml.NVMLError as e:
                failed(g, _POWER, e.value)
            else:
                if p is not None and p < MAX_POWER_MW:  # 0xFFFFFFFF mW: "not available", not 4.3 MW
                    row["power_w"] = round(p / 1000)
        if "clock_sm" not in off:
            try:
                mhz = clock(h, _CLOCK_SM)
            except pynvml.NVMLError as e:
                failed(g, "clock_sm", e.value, "nvmlDeviceGetClockInfo")
            else:
                if mhz != U32_NA:
                    row["sm_clock_mhz"] = mhz
        if _REASONS not in off:
            try:
                row["throttle_reasons"] = reasons(h)
            except pynvml.NVMLError as e:
                failed(g, _REASONS, e.value)
        elif _OLD_REASONS not in off:  # drivers before 535 only know the older name
            try:
                row["throttle_reasons"] = old_reasons(h)
            except pynvml.NVMLError as e:
                failed(g, _OLD_REASONS, e.value)

    def read_kept(self, g: Gpu, now: float) -> None:
        """The readings kept between ticks, into `g.kept` (a failed one is NULL until the next read)."""
        c = self._c
        h = g.handle
        k: dict[str, Any] = {}
        self._memory(g, k)
        k["power_limit_w"] = _watts(c.call(g, "nvmlDeviceGetEnforcedPowerLimit", h))
        k["temp_c"] = _u32(c.call(g, "nvmlDeviceGetTemperature", h, E.NVML_TEMPERATURE_GPU))
        # the memory clock holds at its P-state's figure (3201 MHz on an H200 under load): it does not move at the
        # tick's rate, the SM clock (boost, power cap, thermal slowdown) does
        k["mem_clock_mhz"] = _u32(c.call_as(g, "clock_mem", "nvmlDeviceGetClockInfo", h, E.NVML_CLOCK_MEM))
        # ECC and remapped rows: a few µs each on an H200, so an error counted shows within a second
        k["ecc_corrected"] = _count(c.call_as(g, "ecc_corrected", "nvmlDeviceGetTotalEccErrors", h,
                                              E.NVML_MEMORY_ERROR_TYPE_CORRECTED, E.NVML_VOLATILE_ECC))
        k["ecc_uncorrected"] = _count(c.call_as(g, "ecc_uncorrected", "nvmlDeviceGetTotalEccErrors", h,
                                                E.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, E.NVML_VOLATILE_ECC))
        rr = c.call(g, "nvmlDeviceGetRemappedRows", h)
        k["remapped_rows_pending"] = None if rr is None else int(bool(rr[2]))
        k["remapped_rows_failed"] = None if rr is None else int(bool(rr[3]))
        g.kept = k
        g.kept_at = now
        g.row_base = None  # rows start from these readings from now on

    def _memory(self, g: Gpu, row: dict) -> None:
        h = g.handle
        if g.mem_v2:
            m = self._c.call_as(g, "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetMemoryInfo", h,
                                version=E.nvmlMemory_v2)
            if m is not None:
                row["mem_used_bytes"], row["mem_total_bytes"], row["mem_reserved_bytes"] = m.used, m.total, m.reserved
                return
            if "nvmlDeviceGetMemoryInfo_v2" in g.off:
                g.mem_v2 = False  # an older driver: the v1 struct has no reserved figure
        if not g.mem_v2:
            m = self._c.call(g, "nvmlDeviceGetMemoryInfo", h)
            if m is not None:
                row["mem_used_bytes"], row["mem_total_bytes"] = m.used, m.total


class ProcessReadings:
    """The compute processes on each GPU, with their memory and SM share; one row per process, read with the
    kept readings (about once a second) into `Gpu.proc_rows` and copied into every tick's rows."""

    def __init__(self, caller: NvmlCaller, wall_clock: Callable[[], float] = time.time):
        self._c = caller
        self._wall = wall_clock  # what NVML stamps its process samples with: CLOCK_REALTIME, in s

    def read(self, g: Gpu, vllm_pids: Any) -> None:
        procs = self._c.call(g, "nvmlDeviceGetComputeRunningProcesses", g.handle)
        if not procs:
            g.proc_rows = []
            return
        sm = self._process_sm(g)
        g.proc_rows = [{"gpu": g.idx, "pid": pr.pid, "used_mem_bytes": pr.usedGpuMemory,
                        "in_vllm_tree": pr.pid in vllm_pids, "sm_util_pct": sm.get(pr.pid)} for pr in procs]

    def _process_sm(self, g: Gpu) -> dict[int, int]:
        """Each process's SM share over the last PROCESS_SM_WINDOW_US of NVML's samples (its newest sample).

        NVML answers the samples newer than the time stamp asked for; asking from a window before the newest
        one seen keeps a steady share instead of flickering to "none" between its sampling periods. NOT_FOUND
        (no sample: nobody computed) is normal and gives none; NOT_SUPPORTED switches the call off on this GPU
        only (`call`). NVML stamps its samples with the wall clock (µs): after the wall clock steps back, the
        newest stamp seen is ahead of every new sample, so the ask is never from later than a window before now
        (otherwise NVML answers NOT_FOUND, no share, for as long as the step)."""
        since = int(self._wall() * 1e6) - PROCESS_SM_WINDOW_US
        if g.sm_seen_us < since:
            since = g.sm_seen_us
        samples = self._c.call(g, "nvmlDeviceGetProcessUtilization", g.handle, since)
        newest: dict[int, Any] = {}
        for s in samples or ():
            if s.pid not in newest or s.timeStamp > newest[s.pid].timeStamp:
                newest[s.pid] = s
        if newest:
            g.sm_seen_us = max(0, max(s.timeStamp for s in newest.values()) - PROCESS_SM_WINDOW_US)
        return {pid: int(s.smUtil) for pid, s in newest.items()}


class ActivityReadings:
    """SM/tensor/DRAM activity and PCIe rates from GPM, NVLink rates from GPM or (no GPM) the field counters.

    Writes the scalar columns into the GPU's row every tick. With `links` (about once a second) it also renews
    `Gpu.link_row`, the per-link rates (NVLINK_METRICS columns) over the second since the last such read, or
    None while there is none; the rows in between carry it. A GPU whose field counters all read NOT_SUPPORTED
    is not asked again."""

    def __init__(self, caller: NvmlCaller):
        self._c = caller

    def read(self, g: Gpu, row: dict, links: bool) -> None:
        gpm = g.gpm
        if gpm is not None and "nvmlGpmSampleGet" not in g.off:
            try:
                vals, link_vals = gpm.sample_rounded(links)
            except pynvml.NVMLError as e:
                if links:
                    g.link_row = None
                self._c.failed(g, "nvmlGpmSampleGet", e.value)
                return
            if vals is not None:  # whole numbers or None, into columns that start None: one C-level pass
                row.update(zip(gpm.columns, vals, strict=True))
            if links:
                g.link_row = _link_row(g.idx, gpm.link_columns, link_vals)
        elif g.counters is not None and "nvmlDeviceGetFieldValues" not in g.off:
            self._counters(g, g.counters, row, links)
        elif links:
            g.link_row = None

    def _counters(self, g: Gpu, counters: NvlinkCounters, row: dict, links: bool) -> None:
        try:
            rates, link_rates, any_ok = counters.read(links)
        except pynvml.NVMLError as e:
            if links:
                g.link_row = None
            self._c.failed(g, "nvmlDeviceGetFieldValues", e.value)
            return
        if not any_ok:
            g.counters = None  # no NVLink counters on this GPU: stop asking
        tx, rx = rates[0::2], rates[1::2]  # (tx, rx) per link
        if tx and None not in tx:
            row["nvlink_tx_bytes_per_s"] = round(sum(tx))  # type: ignore[arg-type]
        if rx and None not in rx:
            row["nvlink_rx_bytes_per_s"] = round(sum(rx))  # type: ignore[arg-type]
        if links:
            g.link_row = _link_row(g.idx, counters.columns, _rounded(link_rates)) if any_ok else None


def _link_row(gpu: int, columns: list[str], values: Any) -> dict | None:
    """An NVLINK_METRICS row of per-link rates (bytes/s, whole numbers or None, as `GpmReader.sample_rounded`
    gives them), or None without a reading."""
    if not values:
        return None
    row = _LINK_TEMPLATE.copy()  # a copy of a built dict: dict.fromkeys grows its table key by key
    row["gpu"] = gpu
    row.update(zip(columns, values, strict=True))
    return row


def _rounded(values: list[float | None] | None) -> list[int | None] | None:
    return None if values is None else [None if v is None else round(v) for v in values]


class SlowReadings:
    """Energy (≈4 ms of CPU per call on an H200): once per slow interval per GPU, the last reading carried
    forward on the ticks between."""

    def __init__(self, caller: NvmlCaller, slow_interval_s: float):
        self._c = caller
        self.slow_interval_s = slow_interval_s

    def read(self, g: Gpu, now: float) -> None:
        c = self._c
        h = g.handle
        g.slow_due = now + self.slow_interval_s
        s: dict[str, Any] = {}
        e = _count(c.call(g, "nvmlDeviceGetTotalEnergyConsumption", h))  # mJ
        s["energy_j"] = None if e is None else e // 1000
        g.slow = s
        g.row_base = None
