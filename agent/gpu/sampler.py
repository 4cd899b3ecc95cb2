"""Per-tick GPU sampling through an NVML backend: one dict per GPU keyed by GPU_METRICS, never an exception.

Errors are normal and local: a call that fails leaves its metric NULL for that GPU only. A function that is
NOT_SUPPORTED or missing (FUNCTION_NOT_FOUND) is not called again on that GPU and is reported once; a lost
GPU is marked lost (one event) while the others keep sampling; a driver/library mismatch tears NVML down and
re-initialises it with backoff; no driver at all is a state ("no-driver"), not a crash.

Cost discipline (reference/nvml.md): GPM structs are reused, energy/ECC/remapped rows are read at a slow
cadence (at most one GPU's slow reads per tick, so no tick pays 8 × 4 ms), PCIe comes from GPM
(nvmlDeviceGetPcieThroughput blocks ~21 ms and is never called), NVLink from GPM where present.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

from lynxtop.agent.gpu.gpm import GpmReader
from lynxtop.agent.gpu.nvlink import NvlinkCounters
from lynxtop.agent.gpu.protocol import GpuBackend
from lynxtop.agent.gpu.xid import XidWatcher
from lynxtop.contract.columns import GPU_METRICS, NVLINK_METRICS, names
from lynxtop.contract.events import EventKind

log = logging.getLogger("lynxtop.gpu")

EventSink = Callable[[EventKind, str, str, dict | None], None]  # (kind, severity, message, details)

GPU_COLUMNS = names(GPU_METRICS)
_ROW_TEMPLATE = dict.fromkeys(GPU_COLUMNS)
_NVLINK_TEMPLATE = dict.fromkeys(names(NVLINK_METRICS))

E = pynvml
# the library itself is gone or out of step with the kernel module: only a fresh nvmlInit can help
_REINIT_CODES = {E.NVML_ERROR_LIB_RM_VERSION_MISMATCH, E.NVML_ERROR_UNINITIALIZED, E.NVML_ERROR_DRIVER_NOT_LOADED}
_NO_DRIVER_CODES = {E.NVML_ERROR_LIBRARY_NOT_FOUND, E.NVML_ERROR_DRIVER_NOT_LOADED}
_PERMANENT_CODES = {E.NVML_ERROR_NOT_SUPPORTED, E.NVML_ERROR_FUNCTION_NOT_FOUND}

# functions an older driver lacks, and what is read instead
_FALLBACKS = {
    "nvmlDeviceGetMemoryInfo_v2": "nvmlDeviceGetMemoryInfo (no reserved-memory figure)",
    "nvmlDeviceGetCurrentClocksEventReasons": "nvmlDeviceGetCurrentClocksThrottleReasons",
}

ARCH_BY_CC_MAJOR = {6: "Pascal", 7: "Volta", 8: "Ampere", 9: "Hopper", 10: "Blackwell", 12: "Blackwell"}


def arch_name(cc: tuple[int, int] | None) -> str:
    if cc is None:
        return "unknown"
    if cc == (7, 5):
        return "Turing"
    if cc == (8, 9):
        return "Ada"
    return ARCH_BY_CC_MAJOR.get(cc[0], f"SM{cc[0]}{cc[1]}")


def error_name(code: int) -> str:
    for k, v in vars(pynvml).items():
        if k.startswith("NVML_ERROR_") and v == code:
            return k
    return f"NVML error {code}"


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


@dataclass
class GpuTick:
    gpu_rows: list[dict] = field(default_factory=list)
    nvlink_rows: list[dict] = field(default_factory=list)
    process_rows: list[dict] = field(default_factory=list)


class _Lost(Exception):
    pass


class _Reinit(Exception):
    def __init__(self, code: int, where: str):
        super().__init__(f"{error_name(code)} in {where}")
        self.code = code


@dataclass
class _Gpu:
    idx: int
    handle: Any
    uuid: str = ""
    name: str = ""
    pci_bus_id: str = ""
    cc: tuple[int, int] | None = None
    mem_total: int | None = None
    nvlink_count: int = 0
    gpm_supported: bool = False
    gpm: GpmReader | None = None
    counters: NvlinkCounters | None = None
    off: set[str] = field(default_factory=set)  # functions not to call again on this GPU
    denied_at: dict[str, float] = field(default_factory=dict)  # NO_PERMISSION: retried at the slow cadence
    mem_v2: bool = True
    lost: bool = False
    lost_probe_at: float = 0.0
    slow_due: float = 0.0
    slow: dict = field(default_factory=dict)  # last slow-cadence readings, carried forward
    sm_seen_us: int = 0  # NVML time stamp the next process-utilisation read asks from


class GpuSampler:
    """Samples every GPU of the node through `backend_factory()` (a fresh backend on each (re)initialisation)."""

    def __init__(self, backend_factory: Callable[[], GpuBackend], gpm_enabled: bool = True,
                 slow_interval_s: float = 60.0, on_event: EventSink | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 retry_initial_s: float = 1.0, retry_max_s: float = 60.0, lost_probe_s: float = 10.0,
                 xid_events: bool = True, xid_wait_ms: int = 500):
        self._factory = backend_factory
        self.gpm_enabled = gpm_enabled
        self.slow_interval_s = slow_interval_s
        self._on_event = on_event
        self._clock = clock
        self._retry_initial = retry_initial_s
        self._retry_max = retry_max_s
        self._lost_probe_s = lost_probe_s
        self._xid_events = xid_events
        self._xid_wait_ms = xid_wait_ms
        self._b: Any = None  # a GpuBackend while open
        self._gpus: list[_Gpu] = []
        self._state = {"state": "error", "message": "not opened", "driver_version": "", "nvml_version": ""}
        self._retry_delay = retry_initial_s
        self._next_attempt = 0.0
        self._reported: set[tuple[str, str]] = set()  # (kind, key) events already reported once
        self._xid: XidWatcher | None = None
        self._first_tick = True
        self.static_version = 0  # +1 on every successful (re)initialisation: re-read static() then

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> dict:
        self._try_open()
        return self.status()

    def status(self) -> dict:
        return dict(self._state)

    def static(self) -> list[dict]:
        dv, nv = self._state["driver_version"], self._state["nvml_version"]
        return [{"uuid": g.uuid, "idx": g.idx, "name": g.name, "pci_bus_id": g.pci_bus_id,
                 "cc_major": g.cc[0] if g.cc else None, "cc_minor": g.cc[1] if g.cc else None,
                 "arch": arch_name(g.cc), "mem_total_bytes": g.mem_total, "nvlink_count": g.nvlink_count,
                 "gpm_supported": g.gpm_supported, "driver_version": dv, "nvml_version": nv}
                for g in self._gpus if g.uuid]

    def close(self) -> None:
        self._teardown()
        self._state.update(state="error", message="closed")

    def _event(self, kind: EventKind, severity: str, message: str, details: dict | None = None) -> None:
        (log.warning if severity in ("warning", "error", "critical") else log.info)("%s", message)
        if self._on_event is not None:
            try:
                self._on_event(kind, severity, message, details)
            except Exception:  # a broken sink must not stop sampling
                log.exception("GPU event sink failed")

    def _once(self, kind: str, key: str) -> bool:
        if (kind, key) in self._reported:
            return False
        self._reported.add((kind, key))
        return True

    def _try_open(self) -> None:
        self._teardown()
        now = self._clock()
        try:
            b = self._factory()
            b.nvmlInit()
        except pynvml.NVMLError as e:
            self._open_failed(e.value, f"nvmlInit failed: {error_name(e.value)} ({e})", now)
            return
        except OSError as e:
            self._open_failed(E.NVML_ERROR_LIBRARY_NOT_FOUND, f"cannot load NVML: {e}", now)
            return
        self._b = b
        try:
            dv, nv = _text(b.nvmlSystemGetDriverVersion()), _text(b.nvmlSystemGetNVMLVersion())
            count = b.nvmlDeviceGetCount()
            self._gpus = [self._setup_gpu(i) for i in range(count)]
        except pynvml.NVMLError as e:
            self._teardown()
            self._open_failed(e.value, f"NVML initialised but enumerating GPUs failed: {error_name(e.value)}", now)
            return
        except _Reinit as e:
            self._teardown()
            self._open_failed(e.code, f"NVML initialised but {e}", now)
            return
        was_down = self._state["state"] == "error" and self.static_version > 0
        self._state = {"state": "ok", "message": f"{count} GPU(s)" + (" (simulated)" if b.simulated
                                                                       else ""),
                       "driver_version": dv, "nvml_version": nv}
        self._retry_delay = self._retry_initial
        self._first_tick = True
        self.static_version += 1
        if was_down:
            self._event(EventKind.NVML_REINIT, "info", f"NVML re-initialised: driver {dv}, {count} GPU(s)",
                        {"driver_version": dv, "gpus": count})
        for g in self._gpus:
            if g.lost:
                self._mark_lost(g, "while enumerating")
        if not self.gpm_enabled and self._once("gpm_disabled", ""):
            self._event(EventKind.GPU_GPM_DISABLED, "info", "GPM sampling is off by configuration "
                        "([agent] gpm = false): SM/tensor/DRAM activity columns stay empty", None)
        if self._xid_events and self._on_event is not None:
            self._xid = XidWatcher(b, self._event, wait_ms=self._xid_wait_ms)
            self._xid.start()

    def _open_failed(self, code: int, message: str, now: float) -> None:
        no_driver = code in _NO_DRIVER_CODES
        state = "no-driver" if no_driver else "error"
        if no_driver:
            message = ("no NVIDIA driver (" + message + "): GPU metrics are off; host and serving metrics "
                       "continue")
        delay = self._retry_delay
        self._state = {"state": state, "message": f"{message}; next try in {delay:g} s",
                       "driver_version": "", "nvml_version": ""}
        self._next_attempt = now + delay
        self._retry_delay = min(self._retry_delay * 2, self._retry_max * (5 if no_driver else 1))
        if self._once("nvml_open_failed", state):
            self._event(EventKind.NVML_UNAVAILABLE, "warning" if no_driver else "error", message, {"code": code})

    def _teardown(self) -> None:
        if self._xid is not None:
            self._xid.stop()
            self._xid = None
        for g in self._gpus:
            if g.gpm is not None:
                g.gpm.close()
        self._gpus = []
        if self._b is not None:
            try:
                self._b.nvmlShutdown()
            except pynvml.NVMLError:
                pass
            self._b = None

    def _setup_gpu(self, i: int) -> _Gpu:
        b = self._b
        try:
            h = b.nvmlDeviceGetHandleByIndex(i)
        except pynvml.NVMLError as e:
            if e.value in _REINIT_CODES:
                raise _Reinit(e.value, f"nvmlDeviceGetHandleByIndex({i})") from None
            g = _Gpu(idx=i, handle=None, lost=True)
            g.name = f"GPU {i} ({error_name(e.value)})"
            return g
        g = _Gpu(idx=i, handle=h)
        try:
            g.uuid = _text(self._call(g, "nvmlDeviceGetUUID", h) or "")
            g.name = _text(self._call(g, "nvmlDeviceGetName", h) or "")
            pci = self._call(g, "nvmlDeviceGetPciInfo", h)
            g.pci_bus_id = _text(pci.busId) if pci is not None else ""
            g.cc = self._call(g, "nvmlDeviceGetCudaComputeCapability", h)
            mem = self._call(g, "nvmlDeviceGetMemoryInfo", h)
            g.mem_total = mem.total if mem is not None else None
            g.nvlink_count = self._link_count(g)
            sup = self._call(g, "nvmlGpmQueryDeviceSupport", h)
            g.gpm_supported = bool(sup is not None and sup.isSupportedDevice)
            if g.gpm_supported and self.gpm_enabled:
                try:
                    g.gpm = GpmReader(b, h, g.nvlink_count)
                except pynvml.NVMLError as e:
                    self._failed(g, "nvmlGpmSampleAlloc", e.value)
            if g.gpm is None and g.nvlink_count:
                g.counters = NvlinkCounters(b, h, g.nvlink_count)
        except _Lost:
            g.lost = True
        return g

    def _link_count(self, g: _Gpu) -> int:
        vals = self._call(g, "nvmlDeviceGetFieldValues", g.handle, [E.NVML_FI_DEV_NVLINK_LINK_COUNT])
        if vals is not None and vals[0].nvmlReturn == 0 and vals[0].value.uiVal > 0:
            return int(vals[0].value.uiVal)
        n = 0
        for link in range(NVLINK_PROBE_LINKS):
            try:
                self._b.nvmlDeviceGetNvLinkState(g.handle, link)
            except pynvml.NVMLError as e:
                if e.value == E.NVML_ERROR_GPU_IS_LOST:
                    raise _Lost() from None
                break
            n += 1
        return n

    # ------------------------------------------------------------------ calls and their errors

    def _call(self, g: _Gpu, name: str, *args: Any) -> Any:
        """The function's answer, or None when it failed (its metric is then NULL)."""
        if name in g.off:
            return None
        try:
            return getattr(self._b, name)(*args)
        except pynvml.NVMLError as e:
            return self._failed(g, name, e.value)

    def _call_as(self, g: _Gpu, key: str, name: str, *args: Any, **kw: Any) -> Any:
        """`_call` where one function reads two metrics (`key` is what gets switched off on failure)."""
        if key in g.off:
            return None
        try:
            return getattr(self._b, name)(*args, **kw)
        except pynvml.NVMLError as e:
            return self._failed(g, key, e.value, name)

    def _failed(self, g: _Gpu, key: str, code: int, name: str | None = None) -> None:
        """Book-keeping for one failed call; `key` is what gets switched off, `name` what is reported."""
        if name is None or key in _FALLBACKS:
            name = key
        if code == E.NVML_ERROR_GPU_IS_LOST:
            raise _Lost()
        if code in _REINIT_CODES:
            raise _Reinit(code, key)
        if code in _PERMANENT_CODES:
            g.off.add(key)
            if code == E.NVML_ERROR_FUNCTION_NOT_FOUND and self._once("missing_function", name):
                instead = _FALLBACKS.get(name)
                self._event(EventKind.NVML_MISSING_FUNCTION, "info" if instead else "warning",
                            f"NVML function {name} is missing in this driver (FUNCTION_NOT_FOUND): "
                            + (f"using {instead}" if instead else "its metrics stay empty"),
                            {"function": name, "gpu": g.idx})
            elif code == E.NVML_ERROR_NOT_SUPPORTED:
                log.debug("GPU %d: %s not supported", g.idx, key)
        elif code == E.NVML_ERROR_NO_PERMISSION:
            g.off.add(key)
            g.denied_at[key] = self._clock()
            if self._once("no_permission", name):
                self._event(EventKind.NVML_NO_PERMISSION, "warning",
                            f"NVML denied {name} on GPU {g.idx} (NO_PERMISSION); retried every "
                            f"{self.slow_interval_s:g} s", {"function": name, "gpu": g.idx})
        elif code != E.NVML_ERROR_NOT_FOUND and self._once("nvml_error", f"{g.idx}:{key}:{code}"):
            log.warning("GPU %d: %s failed with %s (metric left empty; further failures not logged)",
                        g.idx, name, error_name(code))
        return None

    # ------------------------------------------------------------------ sampling

    def sample(self, vllm_pids: set[int] | frozenset[int] = frozenset()) -> GpuTick:
        """One tick for every GPU. Never raises: failures become NULLs, events and states."""
        now = self._clock()
        tick = GpuTick()
        if self._state["state"] != "ok":
            if now < self._next_attempt:
                return tick
            self._try_open()
            if self._state["state"] != "ok":
                return tick
        slow_budget = len(self._gpus) if self._first_tick else 1
        self._first_tick = False
        try:
            for g in self._gpus:
                if g.lost and not self._probe(g, now):
                    tick.gpu_rows.append(self._lost_row(g))
                    continue
                try:
                    do_slow = slow_budget > 0 and now >= g.slow_due
                    if do_slow:
                        slow_budget -= 1
                    self._sample_gpu(g, now, do_slow, vllm_pids, tick)
                except _Lost:
                    self._mark_lost(g, "while sampling")
                    tick.gpu_rows.append(self._lost_row(g))
                except _Reinit:
                    raise
                except Exception as e:  # a bug or an odd answer on one GPU: the others keep their rows
                    if self._once("sample_bug", f"{g.idx}:{type(e).__name__}"):
                        log.exception("sampling GPU %d failed (logged once)", g.idx)
        except _Reinit as e:
            self._reinit(e)
            return GpuTick()
        except Exception as e:  # a bug here must not take the agent down: keep the node serving
            if self._once("sample_bug", type(e).__name__):
                log.exception("GPU sampling failed (logged once)")
            return GpuTick()
        return tick

    def _reinit(self, e: _Reinit) -> None:
        self._teardown()
        self._reported.discard(("nvml_open_failed", "error"))
        self._event(EventKind.NVML_REINIT, "warning", f"NVML needs re-initialising ({e}); retrying with backoff",
                    {"code": e.code})
        self._state = {"state": "error", "message": f"re-initialising NVML after {e}",
                       "driver_version": "", "nvml_version": ""}
        self._retry_delay = self._retry_initial
        self._next_attempt = self._clock() + self._retry_delay

    def _mark_lost(self, g: _Gpu, where: str) -> None:
        g.lost = True
        g.lost_probe_at = self._clock() + self._lost_probe_s
        if self._once("gpu_lost", str(g.idx)):
            self._event(EventKind.GPU_LOST, "critical",
                        f"GPU {g.idx} {g.uuid or ''} is lost (NVML GPU_IS_LOST {where}); the other GPUs keep "
                        "sampling. A lost GPU usually needs a reset or a reboot.",
                        {"gpu": g.idx, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id})

    def _probe(self, g: _Gpu, now: float) -> bool:
        """Whether a lost GPU answers again (checked every lost_probe_s, with one cheap call)."""
        if g.handle is None or now < g.lost_probe_at:
            return False
        g.lost_probe_at = now + self._lost_probe_s
        try:
            self._b.nvmlDeviceGetTemperature(g.handle, E.NVML_TEMPERATURE_GPU)
        except pynvml.NVMLError as e:
            if e.value in _REINIT_CODES:
                raise _Reinit(e.value, "nvmlDeviceGetTemperature") from None
            return False
        g.lost = False
        self._reported.discard(("gpu_lost", str(g.idx)))
        if g.gpm is not None:
            g.gpm.reset()
        self._event(EventKind.GPU_RECOVERED, "info", f"GPU {g.idx} answers NVML again", {"gpu": g.idx, "uuid": g.uuid})
        return True

    def _lost_row(self, g: _Gpu) -> dict:
        row = dict(_ROW_TEMPLATE)
        row["gpu"] = g.idx
        row["lost"] = 1
        row["mem_total_bytes"] = g.mem_total
        return row

    def _sample_gpu(self, g: _Gpu, now: float, do_slow: bool, vllm_pids: Any, tick: GpuTick) -> None:
        row = dict(_ROW_TEMPLATE)
        row["gpu"] = g.idx
        row["lost"] = 0
        if g.denied_at:
            self._retry_denied(g, now)
        self._read_fast(g, row)
        self._read_processes(g, vllm_pids, tick)
        if g.gpm is not None and "nvmlGpmSampleGet" not in g.off:
            links = self._read_gpm(g, g.gpm, row)
        elif g.counters is not None and "nvmlDeviceGetFieldValues" not in g.off:
            links = self._read_counters(g, g.counters, row)
        else:
            links = []
        if links:
            nl = dict(_NVLINK_TEMPLATE)
            nl["gpu"] = g.idx
            for col, v in links:
                nl[col] = None if v is None else round(v)
            tick.nvlink_rows.append(nl)
        if do_slow:
            self._read_slow(g, now)
        row.update(g.slow)
        tick.gpu_rows.append(row)

    def _retry_denied(self, g: _Gpu, now: float) -> None:
        """NO_PERMISSION can be granted later (e.g. a changed udev rule): ask again every slow interval."""
        for key, t in g.denied_at.items():
            if now - t >= self.slow_interval_s:
                g.off.discard(key)
                g.denied_at[key] = now

    def _read_fast(self, g: _Gpu, row: dict) -> None:
        """The cheap per-tick readings: utilisation, memory, power, temperature, clocks, clock-event reasons."""
        h = g.handle
        call = self._call
        u = call(g, "nvmlDeviceGetUtilizationRates", h)
        if u is not None:
            row["util_gpu_pct"] = u.gpu
            row["util_mem_pct"] = u.memory
        self._read_memory(g, row)
        p = call(g, "nvmlDeviceGetPowerUsage", h)
        if p is not None:
            row["power_w"] = round(p / 1000)
        p = call(g, "nvmlDeviceGetEnforcedPowerLimit", h)
        if p is not None:
            row["power_limit_w"] = round(p / 1000)
        row["temp_c"] = call(g, "nvmlDeviceGetTemperature", h, E.NVML_TEMPERATURE_GPU)
        row["sm_clock_mhz"] = self._call_as(g, "clock_sm", "nvmlDeviceGetClockInfo", h, E.NVML_CLOCK_SM)
        row["mem_clock_mhz"] = self._call_as(g, "clock_mem", "nvmlDeviceGetClockInfo", h, E.NVML_CLOCK_MEM)
        if "nvmlDeviceGetCurrentClocksEventReasons" not in g.off:
            row["throttle_reasons"] = call(g, "nvmlDeviceGetCurrentClocksEventReasons", h)
        else:  # drivers before 535 only know the older name
            row["throttle_reasons"] = call(g, "nvmlDeviceGetCurrentClocksThrottleReasons", h)

    def _read_memory(self, g: _Gpu, row: dict) -> None:
        h = g.handle
        if g.mem_v2:
            m = self._call_as(g, "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetMemoryInfo", h, version=E.nvmlMemory_v2)
            if m is not None:
                row["mem_used_bytes"], row["mem_total_bytes"], row["mem_reserved_bytes"] = m.used, m.total, m.reserved
            elif "nvmlDeviceGetMemoryInfo_v2" in g.off:
                g.mem_v2 = False  # an older driver: the v1 struct has no reserved figure
        if not g.mem_v2:
            m = self._call(g, "nvmlDeviceGetMemoryInfo", h)
            if m is not None:
                row["mem_used_bytes"], row["mem_total_bytes"] = m.used, m.total

    def _read_processes(self, g: _Gpu, vllm_pids: Any, tick: GpuTick) -> None:
        procs = self._call(g, "nvmlDeviceGetComputeRunningProcesses", g.handle)
        if not procs:
            return
        sm = self._process_sm(g)
        for pr in procs:
            tick.process_rows.append({"gpu": g.idx, "pid": pr.pid, "used_mem_bytes": pr.usedGpuMemory,
                                      "in_vllm_tree": pr.pid in vllm_pids, "sm_util_pct": sm.get(pr.pid)})

    def _process_sm(self, g: _Gpu) -> dict[int, int]:
        """Each process's SM share over the last PROCESS_SM_WINDOW_US of NVML's samples (its newest sample).

        NVML answers the samples newer than the time stamp asked for; asking from a window before the newest
        one seen keeps a steady share instead of flickering to "none" between its sampling periods. NOT_FOUND
        (no sample: nobody computed) is normal and gives none; NOT_SUPPORTED switches the call off on this GPU
        only (`_call`). The time stamps are NVML's own, never compared with this host's clock."""
        samples = self._call(g, "nvmlDeviceGetProcessUtilization", g.handle, g.sm_seen_us)
        newest: dict[int, Any] = {}
        for s in samples or ():
            if s.pid not in newest or s.timeStamp > newest[s.pid].timeStamp:
                newest[s.pid] = s
        if newest:
            g.sm_seen_us = max(0, max(s.timeStamp for s in newest.values()) - PROCESS_SM_WINDOW_US)
        return {pid: int(s.smUtil) for pid, s in newest.items()}

    def _read_gpm(self, g: _Gpu, gpm: GpmReader, row: dict) -> list[tuple[str, float | None]]:
        """GPM activity into `row`; the per-link NVLink rates are returned."""
        try:
            vals = gpm.read()
        except pynvml.NVMLError as e:
            self._failed(g, "nvmlGpmSampleGet", e.value)
            return []
        if vals is None:
            return []
        n = gpm.n_scalar
        for col, v in zip(gpm.columns[:n], vals[:n], strict=True):
            if v is not None:
                row[col] = round(v)
        return list(zip(gpm.columns[n:], vals[n:], strict=True))

    def _read_counters(self, g: _Gpu, counters: NvlinkCounters, row: dict) -> list[tuple[str, float | None]]:
        """NVLink rates from the field counters (no GPM): totals into `row`, the per-link rates returned."""
        try:
            links, any_ok = counters.read()
        except pynvml.NVMLError as e:
            self._failed(g, "nvmlDeviceGetFieldValues", e.value)
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

    def _read_slow(self, g: _Gpu, now: float) -> None:
        """Energy (≈4 ms of CPU per call on an H200), ECC and remapped rows: once per slow interval."""
        h = g.handle
        call = self._call
        g.slow_due = now + self.slow_interval_s
        s: dict[str, Any] = {}
        e = call(g, "nvmlDeviceGetTotalEnergyConsumption", h)
        s["energy_j"] = None if e is None else e // 1000
        s["ecc_corrected"] = self._call_as(g, "ecc_corrected", "nvmlDeviceGetTotalEccErrors", h,
                                           E.NVML_MEMORY_ERROR_TYPE_CORRECTED, E.NVML_VOLATILE_ECC)
        s["ecc_uncorrected"] = self._call_as(g, "ecc_uncorrected", "nvmlDeviceGetTotalEccErrors", h,
                                             E.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, E.NVML_VOLATILE_ECC)
        rr = call(g, "nvmlDeviceGetRemappedRows", h)
        s["remapped_rows_pending"] = None if rr is None else int(bool(rr[2]))
        s["remapped_rows_failed"] = None if rr is None else int(bool(rr[3]))
        g.slow = s


NVLINK_PROBE_LINKS = 18
PROCESS_SM_WINDOW_US = 2_000_000  # NVML samples process utilisation every ~1/6 s; 2 s always holds some
