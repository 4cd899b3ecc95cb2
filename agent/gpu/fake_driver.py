"""The fake NVML's driver core: what a real driver keeps per GPU, and the checks every device call passes.

`FakeDriver` owns the scenario, the per-GPU accumulators (energy, GPM integrals, NVLink byte counters) and the
pending XIDs. Invariants: counters only ever move forward (a look at or before the last one adds nothing);
the scenario is read at most once per `resolution_s` per GPU (and not before the time the scenario says its
answer holds until, `unchanged_until`: the simulator's model steps every 0.2 s), and a new state turns into
per-second rates once (`_GpuAcc.renew`, a new `Segment`); a counter is worked out only when read, from its
segment, so a look that only reads utilisation or clocks integrates nothing, and a state the scenario answers
again starts no new segment; a device call counts itself and checks its errors in the order
a driver reports them (uninitialised, whole-library failure, missing function, lost GPU, unsupported, injected
error) with one look at the state.

The surfaces (fake.py) answer from the state this returns; this module builds no answer objects.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pynvml

from lynxtop.agent.gpu.protocol import FakeGpuSpec, FakeGpuState, Scenario

MIB = 1024 * 1024

# GPM metric id -> (FakeGpuState attribute, scale from the state's unit to GPM's unit)
GPM_SCALAR = {
    pynvml.NVML_GPM_METRIC_SM_UTIL: ("sm_active_pct", 1.0),
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: ("sm_occupancy_pct", 1.0),
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: ("tensor_active_pct", 1.0),
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: ("dram_bw_pct", 1.0),
    pynvml.NVML_GPM_METRIC_FP16_UTIL: ("fp16_active_pct", 1.0),
    pynvml.NVML_GPM_METRIC_FP32_UTIL: ("fp32_active_pct", 1.0),
    pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: ("pcie_tx_bytes_per_s", 1.0 / MIB),
    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: ("pcie_rx_bytes_per_s", 1.0 / MIB),
}
N_INTEGRALS = len(GPM_SCALAR) + 2  # scalars, nvlink total rx, nvlink total tx (per-link kept apart)
_SCALAR_ATTRS = tuple((attr, scale) for attr, scale in GPM_SCALAR.values())


def err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@dataclass
class Handle:
    index: int

    def __repr__(self) -> str:
        return f"<simulated GPU {self.index}>"


LAZY_SEGMENTS = 16  # at most this many segments in a row whose values at their start are not worked out yet


class Segment:
    """The counters' course while one scenario state holds: their values at `t0` and their per-second rates.

    `flat` and `rates` share the GPM record's layout: the integrals (GPM_SCALAR's, then the NVLink totals rx, tx),
    each link's rx bytes, each link's tx bytes. A counter at `t` is `flat[k] + rates[k] * (t - t0)`, worked out
    only when something reads it (a GPM metric, a field value, energy): a look in between costs nothing.
    A segment that follows `prev` may leave `flat` to be worked out when first read (`prev.at(t0)`): a GPM
    interval over one state change needs only the two segments' rates (`FakeGpm`), so at 10 Hz, where field
    values are read once a second, most segments never work theirs out."""

    __slots__ = ("t0", "_flat", "rates", "energy_mj", "power_mw", "prev", "lazy")

    def __init__(self, t0: float, flat: tuple[float, ...] | None, rates: tuple[float, ...], energy_mj: float,
                 power_mw: float, prev: Segment | None = None):
        self.t0, self._flat, self.rates, self.energy_mj, self.power_mw = t0, flat, rates, energy_mj, power_mw
        self.prev = prev  # the segment before (GPM's one-change interval; `flat` while not worked out)
        self.lazy = 0 if flat is not None else prev.lazy + 1  # type: ignore[union-attr]

    @property
    def flat(self) -> tuple[float, ...]:
        flat = self._flat
        if flat is None:
            flat = self._flat = self.prev.at(self.t0)  # type: ignore[union-attr]
            self.lazy = 0
        return flat

    def follow(self, t: float, rates: tuple[float, ...], power_mw: float) -> Segment:
        """The segment after this one from `t` on: its start values are left to be worked out when read, unless
        LAZY_SEGMENTS in a row already are (the chain stays short); this one forgets its own predecessor once it
        no longer needs it (memory stays bounded)."""
        flat = None if self.lazy < LAZY_SEGMENTS else self.at(t)
        if self._flat is not None:
            self.prev = None
        return Segment(t, flat, rates, self.energy(t), power_mw, self)

    def at(self, t: float) -> tuple[float, ...]:
        dt = t - self.t0
        return tuple([a + r * dt for a, r in zip(self.flat, self.rates, strict=True)])

    def value(self, k: int, t: float) -> float:
        return self.flat[k] + self.rates[k] * (t - self.t0)

    def energy(self, t: float) -> float:
        return self.energy_mj + self.power_mw * (t - self.t0)


def _rates(st: FakeGpuState, links: int) -> tuple[float, ...]:
    """`st` as per-second increments of a `Segment`'s counters."""
    tx, rx = st.nvlink_tx_bytes_per_s, st.nvlink_rx_bytes_per_s
    if len(tx) != links:  # a state of other links than the GPU's: padded with zeros or cut
        tx = (tx + [0.0] * links)[:links]
    if len(rx) != links:
        rx = (rx + [0.0] * links)[:links]
    return (*[getattr(st, attr) * scale for attr, scale in _SCALAR_ATTRS], sum(rx) / MIB, sum(tx) / MIB, *rx, *tx)


