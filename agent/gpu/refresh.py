"""When a reading kept between ticks is read again: about once a second, never older than a second in any row.

Here beside the GPU sampler, its main user, so the GPU layer imports only itself; the host sampler uses it too.

At 10 Hz sampling most of what a tick reads (memory totals, temperature, the process list, the host's /proc
files) does not change at that rate, or is a rate that jiffies resolve only to ~10 % in 0.1 s. Those readings
are taken on the tick nearest to a second after the last one and copied into the rows in between (DCGM's
per-field update intervals do the same), so every stored row stays complete.

The rule, for a reading taken at `read_at`, on a tick at `now` that came `gap` after the previous tick: read
again when `now - read_at >= max_age_s - gap / 2`. A row that reuses a reading is therefore never more than
`max_age_s - gap / 2` older than its tick; at 10 Hz the reading is renewed every tenth tick even with ticks
±50 ms late, at 1 Hz (or slower) on every tick. The first tick, and any after a stall, reads everything.
"""

from __future__ import annotations

MAX_AGE_S = 1.0


class Refresh:
    """One sampler's ticks (`tick(now)` at the start of each) and whether a reading of its is due (`due`)."""

    def __init__(self, max_age_s: float = MAX_AGE_S):
        self.max_age_s = max_age_s
        self._prev: float | None = None
        self._limit = float("-inf")  # a reading at least this old is read again this tick

    def tick(self, now: float) -> None:
        gap = float("inf") if self._prev is None or now <= self._prev else now - self._prev
        self._prev = now
        self._limit = self.max_age_s - gap / 2

    def due(self, read_at: float | None, now: float) -> bool:
        """Whether a reading taken at `read_at` (None: never) is to be read again on this tick."""
        return read_at is None or now < read_at or now - read_at >= self._limit
