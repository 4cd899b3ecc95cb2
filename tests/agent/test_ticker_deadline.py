"""A tick's waits end within the interval it was due in, however late it started (benchmarks/slowloris.py).

Under a connection flood the event loop got to a due tick a turn or two late; the tick then gave NVML and the
scrape 0.9 interval from its own start, so a slow sampler kept it running past the next tick's due time and
that tick was skipped (a missed tick). The deadline is now the due time + 0.9 interval. Driven by the ticker's
own `_tick` with a due time in the past: no sleep, no timing assertion; a real SQLite store takes the rows.
"""

from __future__ import annotations

import time

from lynxtop.agent.api.connguard import Episodes
from lynxtop.agent.clock import Timeline
from lynxtop.agent.sampling import Tick
from lynxtop.agent.ticker import Ticker
from lynxtop.store.writer import StoreWriter


class _Seen:
    """A sampler that keeps the ticks it is given."""

    def __init__(self) -> None:
        self.ticks: list[Tick] = []

    async def sample(self, tick: Tick) -> tuple[dict, list]:
        self.ticks.append(tick)
        return {"host_row": {"cpu_util_pct": 1.0}}, []


async def test_a_tick_that_starts_late_stops_waiting_before_the_next_is_due(tmp_path):
    writer = StoreWriter(tmp_path / "lynxtop.db")
    writer.start()
    try:
        interval = 0.2
        ticker = Ticker(interval, Timeline(), Episodes(lambda _msg: None), writer=lambda: writer,
                        record=lambda _evs: None, context=lambda: (None, None), on_beat=lambda _t: None,
                        on_done=lambda: None)
        seen = _Seen()
        ticker.use([[seen]])
        due = time.monotonic() - 0.15  # the loop got to this tick 150 ms after it was due
        await ticker._tick(due)
        (tick,) = seen.ticks
        assert tick.t0 - due >= 0.15  # its samples are stamped when taken
        assert tick.deadline == due + interval * 0.9  # was t0 + 0.9 interval: past the next tick's due time
        assert ticker.ticks == 1 and ticker.missed_ticks == 0
        # a tick on time: the same deadline as before
        await ticker._tick()
        assert seen.ticks[1].deadline == seen.ticks[1].t0 + interval * 0.9
    finally:
        writer.close()