@dataclass
class _GpuAcc:
    """What the fake driver accumulates for one GPU since 'driver load': the counters' current `Segment`."""

    last_t: float  # counters are read at this time (the latest look that advanced them)
    last_state: FakeGpuState
    state_t: float  # when last_state was read from the scenario
    links: int
    seg: Segment
    until: float = 0.0  # the scenario is not asked again before this (at least `resolution_s` after state_t)
    prev_xids: list[int] = field(default_factory=list)

    def renew(self, st: FakeGpuState, t: float) -> None:
        """Take `st` as the state from `t` on. The scenario answers the same object while its state holds (the
        simulator's model steps every 0.2 s): then the counters keep their segment and nothing is worked out."""
        if st is not self.last_state:
            self.seg = self.seg.follow(t, _rates(st, self.links), st.power_w * 1000.0)
        self.last_state, self.state_t = st, t


class FakeDriver:
    """The state of a simulated NVML library for one node, driven by `scenario` and `clock` (monotonic s)."""

    simulated = True

    def __init__(self, scenario: Scenario, clock: Callable[[], float] = time.monotonic,
                 init_error: int | None = None, resolution_s: float = 0.01):
        self.scenario = scenario
        self.clock = clock
        # the scenario is re-read at most this often; integrals stay exact (timestamps are the read times)
        self.resolution_s = resolution_s
        # nvmlInit raises this code while set (e.g. LIBRARY_NOT_FOUND: a machine without a driver)
        self.init_error = init_error
        # every device call raises this code while set (e.g. LIB_RM_VERSION_MISMATCH after a driver upgrade)
        self.fail_all: int | None = None
        # (gpu index, function name) -> error code raised by that call on that GPU (tests' error injection)
        self.errors: dict[tuple[int, str], int] = {}
        self.calls: dict[str, int] = {}  # call counts by function name, for tests
        self.gpu_calls: dict[tuple[int, str], int] = {}  # and by (GPU, function)
        self.initialized = False
        self._refs = 0
        self._lock = threading.RLock()
        self._xid_ready = threading.Condition(self._lock)
        self._specs: list[FakeGpuSpec] = list(scenario.gpus())
        self._acc: dict[int, _GpuAcc] = {}
        self._pending_xids: list[tuple[int, int]] = []
        # the scenario's "same answer until" (Scenario's docstring), if it has one
        self._holds: Callable[[int, float], float] | None = getattr(scenario, "unchanged_until", None)

    def _system(self, fn: str) -> None:
        """A call that is not about one GPU: counted, and failing as the whole library does."""
        self.calls[fn] = self.calls.get(fn, 0) + 1
        if not self.initialized:
            raise err(pynvml.NVML_ERROR_UNINITIALIZED)
        if self.fail_all is not None:
            raise err(self.fail_all)

    def _check(self, handle: Handle, fn: str) -> FakeGpuState:
        """Count a device call, raise what the driver would, else return the GPU's state now (one look)."""
        index = handle.index
        calls = self.calls
        calls[fn] = calls.get(fn, 0) + 1
        key = (index, fn)
        self.gpu_calls[key] = self.gpu_calls.get(key, 0) + 1
        if not self.initialized:
            raise err(pynvml.NVML_ERROR_UNINITIALIZED)
        if self.fail_all is not None:
            raise err(self.fail_all)
        spec = self._specs[index]
        if fn in spec.missing_functions:
            raise err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        acc = self._acc.get(index)  # `_state`'s fast path, inlined: this runs on every device call
        if acc is not None and acc.state_t <= self.clock() < acc.until:
            st = acc.last_state
        else:
            st = self._state(index)
        if st.lost:
            raise err(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in spec.unsupported:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if self.errors:
            code = self.errors.get(key)
            if code is not None:
                raise err(code)
        return st

    def _state(self, index: int, force: bool = False) -> FakeGpuState:
        """The state now; with `force` the counters' reading time moves up to now too.

        The scenario is read again once its last look is `resolution_s` old and the scenario's answer may have
        changed (`_GpuAcc.until`); counters (`force`) always advance to now, so two GPM samples or field reads
        never share a timestamp.
        """
        if not force:  # an instantaneous reading of a fresh look: no lock
            acc = self._acc.get(index)
            if acc is not None and acc.state_t <= self.clock() < acc.until:
                return acc.last_state
        with self._lock:
            now = self.clock()
            acc = self._acc.get(index)
            if acc is None:
                return self._first_look(index, now)
            if now <= acc.last_t:
                return acc.last_state
            if acc.state_t <= now < acc.until:  # the scenario is not read again within this
                if force:
                    acc.last_t = now
                return acc.last_state
            acc.last_t = now
            new = self.scenario.state(index, now)
            if new is not acc.last_state and (new.xid_events or acc.prev_xids):
                # XIDs "fire at this moment": deliver each one that was not already pending at the last look
                fresh = list(new.xid_events)
                for x in acc.prev_xids:
                    if x in fresh:
                        fresh.remove(x)
                self._queue_xids(index, fresh)
                acc.prev_xids = list(new.xid_events)
            acc.renew(new, now)
            acc.until = self._until(index, now)
            return new

    def _until(self, index: int, now: float) -> float:
        """When the scenario is next asked about GPU `index`, having answered at `now`."""
        soonest = now + self.resolution_s
        return soonest if self._holds is None else max(soonest, self._holds(index, now))

    def _first_look(self, index: int, now: float) -> FakeGpuState:
        st = self.scenario.state(index, now)
        n = self._specs[index].nvlink_count
        seg = Segment(now, (0.0,) * (N_INTEGRALS + 2 * n), _rates(st, n), 0.0, st.power_w * 1000.0)
        acc = self._acc[index] = _GpuAcc(last_t=now, last_state=st, state_t=now, links=n, seg=seg,
                                         until=self._until(index, now))
        acc.prev_xids = list(st.xid_events)
        self._queue_xids(index, st.xid_events)
        return st

    def _counters(self, index: int) -> tuple[float, Segment]:
        """(now, the segment the GPU's counters are on): the counters at now are `segment.at(now)`."""
        with self._lock:
            self._state(index, force=True)
            acc = self._acc[index]
            return acc.last_t, acc.seg

    def _queue_xids(self, index: int, xids: list[int]) -> None:
        for x in xids:
            self._pending_xids.append((index, x))
        if xids:
            self._xid_ready.notify_all()

    def inject_xid(self, index: int, xid: int) -> None:
        """Test hook: an XID fires on GPU `index` now."""
        with self._lock:
            self._queue_xids(index, [xid])

    def _answer(self, handle: Handle, fn: str) -> tuple[FakeGpuSpec, FakeGpuState]:
        """`_check`, and the GPU's static facts for answers that need them."""
        st = self._check(handle, fn)
        return self._specs[handle.index], st
