"""A GPU, or one facility of it (GPM, XID events), left out of an NVML initialisation by a failure that is no
NVMLError (a bug, an odd answer): told as an event `gpu.setup_failed`, not only logged.

Such a failure stays local to its GPU or facility (the others are sampled), which made it easy to miss: an
operator watching the dashboard never saw that GPU 3 was not sampled. The event names the GPU (None: every GPU,
for the XID event set), the facility and the error, escaped and cut (an exception's text is foreign: it may hold
a driver's answer). It is told once per occurrence: not on every tick, nor on every re-initialisation the failure
persists through; once the GPU or facility is set up fine again, `gpu.recovered` says so and a later failure is a
new occurrence, told again.

The XID event set's wait failing after it was set up ("xid_wait": NVML's answer, any error but TIMEOUT) is told
the same way: the operator's question is the same (are XIDs read?), and one episode of it is one pair of events.
"""

from __future__ import annotations

from lynxtop.agent.gpu.calls import Reporter
from lynxtop.contract.events import EventKind
from lynxtop.contract.terminal import terminal_safe

ERROR_CHARS = 240  # an error's text is cut to this (escaped first: an escape is never cut in half by the cut)

# facility -> (severity of its `gpu.setup_failed`, what failed, what is left out, what `gpu.recovered` says, what
# is told once set up again). "xid_wait": the event set was made but waiting on it fails (tried again each tick)
_FACILITIES: dict[str, tuple[str, str, str, str, str]] = {
    "gpu": ("error", "setting it up", "not sampled (no row) until NVML is re-initialised",
            "set up again as NVML re-initialised", "sampled again"),
    "gpm": ("warning", "setting up GPM", "sampled without GPM (SM/tensor/DRAM activity and PCIe stay empty) until "
                                         "NVML is re-initialised",
            "GPM set up again as NVML re-initialised", "its GPM activity is read again"),
    "xid": ("warning", "setting up XID events", "XID errors not read until NVML is re-initialised",
            "XID events set up again as NVML re-initialised", "XID errors are read again"),
    "xid_wait": ("warning", "waiting for XID events", "XID errors are not read while it fails (tried each tick)",
                 "waiting for XID events works again", "XID errors are read again (those queued meanwhile too)"),
}


def error_text(error: BaseException) -> str:
    """`Type: message`, every control character escaped, cut to ERROR_CHARS; never raises (an odd `__str__`)."""
    try:
        text = f"{type(error).__name__}: {error}"
    except Exception:  # noqa: BLE001 - an exception whose text cannot be had still has a type
        text = f"{type(error).__name__}: (no text)"
    text = terminal_safe(text)
    return text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS - 1] + "…"


class LeftOut:
    """Which (GPU, facility) pairs are left out of sampling by a setup failure, told once per occurrence."""

    def __init__(self, reporter: Reporter):
        self._r = reporter

    def failed(self, gpu: int | None, facility: str, error: BaseException) -> None:
        """`facility` of `gpu` (None: every GPU) failed to set up with `error` and is left out."""
        if not self._r.once("left_out", f"{gpu}:{facility}"):
            return
        text = error_text(error)
        severity, what, left, _, _ = _FACILITIES[facility]
        message = f"{_where(gpu)}: {what} failed ({text}): {left}"
        # one journal line: the event's, at its severity (the sink logs it; the reporter does where there is none).
        # Its own log.error here made two lines, the first at ERROR for a warning event
        self._r.event(EventKind.GPU_SETUP_FAILED, severity, message,
                      {"gpu": gpu, "facility": facility, "error": text})

    def fine(self, gpu: int | None, facility: str, tell: bool = True) -> None:
        """`facility` of `gpu` is set up: a failure told before is over (`gpu.recovered` unless not `tell`, as
        for GPM switched off by configuration), and a later one is told again."""
        if self._r.forget("left_out", f"{gpu}:{facility}") and tell:
            _, _, _, what, back = _FACILITIES[facility]
            self._r.event(EventKind.GPU_RECOVERED, "info", f"{_where(gpu)}: {what}: {back}",
                          {"gpu": gpu, "facility": facility})


def _where(gpu: int | None) -> str:
    return f"GPU {gpu}" if gpu is not None else "every GPU"

