"""XID critical errors, read from NVML's event set by the sampler's tick (no thread of their own).

XIDs are edge events (a kernel fault, a double-bit ECC error, a GPU fallen off the bus). NVML queues each one in
the event set until it is read (on Linux with its own XID number; the kernel keeps a list per open file), so a
poll with no timeout once a tick misses none: `poll` reads what came since the last tick, at most `limit` a tick
(the rest wait for the next). An XID is thus reported with the tick after it happened, within one sampling
interval, which is when the node hands its GPU events to the store anyway; a dedicated thread blocked in
`nvmlEventSetWait_v2` cost two wake-ups a second for that (issue 29.3). `on_event` is called from the thread that
samples (the clock thread).

XIDs are told once per episode of (GPU, XID) (`XidEpisodes`), as the scrape side tells its troubles
(agent/coalesce.py): a GPU in trouble raises the same XID hundreds of times a minute, and one event each buried
everything else in the event list. The first XID of an episode is an event at once, whatever its severity; the
repeats are counted, and told when the XID has been quiet for XID_QUIET_S (the episode is over), every
XID_SUMMARY_S while it goes on, or when the episode stops being tracked (the cap on open episodes, the sampler
closing). The first XID's event is what one XID always gave (`details = {"gpu", "xid"}`); a count event adds
`episode` ("ongoing", "closed", "untracked"), `times` (the episode's XIDs so far), `span_s` and `count`, the XIDs
no earlier event counted: `details.get("count", 1)` over every `gpu.xid` event adds up to every XID read. Times
are the sampler's monotonic clock, never the wall clock (it can step). At most MAX_XID_EPISODES are open.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
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
XID_QUIET_S = 60.0  # an episode of (GPU, XID) is over once that XID has not come for this long
XID_SUMMARY_S = 600.0  # an episode still going tells its count this often (a flood may never quiet)
MAX_XID_EPISODES = 128  # open episodes kept; past it the least recently seen one is told and dropped


@dataclass
class _Episode:
    """One open episode of one XID on one GPU (times on the sampler's monotonic clock)."""

    severity: str
    what: str
    first: float
    last: float
    told_at: float  # when the episode's last event was made
    times: int = 1  # XIDs of the episode
    told: int = 1  # of them, counted by an event already


class XidEpisodes:
    """The open episodes of (GPU, XID) and their events: `hit` for each XID read, `tick` once a tick (before the
    poll, so that an XID after a quiet spell opens a new episode), `flush` when the sampler stops. Lives as long as
    the sampler, so that a flood on both sides of an NVML re-initialisation is one episode."""

    def __init__(self, on_event: EventSink, quiet_s: float = XID_QUIET_S, summary_s: float = XID_SUMMARY_S,
                 max_open: int | None = None, on_xid: Callable[[int | None], None] | None = None):
        self._on_event = on_event
        self._on_xid = on_xid  # every XID read, at once (a counter's rate cannot wait for the episode's count event)
        self.quiet_s = quiet_s
        self.summary_s = summary_s
        self._max_open = max_open  # None: MAX_XID_EPISODES, read when needed
        self._open: dict[tuple[int | None, int], _Episode] = {}
        self._next_check = float("inf")  # no episode can close or be due a summary before this

    def __len__(self) -> int:
        return len(self._open)

    def hit(self, gpu: int | None, xid: int, now: float) -> None:
        """One XID read at `now`: told at once if it opens an episode, else counted."""
        if self._on_xid is not None:
            try:
                self._on_xid(gpu)
            except Exception:  # a broken counter must not stop the poll
                log.exception("XID counter failed")
        ep = self._open.get((gpu, xid))
        if ep is not None:
            ep.times += 1
            ep.last = now
            return
        cap = MAX_XID_EPISODES if self._max_open is None else self._max_open
        while self._open and len(self._open) >= max(cap, 1):  # bounded: the least recently seen one goes
            old = min(self._open, key=lambda k: self._open[k].last)
            gone = self._open.pop(old)
            if gone.times > gone.told:
                self._tell(old, gone, "untracked", now)
        severity, what = XID_INFO.get(xid, ("error", "see NVIDIA's XID catalogue"))
        self._open[(gpu, xid)] = _Episode(severity, what, now, now, now)
        self._next_check = min(self._next_check, now + min(self.quiet_s, self.summary_s))
        # the first XID's event is what one XID always gave (details {"gpu", "xid"}: a count of 1 by default)
        self._emit(severity, f"XID {xid} on {_where(gpu)}: {what}", {"gpu": gpu, "xid": xid})

    def tick(self, now: float) -> None:
        """Close the episodes quiet for `quiet_s` (their count told if they repeated) and tell the count of those
        going on for `summary_s` since their last event. Nothing to do (one comparison) until one is due."""
        if now < self._next_check:
            return
        nxt = float("inf")
        for key, ep in list(self._open.items()):
            if now - ep.last >= self.quiet_s:
                del self._open[key]
                if ep.times > ep.told:
                    self._tell(key, ep, "closed", now)
                continue
            if ep.times > ep.told and now - ep.told_at >= self.summary_s:
                self._tell(key, ep, "ongoing", now)
            nxt = min(nxt, ep.last + self.quiet_s, ep.told_at + self.summary_s)
        self._next_check = nxt

    def flush(self, now: float) -> None:
        """The sampler stops: tell every open episode's untold repeats, and forget them."""
        open_, self._open = self._open, {}
        self._next_check = float("inf")
        for key, ep in open_.items():
            if ep.times > ep.told:
                self._tell(key, ep, "untracked", now)

    def _tell(self, key: tuple[int | None, int], ep: _Episode, episode: str, now: float) -> None:
        """The event with an episode's count: the XIDs since its last event are `count`."""
        gpu, xid = key
        new, span = ep.times - ep.told, round(ep.last - ep.first, 1)
        ep.told, ep.told_at = ep.times, now
        how = {"closed": f"none for {self.quiet_s:g} s since: the episode is over (one event for it)",
               "ongoing": f"{new} since the last event; still going (a count every {self.summary_s:g} s)",
               "untracked": "no longer tracked (too many XID episodes at once, or the sampler stopped): "
                            "a further one opens a new episode"}[episode]
        self._emit(ep.severity, f"XID {xid} on {_where(gpu)}: {ep.what}; {ep.times} times in {span:g} s, {how}",
                   {"gpu": gpu, "xid": xid, "episode": episode, "times": ep.times, "count": new, "span_s": span})

    def _emit(self, severity: str, message: str, details: dict) -> None:
        try:
            self._on_event(EventKind.GPU_XID, severity, message, details)
        except Exception:  # a broken sink must not stop the poll
            log.exception("XID event sink failed")


def _where(gpu: int | None) -> str:
    return f"GPU {gpu}" if gpu is not None else "a GPU"


class XidWatcher:
    """Registers every GPU for XID events and hands each one read, when the sampler polls (once a tick), to the
    episodes (`XidEpisodes`), which tell it as an event `gpu.xid` once per episode."""

    def __init__(self, backend: GpuBackend, on_event: EventSink, limit: int = XIDS_PER_TICK,
                 episodes: XidEpisodes | None = None, clock: Callable[[], float] = time.monotonic,
                 on_wait: Callable[[BaseException | None], None] | None = None):
        self._b = backend
        self._limit = limit
        self._episodes = episodes if episodes is not None else XidEpisodes(on_event)
        self._clock = clock
        self._es: Any = None
        # a wait failed at the last poll: said once until one works again. None: no wait yet (the watcher of an
        # earlier initialisation may have been failing: the first wait that works says it works)
        self._failing: bool | None = None
        self._on_wait = on_wait  # (error) when waits start failing, (None) when one works again; else logged
        self.registered: list[int] = []
        self.failed: dict[int, BaseException] = {}  # GPUs whose registration failed with no NVMLError (a bug)
        self.delivered = 0

    def start(self) -> bool:
        """Create the event set and register every GPU; False (and no event set) where no GPU supports XIDs."""
        try:
            self._es = self._b.nvmlEventSetCreate()
            for i in range(self._b.nvmlDeviceGetCount()):
                self.register(i)
        except pynvml.NVMLError as e:
            log.warning("XID events unavailable: %s", e)
            self.close()
            return False
        if not self.registered:
            self.close()
            return False
        return True

    def register(self, i: int) -> bool:
        """GPU `i` into the event set (at `start`, or later: a GPU lost while NVML enumerated that answers again);
        whether it is registered. An NVMLError leaves its XIDs out (logged), any other failure is in `failed`."""
        if self._es is None or i in self.registered:
            return i in self.registered
        try:
            h = self._b.nvmlDeviceGetHandleByIndex(i)
            self._b.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, self._es)
        except pynvml.NVMLError as e:
            log.info("GPU %d: XID events unavailable (%s)", i, e)
            return False
        except Exception as e:  # a bug or an odd answer: this GPU's XIDs only (the sampler tells it)
            self.failed[i] = e
            return False
        self.failed.pop(i, None)
        self.registered.append(i)
        return True

    def poll(self, now: float | None = None) -> int:
        """Deliver the XIDs waiting in the event set, at most `limit`, as read at `now` (the tick's time; the
        watcher's clock if None); never blocks, never raises. A failing wait ends this poll (the next tick tries
        again: no spin) and is told once (`on_wait`, else the log) until a wait works again, which is told too."""
        es = self._es
        if es is None:
            return 0
        if now is None:
            now = self._clock()
        n = 0
        while n < self._limit:
            try:
                data = self._b.nvmlEventSetWait_v2(es, 0)
            except pynvml.NVMLError as e:
                if e.value == pynvml.NVML_ERROR_TIMEOUT:  # nothing (more) waiting
                    if self._failing is not False:
                        self._waits(None)
                elif not self._failing:
                    self._waits(e)
                return n
            if self._failing is not False:
                self._waits(None)
            n += 1
            if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                self._deliver(data, now)
        return n

    def _waits(self, error: BaseException | None) -> None:
        """Waits fail from now on (`error`) or work again (None): told to `on_wait`, else logged."""
        was, self._failing = self._failing, error is not None
        if self._on_wait is not None:
            try:
                self._on_wait(error)
            except Exception:  # a broken sink must not stop the poll
                log.exception("XID wait sink failed")
        elif error is not None:
            log.warning("waiting for XID events failed: %s (retrying each tick)", error)
        elif was:
            log.info("waiting for XID events works again")

    def _deliver(self, data: Any, now: float) -> None:
        xid = int(data.eventData)
        try:
            gpu: int | None = int(self._b.nvmlDeviceGetIndex(data.device))
        except pynvml.NVMLError:
            gpu = None
        self.delivered += 1
        self._episodes.hit(gpu, xid, now)

    def close(self) -> None:
        """Free the event set (before nvmlShutdown: the sampler's teardown calls this first)."""
        es, self._es = self._es, None
        if es is not None:
            try:
                self._b.nvmlEventSetFree(es)
            except pynvml.NVMLError:
                pass
