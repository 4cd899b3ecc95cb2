"""Per-tick GPU sampling through an NVML backend: one dict per GPU keyed by GPU_METRICS, never an exception.

Errors are normal and local: a call that fails leaves its metric NULL for that GPU only (calls.py), and so does a
value that is no reading an SQLite INTEGER can hold (below 0, at or past 2^63, NaN), whichever reader let it through:
each finished row is checked once (`_sample_gpu`), as one such value makes the store refuse the whole tick. A function
that is NOT_SUPPORTED or missing (FUNCTION_NOT_FOUND) is not called again on that GPU and is reported once; a
lost GPU is marked lost (one event) while the others keep sampling, and probed until it answers (lost.py,
which also tells another board found at a known index); a driver/library mismatch tears NVML down
and re-initialises it with backoff; no driver at all is a state ("no-driver"), not a crash. A GPU, or its GPM or
XID events, left out of an initialisation by a failure that is no NVMLError is a `gpu.setup_failed` event, once per
occurrence (left_out.py): the operator sees that a GPU is not sampled, not only the log.

`GpuSampler` owns that lifecycle and the tick; each NVML surface has its reader (readers.py): static facts,
per-tick readings, processes, GPM/NVLink activity, slow counters. XIDs are read from NVML's event set at the start
of each tick (xid.py): no thread of their own; the first of an episode of (GPU, XID) reaches the sink with the
tick after it happened, its repeats are counted and told in one later event (`XidEpisodes`, kept across
re-initialisations and told at `close`).

Cost discipline (reference/nvml.md): three rates, as DCGM's per-field update intervals. Every tick: utilisation,
power, SM clock, clock-event reasons, GPM activity with PCIe and the NVLink totals. About once a second, never
older than a second in any row (agent/gpu/refresh.py): memory, power limit, temperature, memory clock, ECC counts,
remapped rows, the compute processes with their SM share and the per-link NVLink rates; the rows in between carry
the last reading, so at 10 Hz a tick makes 6 calls a GPU instead of 14. At the slow cadence: energy (≈4 ms a call; at
most one GPU's slow read per tick, so no tick pays 8 × 4 ms). GPM structs are reused, PCIe comes from GPM
(nvmlDeviceGetPcieThroughput blocks ~21 ms and is never called), NVLink from GPM where present.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

from lynxtop.agent.gpu.calls import (
    REINIT_CODES,
    EventSink,
    Gpu,
    Lost,
    NvmlCaller,
    Reinit,
    Reporter,
    error_name,
    log,
)
from lynxtop.agent.gpu.left_out import LeftOut
from lynxtop.agent.gpu.lost import SETTLE_S as LOST_SETTLE_S
from lynxtop.agent.gpu.lost import LostGpus
from lynxtop.agent.gpu.outage import NvmlRetry
from lynxtop.agent.gpu.protocol import GpuBackend
from lynxtop.agent.gpu.readers import (
    NVLINK_PROBE_LINKS,
    PROCESS_SM_WINDOW_US,
    ActivityReadings,
    DeviceFacts,
    DeviceReadings,
    ProcessReadings,
    SlowReadings,
    _text,
)
from lynxtop.agent.gpu.refresh import MAX_AGE_S, Refresh
from lynxtop.agent.gpu.unreadable import UnreadableGpus
from lynxtop.agent.gpu.xid import XIDS_PER_TICK, XidEpisodes, XidWatcher
from lynxtop.contract.columns import GPU_METRICS, names
from lynxtop.contract.events import EventKind

__all__ = ["GPU_COLUMNS", "NVLINK_PROBE_LINKS", "PROCESS_SM_WINDOW_US", "EventSink", "GpuSampler", "GpuTick",
           "arch_name", "error_name"]

GPU_COLUMNS = names(GPU_METRICS)
_ROW_TEMPLATE = dict.fromkeys(GPU_COLUMNS)
_INT64_END = 1 << 63  # a GPU row's values are counts, rates, percentages: each 0 <= v < 2**63 (SQLite's INTEGER)

E = pynvml
_NO_DRIVER_CODES = {E.NVML_ERROR_LIBRARY_NOT_FOUND, E.NVML_ERROR_DRIVER_NOT_LOADED}
SETTLE_S = 60.0  # NVML sampled cleanly this long after a (re)initialisation: the backoff resets, an outage ends

ARCH_BY_CC_MAJOR = {6: "Pascal", 7: "Volta", 8: "Ampere", 9: "Hopper", 10: "Blackwell", 12: "Blackwell"}


def arch_name(cc: tuple[int, int] | None) -> str:
    if cc is None:
        return "unknown"
    if cc == (7, 5):
        return "Turing"
    if cc == (8, 9):
        return "Ada"
    return ARCH_BY_CC_MAJOR.get(cc[0], f"SM{cc[0]}{cc[1]}")


@dataclass
class GpuTick:
    gpu_rows: list[dict] = field(default_factory=list)
    nvlink_rows: list[dict] = field(default_factory=list)
    process_rows: list[dict] = field(default_factory=list)


class GpuSampler:
    """Samples every GPU of the node through `backend_factory()` (a fresh backend on each (re)initialisation)."""

    def __init__(self, backend_factory: Callable[[], GpuBackend], gpm_enabled: bool = True,
                 slow_interval_s: float = 60.0, on_event: EventSink | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 retry_initial_s: float = 1.0, retry_max_s: float = 60.0, lost_probe_s: float = 10.0,
                 xid_events: bool = True, xid_per_tick: int = XIDS_PER_TICK, refresh_s: float = MAX_AGE_S,
                 wall_clock: Callable[[], float] = time.time, on_xid: Callable[[int | None], None] | None = None,
                 settle_s: float = SETTLE_S, lost_settle_s: float = LOST_SETTLE_S):
        self._factory = backend_factory
        self.gpm_enabled = gpm_enabled
        self._clock = clock
        self._xid_events = xid_events
        self._xid_per_tick = xid_per_tick
        self._r = Reporter(on_event)
        self._left_out = LeftOut(self._r)  # GPUs and facilities a setup failure left out: told, once each
        self._c = NvmlCaller(self._r, slow_interval_s, clock)
        self._facts = DeviceFacts(self._c, gpm_enabled)
        self._readings = DeviceReadings(self._c)
        self._processes = ProcessReadings(self._c, wall_clock)  # NVML stamps process samples on the wall clock
        self._activity = ActivityReadings(self._c)
        self._slow = SlowReadings(self._c, slow_interval_s)
        self._refresh = Refresh(refresh_s)
        # lost GPUs (probed, set up again) and the board at each index (`gpu.identity_changed`): lost.py
        self._lost = LostGpus(self._r, self._c, clock, lost_probe_s, self._setup_gpu, lost_settle_s)
        self._gpus: list[Gpu] = []
        self.enumerated: int | None = None  # NVML's device count at the last open (unreadable boards too)
        self._static_rows: list[dict] | None = None  # static()'s rows for the GPUs of this initialisation
        self._state = {"state": "error", "message": "not opened", "driver_version": "", "nvml_version": ""}
        self._retry = NvmlRetry(self._r, retry_initial_s, retry_max_s, settle_s)  # when to try, the outage
        self._unreadable = UnreadableGpus(self._r)
        self._xid: XidWatcher | None = None
        # XID episodes outlive a re-initialisation's event set: a flood across one is one episode (xid.py)
        self._xid_episodes = (XidEpisodes(self._r.event, on_xid=on_xid) if xid_events and on_event is not None
                              else None)
        self._first_tick = True
        # +1 on every successful (re)initialisation, and when a GPU lost while NVML enumerated is set up: re-read
        # static() then
        self.static_version = 0

    @property
    def slow_interval_s(self) -> float:
        return self._slow.slow_interval_s

    @slow_interval_s.setter
    def slow_interval_s(self, seconds: float) -> None:
        self._slow.slow_interval_s = self._c.slow_interval_s = seconds

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> dict:
        self._try_open()
        return self.status()

    def status(self) -> dict:
        return dict(self._state)

    def static(self) -> list[dict]:
        """The GPUs' static facts; built once per (re)initialisation, since every tick's view asks for them."""
        if self._static_rows is None:
            dv, nv = self._state["driver_version"], self._state["nvml_version"]
            self._static_rows = [
                {"uuid": g.uuid, "idx": g.idx, "name": g.name, "pci_bus_id": g.pci_bus_id, "serial": g.serial,
                 "cc_major": g.cc[0] if g.cc else None, "cc_minor": g.cc[1] if g.cc else None,
                 "arch": arch_name(g.cc), "mem_total_bytes": g.mem_total, "nvlink_count": g.nvlink_count,
                 "gpm_supported": g.gpm_supported, "driver_version": dv, "nvml_version": nv}
                for g in self._gpus if g.uuid]
        return list(self._static_rows)

    def close(self) -> None:
        self._teardown()
        if self._xid_episodes is not None:  # the repeats of the XID episodes still open are told now
            self._xid_episodes.flush(self._clock())
        self._state.update(state="error", message="closed")

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
        except Exception as e:  # a bug or an odd answer: NVML is off until the next try, the tick goes on
            log.exception("opening NVML failed")
            self._open_failed(E.NVML_ERROR_UNKNOWN, f"opening NVML failed: {type(e).__name__}: {e}", now)
            return
        self._c.b = b
        self._facts.gpm_enabled = self.gpm_enabled
        try:
            dv, nv = _text(b.nvmlSystemGetDriverVersion()), _text(b.nvmlSystemGetNVMLVersion())
            count = b.nvmlDeviceGetCount()
            gpus = (self._setup_gpu(i) for i in range(count))
            self._gpus = [g for g in gpus if g is not None]
        except pynvml.NVMLError as e:
            self._teardown()
            self._open_failed(e.value, f"NVML initialised but enumerating GPUs failed: {error_name(e.value)}", now)
            return
        except Reinit as e:
            self._teardown()
            self._open_failed(e.code, f"NVML initialised but {e}", now)
            return
        except Exception as e:  # a bug or an odd answer: NVML is off until the next try, the tick goes on
            self._teardown()
            log.exception("NVML initialised but setting it up failed")
            self._open_failed(E.NVML_ERROR_UNKNOWN, f"NVML initialised but setting it up failed: "
                              f"{type(e).__name__}: {e}", now)
            return
        self._state = {"state": "ok", "message": f"{count} GPU(s)" + (" (simulated)" if b.simulated
                                                                       else ""),
                       "driver_version": dv, "nvml_version": nv}
        self._static_rows = None  # built again with this driver's versions
        self.enumerated = count
        self._retry.opened(now, dv, count)
        self._first_tick = True
        self.static_version += 1
        for g in self._gpus:
            self._unreadable.resume(g)
        self._lost.opened(self._gpus, count)
        if not self.gpm_enabled and self._r.once("gpm_disabled", ""):
            self._r.event(EventKind.GPU_GPM_DISABLED, "info", "GPM sampling is off by configuration "
                          "([agent] gpm = false): SM/tensor/DRAM activity columns stay empty", None)
        if self._xid_events and self._r.on_event is not None:
            self._start_xids(b)

    def _start_xids(self, b: GpuBackend) -> None:
        """The XID watcher of this initialisation; a failure that is no NVMLError leaves out the XIDs of the GPU
        it came from (every GPU's, for the event set), told as `gpu.setup_failed` (left_out.py)."""
        xid = XidWatcher(b, self._r.event, limit=self._xid_per_tick, episodes=self._xid_episodes,
                         clock=self._clock, on_wait=self._xid_waits)
        try:
            started = xid.start()
        except Exception as e:  # a bug or an odd answer: sampling goes on without XID events
            xid.close()
            self._left_out.failed(None, "xid", e)
            return
        self._xid = xid if started else None
        self._left_out.fine(None, "xid")
        for i, e in xid.failed.items():
            self._left_out.failed(i, "xid", e)
        for i in xid.registered:
            self._left_out.fine(i, "xid")

    def _xid_waits(self, error: BaseException | None) -> None:
        """Waiting on the XID event set fails (`error`) or works again: one `gpu.setup_failed` / `gpu.recovered`
        pair per episode (left_out.py), as for an event set that could not be made."""
        if error is None:
            self._left_out.fine(None, "xid_wait")
        elif isinstance(error, pynvml.NVMLError) and error.value in REINIT_CODES:
            log.debug("waiting for XID events failed: %s (NVML's outage, told by the readings)", error)
        else:
            self._left_out.failed(None, "xid_wait", error)

    def _setup_gpu(self, i: int) -> Gpu | None:
        """GPU `i`'s setup; one that fails with something other than NVML's errors (a bug, an odd answer) is set up
        again without GPM, and left out of this initialisation if that fails too: either is a `gpu.setup_failed`
        event, once per occurrence, and a GPU set up fine again is `gpu.recovered` (left_out.py)."""
        gpm = self._facts.gpm_enabled
        try:
            g = self._facts.setup(i)
        except (pynvml.NVMLError, Reinit):
            raise
        except Exception as e:
            first = e
        else:
            self._left_out.fine(i, "gpu")
            self._left_out.fine(i, "gpm", tell=gpm)  # GPM off by configuration: nothing left out by a bug
            return g
        if gpm:
            self._facts.gpm_enabled = False
            try:
                g = self._facts.setup(i)
            except (pynvml.NVMLError, Reinit):
                raise
            except Exception:
                g = None
            finally:
                self._facts.gpm_enabled = self.gpm_enabled
            if g is not None:
                self._left_out.fine(i, "gpu")
                self._left_out.failed(i, "gpm", first)
                return g
        self._left_out.failed(i, "gpu", first)
        return None

    def _open_failed(self, code: int, message: str, now: float) -> None:
        no_driver = code in _NO_DRIVER_CODES
        state = "no-driver" if no_driver else "error"
        if no_driver:
            message = ("no NVIDIA driver (" + message + "): GPU metrics are off; host and serving metrics "
                       "continue")
        delay = self._retry.open_failed(now, no_driver, at_start=self.static_version == 0)
        self._state = {"state": state, "message": f"{message}; next try in {delay:g} s",
                       "driver_version": "", "nvml_version": ""}
        if self._r.once("nvml_open_failed", state):
            self._r.event(EventKind.NVML_UNAVAILABLE, "warning" if no_driver else "error", message, {"code": code})

    def _teardown(self) -> None:
        if self._xid is not None:  # the event set is freed before nvmlShutdown
            self._xid.close()
            self._xid = None
        for g in self._gpus:
            if g.gpm is not None:
                g.gpm.close()
        self._lost.keep(self._gpus)
        self._gpus = []
        self._static_rows = None
        if self._c.b is not None:
            try:
                self._c.b.nvmlShutdown()
            except pynvml.NVMLError:
                pass
            self._c.b = None

    # ------------------------------------------------------------------ sampling

    def sample(self, vllm_pids: set[int] | frozenset[int] = frozenset()) -> GpuTick:
        """One tick for every GPU. Never raises: failures become NULLs, events and states."""
        now = self._clock()
        tick = GpuTick()
        if self._xid_episodes is not None:  # before the poll: an XID after a quiet spell opens a new episode
            self._xid_episodes.tick(now)
        if self._state["state"] != "ok":
            if now < self._retry.next_attempt:
                return tick
            self._try_open()
            if self._state["state"] != "ok":
                return tick
        if self._xid is not None:
            self._poll_xids(now)  # first: an XID that came before this tick's readings is reported before them
        self._refresh.tick(now)
        slow_budget = len(self._gpus) if self._first_tick else 1
        self._first_tick = False
        try:
            for pos, g in enumerate(self._gpus):
                if g.lost:
                    back = self._lost.probe(g, now)
                    if back is None:
                        tick.gpu_rows.append(self._lost_row(g))
                        tick.process_rows.extend(g.proc_rows)  # its last holders, stale (lost.py)
                        continue
                    if back is not g:  # set up afresh (lost while NVML enumerated): static() and XIDs take it
                        self._gpus[pos] = g = back
                        self._static_rows = None
                        self.static_version += 1
                        if self._xid is not None:
                            self._xid.register(g.idx)
                try:
                    do_slow = slow_budget > 0 and now >= g.slow_due
                    if do_slow:
                        slow_budget -= 1
                    try:
                        self._sample_gpu(g, now, do_slow, vllm_pids, tick)
                    except Reinit as e:
                        if not self._retry.local(g, e, self._gpus):
                            raise
                        self._sample_gpu(g, now, do_slow, vllm_pids, tick)  # its codes are its failures now
                except Lost:
                    self._lost.mark(g, "while sampling")
                    tick.gpu_rows.append(self._lost_row(g))
                    tick.process_rows.extend(g.proc_rows)
                except Reinit:
                    raise
                except Exception as e:  # a bug or an odd answer on one GPU: the others keep their rows
                    if self._r.once("sample_bug", f"{g.idx}:{type(e).__name__}"):
                        log.exception("sampling GPU %d failed (logged once)", g.idx)
        except Reinit as e:
            self._reinit(e)
            return GpuTick()
        except Exception as e:  # a bug here must not take the agent down: keep the node serving
            if self._r.once("sample_bug", type(e).__name__):
                log.exception("GPU sampling failed (logged once)")
            return GpuTick()
        self._lost.settle(now, self._gpus)  # a GPU back long enough: its `gpu.recovered` (lost.py)
        if now >= self._retry.settle_at:  # healthy: one comparison a tick
            self._retry.settled(now, self._state["driver_version"], len(self._gpus))
        return tick

    def _poll_xids(self, now: float) -> None:
        assert self._xid is not None
        try:
            self._xid.poll(now)
        except Exception:  # a bug or an odd answer: the tick goes on without this tick's XIDs
            if self._r.once("xid_bug", ""):
                log.exception("reading XID events failed (logged once)")

    def _sample_gpu(self, g: Gpu, now: float, do_slow: bool, vllm_pids: Any, tick: GpuTick) -> None:
        if g.denied_at:
            self._c.retry_denied(g, now)
        fails = g.fails
        kept = self._refresh.due(g.kept_at, now)  # about once a second: see agent/gpu/refresh.py
        if kept or do_slow:  # `kept` or `slow` is read again this tick: the row takes them at the end
            row = dict(_ROW_TEMPLATE)
            row["gpu"] = g.idx
            row["lost"] = 0
        else:  # at 10 Hz 9 ticks in 10: one copy of the row as it stands before the tick's readings
            base = g.row_base
            if base is None:
                base = g.row_base = self._row_base(g)
            row = base.copy()
        self._readings.read(g, row)
        if kept:
            self._readings.read_kept(g, now)
            self._processes.read(g, vllm_pids)
        self._activity.read(g, row, kept)
        if do_slow:  # every call before the appends below: a re-init code taken as g's own re-runs g's tick
            self._slow.read(g, now)
        # the same objects every tick until the next read: the store writer keeps only a new object (a reading
        # stored once, at the tick it was read: store/writer.py SlowRows); nothing downstream changes them
        if g.link_row is not None:
            tick.nvlink_rows.append(g.link_row)
        tick.process_rows.extend(g.proc_rows)
        if kept or do_slow:
            row.update(g.kept)
            row.update(g.slow)
        if g.fails != fails or g.bad_since is not None:  # healthy: nothing failed, no episode (unreadable.py)
            self._unreadable.check(g, row, g.fails != fails, now)
        # the last line before the store, whichever reader let a value through: every value 0 <= v < 2**63 (NaN
        # fails the comparison too). One pass, no call per value (~1 µs a GPU); a row that fails takes `_fit`
        end = _INT64_END
        try:
            for v in row.values():
                if v is not None and not 0 <= v < end:
                    self._fit(g, row)
                    break
        except TypeError:  # not a number
            self._fit(g, row)
        tick.gpu_rows.append(row)

    def _fit(self, g: Gpu, row: dict) -> None:
        """Each value of `row` that no INTEGER column can hold as a reading (below 0, at or past 2**63, not finite,
        not a number) becomes None, logged once per GPU and column."""
        for col, v in row.items():
            if v is None:
                continue
            try:
                ok = 0 <= v < _INT64_END  # NaN fails the comparison too
            except TypeError:
                ok = False
            if not ok:
                row[col] = None
                if self._r.once("bad_value", f"{g.idx}:{col}"):
                    log.warning("GPU %d: %s read %r, no reading (outside 0..2**63-1 or not a finite number): "
                                "stored as NULL (further ones not logged)", g.idx, col, v)

    @staticmethod
    def _row_base(g: Gpu) -> dict:
        """A GPU's row before the tick's readings: every column None but its kept and slow readings (the keys
        in the order a row built afresh has them)."""
        base = dict(_ROW_TEMPLATE)
        base["gpu"] = g.idx
        base["lost"] = 0
        base.update(g.kept)
        base.update(g.slow)
        return base

    def _reinit(self, e: Reinit) -> None:
        """NVML torn down for a re-init code; opened again after the backoff, which grows through the outage
        (it resets only once NVML has sampled cleanly for settle_s: NvmlRetry)."""
        self._teardown()
        delay = self._retry.reinit(self._clock(), e)
        self._state = {"state": "error", "message": f"re-initialising NVML after {e}; next try in {delay:g} s",
                       "driver_version": "", "nvml_version": ""}

    # ------------------------------------------------------------------ lost GPUs

    def _lost_row(self, g: Gpu) -> dict:
        row = dict(_ROW_TEMPLATE)
        row["gpu"] = g.idx
        row["lost"] = 1
        row["mem_total_bytes"] = g.mem_total
        self._fit(g, row)  # rare (a lost GPU's tick): the column by column check
        return row
