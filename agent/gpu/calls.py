"""How the GPU sampler calls NVML: one failed call leaves its metric NULL on that GPU only, never an exception.

`NvmlCaller` owns the error policy every reader shares. NOT_SUPPORTED and FUNCTION_NOT_FOUND switch the function
off on that GPU for good (reported once); NO_PERMISSION switches it off until the next slow interval (a udev rule
may change); GPU_IS_LOST raises `Lost` (the sampler marks the GPU lost) and a library out of step with the
kernel module raises `Reinit` (the sampler tears NVML down). `Reporter` is the once-only book of events.
`Gpu` is what the sampler knows about one GPU between ticks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

from lynxtop.agent.gpu.gpm import GpmReader
from lynxtop.agent.gpu.nvlink import NvlinkCounters
from lynxtop.contract.events import EventKind, log_level

log = logging.getLogger("lynxtop.gpu")

EventSink = Callable[[EventKind, str, str, dict | None], None]  # (kind, severity, message, details)

E = pynvml
# the library itself is gone or out of step with the kernel module: only a fresh nvmlInit can help
REINIT_CODES = {E.NVML_ERROR_LIB_RM_VERSION_MISMATCH, E.NVML_ERROR_UNINITIALIZED, E.NVML_ERROR_DRIVER_NOT_LOADED}
_PERMANENT_CODES = {E.NVML_ERROR_NOT_SUPPORTED, E.NVML_ERROR_FUNCTION_NOT_FOUND}

# functions an older driver lacks, and what is read instead
FALLBACKS = {
    "nvmlDeviceGetMemoryInfo_v2": "nvmlDeviceGetMemoryInfo (no reserved-memory figure)",
    "nvmlDeviceGetCurrentClocksEventReasons": "nvmlDeviceGetCurrentClocksThrottleReasons",
}


def error_name(code: int) -> str:
    for k, v in vars(pynvml).items():
        if k.startswith("NVML_ERROR_") and v == code:
            return k
    return f"NVML error {code}"


class Lost(Exception):
    """GPU_IS_LOST: the GPU is marked lost and probed again later."""


class Reinit(Exception):
    """The library needs a fresh nvmlInit (driver upgraded or unloaded under us)."""

    def __init__(self, code: int, where: str, gpu: int | None = None):
        super().__init__(f"{error_name(code)} in {where}")
        self.code = code
        self.gpu = gpu  # the GPU whose call answered it (None: no one GPU's), see GpuSampler.sample


@dataclass
class Gpu:
    """One GPU between ticks: its static facts (read once per (re)initialisation) and its per-GPU state."""

    idx: int
    handle: Any
    uuid: str = ""
    name: str = ""
    pci_bus_id: str = ""
    serial: str | None = None  # None: the board keeps none (NOT_SUPPORTED) or it could not be read
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
    kept: dict = field(default_factory=dict)  # readings renewed about once a second (readers.DeviceReadings)
    kept_at: float | None = None  # when `kept`, `proc_rows` and `link_row` were read (None: read next tick)
    proc_rows: list[dict] = field(default_factory=list)  # the compute processes as last read
    link_row: dict | None = None  # the per-link NVLink rates as last read
    sm_seen_us: int = 0  # NVML time stamp the next process-utilisation read asks from
    # a row of this GPU before the tick's own readings (the column template, `kept`, `slow`): copied as each
    # tick's row until `kept` or `slow` is read again (None: build it again)
    row_base: dict | None = None
    fails: int = 0  # failed calls (NOT_FOUND aside) so far: a tick that moved it is looked at (unreadable.py)
    bad_since: float | None = None  # first of the ticks in a row in which every reading failed
    bad_ticks: int = 0  # ... and how many
    # a fresh nvmlInit reproduced a re-init code on this GPU alone: its codes are this GPU's failures, not the
    # library's (GpuSampler.sample), so the other GPUs are not torn down with it again and again
    reinit_local: bool = False


class Reporter:
    """Events to the sink, and which (kind, key) pairs were already reported once. The sink logs what it takes
    (agent/events.py: one line per event, at its severity's level); the log gets the event here only where there
    is no sink, or the sink failed, so no event is two journal lines."""

    def __init__(self, on_event: EventSink | None):
        self.on_event = on_event
        self._reported: set[tuple[str, str]] = set()

    def event(self, kind: EventKind, severity: str, message: str, details: dict | None = None) -> None:
        """To the sink; to the log at the severity's level where no sink takes it (one line either way)."""
        if self.on_event is not None:
            try:
                self.on_event(kind, severity, message, details)
                return
            except Exception:  # a broken sink must not stop sampling, nor lose the event from the log
                log.exception("GPU event sink failed on %s", kind)
        log.log(log_level(severity), "%s", message)

    def once(self, kind: str, key: str) -> bool:
        if (kind, key) in self._reported:
            return False
        self._reported.add((kind, key))
        return True

    def forget(self, kind: str, key: str) -> bool:
        """Report (kind, key) again next time (the condition ended); whether it had been reported."""
        if (kind, key) not in self._reported:
            return False
        self._reported.discard((kind, key))
        return True


class NvmlCaller:
    """Calls the open backend `b` for one GPU and books every failure; see the module docstring."""

    def __init__(self, reporter: Reporter, slow_interval_s: float, clock: Callable[[], float]):
        self.b: Any = None  # the GpuBackend while NVML is open
        self._r = reporter
        self.slow_interval_s = slow_interval_s
        self._clock = clock

    def call(self, g: Gpu, name: str, *args: Any) -> Any:
        """The function's answer, or None when it failed (its metric is then NULL)."""
        if name in g.off:
            return None
        try:
            return getattr(self.b, name)(*args)
        except pynvml.NVMLError as e:
            return self.failed(g, name, e.value)

    def call_as(self, g: Gpu, key: str, name: str, *args: Any, **kw: Any) -> Any:
        """`call` where one function reads two metrics (`key` is what gets switched off on failure)."""
        if key in g.off:
            return None
        try:
            return getattr(self.b, name)(*args, **kw)
        except pynvml.NVMLError as e:
            return self.failed(g, key, e.value, name)

    def failed(self, g: Gpu, key: str, code: int, name: str | None = None) -> None:
        """Book-keeping for one failed call; `key` is what gets switched off, `name` what is reported."""
        if name is None or key in FALLBACKS:
            name = key
        if code == E.NVML_ERROR_GPU_IS_LOST:
            raise Lost()
        if code in REINIT_CODES and not g.reinit_local:
            raise Reinit(code, key, g.idx)
        if code != E.NVML_ERROR_NOT_FOUND:  # NOT_FOUND is an answer (no process sample since)
            g.fails += 1
        r = self._r
        if code in _PERMANENT_CODES:
            g.off.add(key)
            if code == E.NVML_ERROR_FUNCTION_NOT_FOUND and r.once("missing_function", name):
                instead = FALLBACKS.get(name)
                r.event(EventKind.NVML_MISSING_FUNCTION, "info" if instead else "warning",
                        f"NVML function {name} is missing in this driver (FUNCTION_NOT_FOUND): "
                        + (f"using {instead}" if instead else "its metrics stay empty"),
                        {"function": name, "gpu": g.idx})
            elif code == E.NVML_ERROR_NOT_SUPPORTED:
                log.debug("GPU %d: %s not supported", g.idx, key)
        elif code == E.NVML_ERROR_NO_PERMISSION:
            g.off.add(key)
            g.denied_at[key] = self._clock()
            if r.once("no_permission", name):
                r.event(EventKind.NVML_NO_PERMISSION, "warning",
                        f"NVML denied {name} on GPU {g.idx} (NO_PERMISSION); retried every "
                        f"{self.slow_interval_s:g} s", {"function": name, "gpu": g.idx})
        elif code != E.NVML_ERROR_NOT_FOUND and r.once("nvml_error", f"{g.idx}:{key}:{code}"):
            log.warning("GPU %d: %s failed with %s (metric left empty; further failures not logged)",
                        g.idx, name, error_name(code))
        return None

    def retry_denied(self, g: Gpu, now: float) -> None:
        """NO_PERMISSION can be granted later (e.g. a changed udev rule): ask again every slow interval."""
        for key, t in g.denied_at.items():
            if now - t >= self.slow_interval_s:
                g.off.discard(key)
                g.denied_at[key] = now
