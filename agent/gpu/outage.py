"""One episode of NVML being down, from its first failure until NVML has sampled cleanly for `settle_s`.

A wedged driver can let nvmlInit and enumeration succeed while every reading answers a re-init code
(UNINITIALIZED, DRIVER_NOT_LOADED, LIB_RM_VERSION_MISMATCH): the sampler used to tear NVML down and open it again
each second, forever, with an `nvml.reinit` event pair, log lines and a `static_version` bump each time. Now the
episode is told twice: when it starts (`nvml.reinit`, warning; or `nvml.unavailable` from the failed nvmlInit, as
before) and when NVML has sampled cleanly for `settle_s` since its last (re)initialisation (`nvml.reinit` info,
or `nvml.available` where NVML had not worked since the agent started), with the re-initialisations and failed
tries counted. The backoff between tries grows through the whole episode (GpuSampler), so a loop costs at most
one initialisation a `retry_max_s`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lynxtop.agent.gpu.calls import Reinit, Reporter, log
from lynxtop.contract.events import EventKind


@dataclass
class NvmlOutage:
    """What one episode counted; `since` is the sampler's monotonic clock."""

    since: float
    at_start: bool  # NVML has not worked since the agent started: the end is `nvml.available`
    reinits: int = 0  # times NVML was torn down for a re-init code
    failed_tries: int = 0  # nvmlInit (or enumeration) tries that failed
    local: dict[int, str] = field(default_factory=dict)  # GPU -> the re-init code it alone kept answering

    def reinit(self, r: Reporter, e: Reinit) -> None:
        """NVML torn down for `e`: the first of the episode is told (warning), the others counted."""
        self.reinits += 1
        if self.reinits == 1 and not self.at_start:
            r.event(EventKind.NVML_REINIT, "warning", f"NVML needs re-initialising ({e}); retrying with backoff "
                    "(told again once NVML has sampled cleanly)", {"code": e.code})
        else:
            log.debug("NVML needs re-initialising again (%s): %d time(s) in this episode", e, self.reinits)

    def end(self, r: Reporter, now: float, settle_s: float, driver: str, gpus: int) -> None:
        """NVML has sampled cleanly for `settle_s`: the episode's one closing event, with its counts."""
        span = round(now - settle_s - self.since, 1)
        counts = (f"{self.reinits} re-initialisation(s) and {self.failed_tries} failed tr"
                  f"{'y' if self.failed_tries == 1 else 'ies'} in {span:g} s")
        local = "".join(f"; GPU {i} alone kept answering {code}: taken as that GPU's failure (its readings "
                        "stay empty while it does)" for i, code in sorted(self.local.items()))
        details = {"driver_version": driver, "gpus": gpus, "reinits": self.reinits,
                   "failed_tries": self.failed_tries, "span_s": span, "gpu_failures": sorted(self.local)}
        if self.at_start and not self.reinits:
            r.event(EventKind.NVML_AVAILABLE, "info", f"NVML available: driver {driver}, {gpus} GPU(s); sampled "
                    f"cleanly for {settle_s:g} s after {counts}{local}", details)
        else:
            r.event(EventKind.NVML_REINIT, "info", f"NVML re-initialised: driver {driver}, {gpus} GPU(s); sampled "
                    f"cleanly for {settle_s:g} s after {counts}{local}", details)
