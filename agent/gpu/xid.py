"""XID critical errors, delivered by NVML's event set to a dedicated thread.

XIDs are edge events (a kernel fault, a double-bit ECC error, a GPU fallen off the bus): polling would miss
them between ticks, so a thread blocks in nvmlEventSetWait_v2 with a short timeout, which also bounds how long
`stop()` takes. `on_event` is called from that thread: the sink must be thread-safe (the node's EventCollector is).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pynvml

from lynxtop.agent.gpu.protocol import GpuBackend
from lynxtop.contract.events import EventKind

log = logging.getLogger("lynxtop.gpu.xid")

# The XIDs an operator of a serving node meets most; severity "critical" means the GPU likely needs a reset.
XID_INFO: dict[int, tuple[str, str]] = {
    13: ("error", "graphics engine exception (often an application fault)"),
    31: ("error", "GPU memory page fault (often an application fault)"),
    43: ("warning", "GPU stopped processing (application reset)"),
    45: ("warning", "preemptive cleanup after a fault"),
    48: ("critical", "double-bit ECC error"),
    61: ("critical", "internal micro-controller breakpoint/warning"),
    62: ("critical", "internal micro-controller halt"),
    63: ("warning", "ECC page retirement or row remapping recorded"),
    64: ("critical", "ECC page retirement or row remapping failed"),
    74: ("critical", "NVLink error"),
    79: ("critical", "GPU has fallen off the bus"),
    92: ("warning", "high single-bit ECC error rate"),
    94: ("error", "contained ECC error (the affected application was stopped)"),
    95: ("critical", "uncontained ECC error: reset the GPU"),
    119: ("critical", "GSP RPC timeout"),
    120: ("critical", "GSP error"),
    140: ("critical", "unrecovered ECC error"),
}

EventSink = Callable[[EventKind, str, str, dict | None], None]


class XidWatcher:
    """Registers every GPU for XID events and reports each one as an event `gpu.xid` with the XID number."""

    def __init__(self, backend: GpuBackend, on_event: EventSink, wait_ms: int = 500):
        self._b = backend
        self._on_event = on_event
        self._wait_ms = wait_ms
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._es: Any = None
        self.registered: list[int] = []
        self.delivered = 0

    def start(self) -> bool:
        """Start watching; False (and no thread) where no GPU supports XID events."""
        try:
            self._es = self._b.nvmlEventSetCreate()
            for i in range(self._b.nvmlDeviceGetCount()):
                try:
                    h = self._b.nvmlDeviceGetHandleByIndex(i)
                    self._b.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, self._es)
                    self.registered.append(i)
                except pynvml.NVMLError as e:
                    log.info("GPU %d: XID events unavailable (%s)", i, e)
        except pynvml.NVMLError as e:
            log.warning("XID events unavailable: %s", e)
            return False
        if not self.registered:
            self._free()
            return False
        self._thread = threading.Thread(target=self._run, name="lynxtop-xid", daemon=True)
        self._thread.start()
        return True

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                data = self._b.nvmlEventSetWait_v2(self._es, self._wait_ms)
            except pynvml.NVMLError as e:
                if e.value == pynvml.NVML_ERROR_TIMEOUT:
                    failures = 0
                    continue
                failures += 1
                if failures == 1:
                    log.warning("waiting for XID events failed: %s (retrying)", e)
                self._stop.wait(min(5.0, 0.1 * failures))  # never spin on a persistent error
                continue
            failures = 0
            if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                self._deliver(data)

    def _deliver(self, data: Any) -> None:
        xid = int(data.eventData)
        try:
            gpu: int | None = int(self._b.nvmlDeviceGetIndex(data.device))
        except pynvml.NVMLError:
            gpu = None
        severity, what = XID_INFO.get(xid, ("error", "see NVIDIA's XID catalogue"))
        where = f"GPU {gpu}" if gpu is not None else "a GPU"
        self.delivered += 1
        try:
            self._on_event(EventKind.GPU_XID, severity, f"XID {xid} on {where}: {what}", {"gpu": gpu, "xid": xid})
        except Exception:
            log.exception("XID event sink failed")

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("XID watcher did not stop within %.1f s", timeout)
                return  # leave the event set alone while the thread may still use it
            self._thread = None
        self._free()

    def _free(self) -> None:
        if self._es is not None:
            try:
                self._b.nvmlEventSetFree(self._es)
            except pynvml.NVMLError:
                pass
            self._es = None
