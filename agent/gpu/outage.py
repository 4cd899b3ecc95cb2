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

from lynxtop.agent.gpu.calls import Gpu, Reinit, Reporter, error_name, log
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


class NvmlRetry:
    """When NVML is opened again, and the outage it is in. The backoff grows through a whole outage and starts over
    only once NVML has sampled cleanly for `settle_s` since its last (re)initialisation: a driver whose readings
    answer a re-init code right after every nvmlInit is not opened again each second."""

    def __init__(self, r: Reporter, initial_s: float, max_s: float, settle_s: float):
        self._r = r
        self.initial_s, self.max_s, self.settle_s = initial_s, max_s, settle_s
        self.delay = initial_s  # the wait before the next try
        self.next_attempt = 0.0
        self.settle_at = float("inf")  # the tick at or after this has sampled cleanly for settle_s: `settled`
        self.outage: NvmlOutage | None = None  # NVML down: told when it starts and when it ends
        self.suspect: int | None = None  # the GPU whose re-init code started the last re-initialisation

    def opened(self, now: float, driver: str, gpus: int) -> None:
        self.settle_at = now + self.settle_s
        if self.outage is not None:
            log.debug("NVML initialised again (driver %s, %d GPU(s)); the outage is told over once NVML has "
                      "sampled cleanly for %g s", driver, gpus, self.settle_s)

    def open_failed(self, now: float, no_driver: bool, at_start: bool) -> float:
        """A failed try: the wait before the next (returned), the outage counted (any state reported down)."""
        delay = self.delay
        self.next_attempt = now + delay
        self.delay = min(delay * 2, self.max_s * (5 if no_driver else 1))
        self.settle_at = float("inf")
        if self.outage is None:
            self.outage = NvmlOutage(now, at_start=at_start)
        self.outage.failed_tries += 1
        return delay

    def reinit(self, now: float, e: Reinit) -> float:
        """NVML torn down for `e`: the wait before it is opened again (returned)."""
        self.suspect = e.gpu
        delay = self.delay
        if self.outage is None:
            self.outage = NvmlOutage(now, at_start=False)
            self._r.forget("nvml_open_failed", "error")
            self._r.forget("nvml_open_failed", "no-driver")
        else:  # again within the outage (NVML opened, a reading answered a re-init code before it settled)
            self.delay = min(delay * 2, self.max_s)
        self.outage.reinit(self._r, e)
        self.settle_at = float("inf")
        self.next_attempt = now + delay
        return delay

    def settled(self, now: float, driver: str, gpus: int) -> None:
        """NVML has sampled cleanly for settle_s: the backoff starts over, an outage ends with its closing event."""
        self.settle_at = float("inf")
        self.delay = self.initial_s
        self.suspect = None
        outage, self.outage = self.outage, None
        if outage is not None:
            self._r.forget("nvml_open_failed", "error")  # a later outage's failed tries are told again
            self._r.forget("nvml_open_failed", "no-driver")
            outage.end(self._r, now, self.settle_s, driver, gpus)

    def local(self, g: Gpu, e: Reinit, gpus: list[Gpu]) -> bool:
        """Whether `g`'s re-init code is taken as its own failure: the re-initialisation it started reproduced
        it on `g` (the same GPU, first of the tick to answer so) while another GPU is sampled. Re-initialising the
        whole library again would lose every GPU's rows each time, and would not help."""
        if e.gpu != g.idx or g.idx != self.suspect or g.reinit_local or self.outage is None:
            return False
        if sum(1 for x in gpus if not x.lost) < 2:  # one GPU: nothing tells it from the library
            return False
        g.reinit_local = True
        self.outage.local[g.idx] = error_name(e.code)
        log.warning("GPU %d answers %s again after NVML was re-initialised, the other GPUs do not: taken as GPU "
                    "%d's failure (its readings stay empty while it does), NVML is not re-initialised for it",
                    g.idx, e, g.idx)
        return True
