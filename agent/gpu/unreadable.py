"""A GPU that answers an error to every reading while NVML and the other GPUs are fine: one episode, not silence.

Such a GPU (UNKNOWN to every call, a GPU half gone) is not lost: NVML never says GPU_IS_LOST, so its rows are all
NULL with `lost = 0`, and each failing function is logged once and never again. An operator saw nothing in the
events, and nothing when it ended. Now `gpu.unreadable` (warning) is told once every reading of the GPU has failed
for UNREADABLE_TICKS ticks in a row and UNREADABLE_S seconds (both: a blip at 10 Hz is 5 ticks in half a
second), and `gpu.readable` (info) with how long it lasted once a tick reads something again.

A tick's readings are the ones taken every tick (utilisation, power, SM clock, clock-event reasons): none of them
read, with a call failing on that tick, is "every reading failed" (those a GPU does not support are switched off
and were never a reading). The sampler looks only at a GPU whose failure count moved in the tick or whose episode
is open (`Gpu.fails`, `Gpu.bad_since`): a healthy tick costs it one comparison a GPU.
"""

from __future__ import annotations

from lynxtop.agent.gpu.calls import Gpu, Reporter
from lynxtop.contract.events import EventKind

UNREADABLE_TICKS = 5  # ticks in a row in which every reading failed ...
UNREADABLE_S = 3.0  # ... spanning at least this long: the GPU is unreadable


class UnreadableGpus:
    """The told `gpu.unreadable` episodes by GPU index; lives as long as the sampler, so that an episode outlives
    an NVML re-initialisation (its `Gpu` objects are made again: `resume`)."""

    def __init__(self, reporter: Reporter, ticks: int = UNREADABLE_TICKS, min_s: float = UNREADABLE_S):
        self._r = reporter
        self.ticks = ticks
        self.min_s = min_s
        self._told: dict[int, tuple[float, int]] = {}  # GPU -> (when its episode began, ticks told at)

    def resume(self, g: Gpu) -> None:
        """`g` was just made by a re-initialisation: an episode told for its index goes on (looked at each tick)."""
        told = self._told.get(g.idx)
        if told is not None:
            g.bad_since, g.bad_ticks = told[0], self.ticks

    def check(self, g: Gpu, row: dict, failed: bool, now: float) -> None:
        """After `g`'s tick: `failed` if a call failed on it in this tick."""
        if (failed and row["util_gpu_pct"] is None and row["power_w"] is None and row["sm_clock_mhz"] is None
                and row["throttle_reasons"] is None):
            if g.bad_since is None:
                g.bad_since, g.bad_ticks = now, 0
            g.bad_ticks += 1
            if g.idx not in self._told and g.bad_ticks >= self.ticks and now - g.bad_since >= self.min_s:
                self._told[g.idx] = (g.bad_since, g.bad_ticks)
                self._r.event(EventKind.GPU_UNREADABLE, "warning",
                              f"GPU {g.idx}: every reading has failed for {g.bad_ticks} ticks "
                              f"({now - g.bad_since:.0f} s), the GPU is not lost: its rows stay empty until it "
                              "answers again (each failing function is in the log)",
                              {"gpu": g.idx, "uuid": g.uuid, "ticks": g.bad_ticks})
            return
        since, g.bad_since, g.bad_ticks = g.bad_since, None, 0
        if self._told.pop(g.idx, None) is not None and since is not None:
            lasted = round(now - since, 1)
            self._r.event(EventKind.GPU_READABLE, "info",
                          f"GPU {g.idx}: readings come back after {lasted:g} s in which every one failed",
                          {"gpu": g.idx, "uuid": g.uuid, "lasted_s": lasted})
