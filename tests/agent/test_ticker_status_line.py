"""The status line (systemd's STATUS=) is built about once a second, not every tick (issue 29.3).

At 10 Hz sampling the ticker called `on_done` after every tick and the node built the whole line each time
(serving status, the writer's stats under its lock): a tenth of the main thread's CPU. The ticks here are driven
by their data timestamps (`Tick.t0`), never by the wall or a sleep, and written to a real SQLite store.
"""

from __future__ import annotations

from lynxtop.agent.api.connguard import Episodes
from lynxtop.agent.clock import Timeline
from lynxtop.agent.sampling import Tick
from lynxtop.agent.ticker import Ticker
from lynxtop.store.writer import StoreWriter


def _ticker(writer: StoreWriter, interval: float, done: list[float], now: list[float]) -> Ticker:
    return Ticker(interval, Timeline(), Episodes(lambda _msg: None), writer=lambda: writer,
                  record=lambda _evs: None, context=lambda: (None, None), on_beat=lambda _t: None,
                  on_done=lambda: done.append(now[0]))


def _write_ticks(ticker: Ticker, interval: float, n: int, now: list[float]) -> None:
    for i in range(n):
        now[0] = t0 = i * interval
        tick = Tick(ts_ms=1_700_000_000_000 + int(t0 * 1000), t0=t0, deadline=t0 + interval * 0.9, root=None,
                    run_id=None, rows={"host_row": {"cpu_util_pct": 1.0}})
        ticker._finish(tick)


def test_at_10_hz_the_status_line_is_built_once_a_second_and_every_tick_is_written(tmp_path):
    writer = StoreWriter(tmp_path / "lynxtop.db")
    writer.start()
    try:
        done: list[float] = []
        now = [0.0]
        ticker = _ticker(writer, 0.1, done, now)
        _write_ticks(ticker, 0.1, 31, now)  # 3 s of ticks
        assert ticker.ticks == 31
        assert done == [0.0, 1.0, 2.0, 3.0]  # was every tick: 31 lines
        assert writer.flush() and writer.stats()["queued"] == 0
    finally:
        writer.close()


def test_at_1_hz_every_tick_still_updates_the_status_line(tmp_path):
    writer = StoreWriter(tmp_path / "lynxtop.db")
    writer.start()
    try:
        done: list[float] = []
        now = [0.0]
        ticker = _ticker(writer, 1.0, done, now)
        _write_ticks(ticker, 1.0, 5, now)
        assert done == [0.0, 1.0, 2.0, 3.0, 4.0]
    finally:
        writer.close()
