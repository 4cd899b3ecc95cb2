"""A GPU, or one facility of it (GPM, XID events), left out of an NVML initialisation by a failure that is no
NVMLError (a bug, an odd answer): told as an event `gpu.setup_failed`, not only logged.

Such a failure stays local to its GPU or facility (the others are sampled), which made it easy to miss: an
operator watching the dashboard never saw that GPU 3 was not sampled. The event names the GPU (None: every GPU,
for the XID event set), the facility and the error, escaped and cut (an exception's text is foreign: it may hold
a driver's answer). It is told once per occurrence: not on every tick, nor on every re-initialisation the failure
persists through; once the GPU or facility is set up fine again, `gpu.recovered` says so and a later failure is a
new occurrence, told again.
"""

from __future__ import annotations

from lynxtop.agent.gpu.calls import Reporter, log
from lynxtop.contract.events import EventKind
from lynxtop.contract.terminal import terminal_safe

ERROR_CHARS = 240  # an error's text is cut to this (escaped first: an escape is never cut in half by the cut)

# facility -> (severity of its `gpu.setup_failed`, its name, what is left out, what is told once set up again)
_FACILITIES: dict[str, tuple[str, str, str, str]] = {
    "gpu": ("error", "the GPU", "not sampled (no row) until NVML is re-initialised", "sampled again"),
    "gpm": ("warning", "GPM", "sampled without GPM (SM/tensor/DRAM activity and PCIe stay empty) until NVML is "
                              "re-initialised", "its GPM activity is read again"),
    "xid": ("warning", "XID events", "XID errors not read until NVML is re-initialised", "XID errors are read again"),
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
        severity, name, left, _ = _FACILITIES[facility]
        what = "setting it up" if facility == "gpu" else f"setting up {name}"
        message = f"{_where(gpu)}: {what} failed ({text}): {left}"
        log.error("%s (logged once)", message)
        self._r.event(EventKind.GPU_SETUP_FAILED, severity, message,
                      {"gpu": gpu, "facility": facility, "error": text}, logged=True)

    def fine(self, gpu: int | None, facility: str, tell: bool = True) -> None:
        """`facility` of `gpu` is set up: a failure told before is over (`gpu.recovered` unless not `tell`, as
        for GPM switched off by configuration), and a later one is told again."""
        if self._r.forget("left_out", f"{gpu}:{facility}") and tell:
            _, name, _, back = _FACILITIES[facility]
            what = "set up again" if facility == "gpu" else f"{name} set up again"
            self._r.event(EventKind.GPU_RECOVERED, "info", f"{_where(gpu)}: {what} as NVML re-initialised: {back}",
                          {"gpu": gpu, "facility": facility})


def _where(gpu: int | None) -> str:
    return f"GPU {gpu}" if gpu is not None else "every GPU"

