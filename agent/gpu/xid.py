"""XID critical errors, read from NVML's event set by the sampler's tick (no thread of their own).

XIDs are edge events (a kernel fault, a double-bit ECC error, a GPU fallen off the bus). NVML queues each one in
the event set until it is read (on Linux with its own XID number; the kernel keeps a list per open file), so a
poll with no timeout once a tick misses none: `poll` reads what came since the last tick, at most `limit` a tick
(the rest wait for the next). An XID is thus reported with the tick after it happened, within one sampling
interval, which is when the node hands its GPU events to the store anyway; a dedicated thread blocked in
`nvmlEventSetWait_v2` cost two wake-ups a second for that (issue 29.3). `on_event` is called from the thread that
samples (the clock thread).
"""

from __future__ import annotations

import logging
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

XIDS_PER_TICK = 64  # a burst larger than this is read over the next ticks, never in one long tick


class XidWatcher:
    """Registers every GPU for XID events and reports each one as an event `gpu.xid` with the XID number, when
    the sampler polls (once a tick)."""

    def __init__(self, backend: GpuBackend, on_event: EventSink, limit: int = XIDS_PER_TICK):
        self._b = backend
        self._on_event = on_event
        self._limit = limit
        self._es: Any = None
        self._failing = False  # a wait failed at the last poll: said once until one works again
        self.registered: list[int] = []
        self.delivered = 0

    def start(self) -> bool:
        """Create the event set and register every GPU; False (and no event set) where no GPU supports XIDs."""
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
            self.close()
            return False
        if not self.registered:
            self.close()
            return False
        return True

    def poll(self) -> int:
        """Deliver the XIDs waiting in the event set, at most `limit`; never blocks, never raises. A failing wait
        ends this poll (the next tick tries again: no spin) and is logged once until a wait works again."""
        es = self._es
        if es is None:
            return 0
        n = 0
        while n < self._limit:
            try:
                data = self._b.nvmlEventSetWait_v2(es, 0)
            except pynvml.NVMLError as e:
                if e.value == pynvml.NVML_ERROR_TIMEOUT:  # nothing (more) waiting
                    self._failing = False
                elif not self._failing:
                    self._failing = True
                    log.warning("waiting for XID events failed: %s (retrying each tick)", e)
                return n
            self._failing = False
            n += 1
            if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                self._deliver(data)
        return n

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

    def close(self) -> None:
        """Free the event set (before nvmlShutdown: the sampler's teardown calls this first)."""
        es, self._es = self._es, None
        if es is not None:
            try:
                self._b.nvmlEventSetFree(es)
            except pynvml.NVMLError:
                pass
