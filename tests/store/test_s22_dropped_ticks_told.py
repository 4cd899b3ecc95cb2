"""Ticks dropped because the writer lags (its queue full, no write error) are told once per episode: a warning
`store.ticks_dropped` once dropping has lasted `lag_tell_s` with writes not failing (a queue that filled while the
first failing write was tried is the outage's), `store.writer_caught_up` with the count once none was dropped for
`lag_quiet_s`. Before, they were only counted in `dropped`: no event, no log line. A real SQLite file and the real
writer thread, kept behind by its linger (it waits to batch ticks), not by a write error."""

from __future__ import annotations

import logging
import sqlite3
import time

import pytest
from support.writer_faults import read_only

from lynxtop.contract.events import Event, EventKind
from lynxtop.store import writer as writer_module
from lynxtop.store.writer import StoreWriter

T0 = 1_700_000_000_000


def _wait(cond, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


class WriterClock:
    """The writer module's `time`, with `monotonic()` ahead of the real one by `ahead`: a test moves the writer's
    time on explicitly instead of sleeping, so an episode's quiet and tell times are the test's, not how fast a
    loaded machine runs (a flush that took longer than the quiet time ended the episode early)."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def __getattr__(self, name: str):  # noqa: ANN204 - the rest of the time module, as is
        return getattr(time, name)

    def monotonic(self) -> float:
        return time.monotonic() + self.ahead


@pytest.fixture
def clock(monkeypatch) -> WriterClock:
    c = WriterClock()
    monkeypatch.setattr(writer_module, "time", c)
    return c


def _lagging(tmp_path, told: list[Event], quiet_s: float = 30.0) -> StoreWriter:
    """A started writer that lingers 60 s before writing: 5 queued ticks fill its queue. The quiet time is far more
    than a flush can take on a loaded machine (at 0.3 s, then 1.5 s, a writer thread scheduled late ended the
    episode early): the test moves the writer's clock past it instead (WriterClock)."""
    w = StoreWriter(tmp_path / "h.db", queue_max=5, linger_s=60.0, on_event=told.append, lag_quiet_s=quiet_s,
                    lag_tell_s=0.0)
    w.start()
    return w


def test_a_lagging_writer_tells_the_drops_once_and_the_count_when_it_keeps_up(tmp_path, clock):
    told: list[Event] = []
    w = _lagging(tmp_path, told)
    try:
        for i in range(50):
            w.submit_tick(T0 + i * 100, host_row={"cpu_pct": 1.0})
        assert w.stats()["dropped"] == 45
        assert [e.kind for e in told] == [EventKind.STORE_TICKS_DROPPED], told  # one event, not 45
        assert "lags" in told[0].message and str(w.path) in told[0].message
        assert told[0].details == {"queue_max": 5, "dropped_total": 1}  # made at the first drop
        assert w.flush(30)  # the writer catches up
        for i in range(3):  # drops again within the episode: counted, not told
            w.submit_tick(T0 + 10_000 + i * 100, host_row={"cpu_pct": 1.0})
        for i in range(5):
            w.submit_tick(T0 + 20_000 + i * 100, host_row={"cpu_pct": 1.0})
        assert len(told) == 1
        assert w.flush(30)
        w.submit_tick(T0 + 25_000, host_row={"cpu_pct": 1.0})  # quiet for less than lag_quiet_s: still on
        assert len(told) == 1
        clock.ahead += 31.0  # quiet for longer than lag_quiet_s (30 s)
        w.submit_tick(T0 + 30_000, host_row={"cpu_pct": 1.0})  # no drop: the episode ends
        assert [e.kind for e in told] == [EventKind.STORE_TICKS_DROPPED, EventKind.STORE_WRITER_CAUGHT_UP]
        assert told[1].details is not None and told[1].details["dropped_ticks"] == 48, told[1]
        assert "48 ticks were dropped" in told[1].message
        w.submit_tick(T0 + 30_100, host_row={"cpu_pct": 1.0})
        assert len(told) == 2  # told once
        for i in range(10):  # a new episode is told again
            w.submit_tick(T0 + 40_000 + i * 100, host_row={"cpu_pct": 1.0})
        assert [e.kind for e in told][2:] == [EventKind.STORE_TICKS_DROPPED]
    finally:
        w.close()


def test_without_a_sink_the_drops_are_written_and_logged(tmp_path, caplog):
    """A tool's writer (no agent sink): the event lands in the database and the log."""
    caplog.set_level(logging.WARNING, logger="lynxtop")
    w = StoreWriter(tmp_path / "h.db", queue_max=5, linger_s=60.0, lag_tell_s=0.0)
    w.start()
    try:
        for i in range(20):
            w.submit_tick(T0 + i * 100, host_row={"cpu_pct": 1.0})
        assert w.flush(30)
    finally:
        w.close()
    rows = sqlite3.connect(tmp_path / "h.db").execute(
        "SELECT kind, severity FROM events WHERE kind LIKE 'store.%'").fetchall()
    assert rows == [("store.ticks_dropped", "warning")]
    assert sum("lags behind" in r.getMessage() for r in caplog.records) == 1


def test_drops_during_a_write_outage_are_the_outages_not_a_lag(tmp_path):
    """A read-only database: store.write_failed and store.writes_resumed (with the count) tell those drops."""
    told: list[Event] = []
    w = StoreWriter(tmp_path / "h.db", queue_max=5, retry_interval_s=0.05, on_event=told.append, lag_quiet_s=0.1)
    w.start()
    try:
        w.submit_tick(T0, host_row={"cpu_pct": 1.0})
        assert w.flush(30)
        read_only(w, True)
        w.submit_tick(T0 + 100, host_row={"cpu_pct": 1.0})
        _wait(lambda: w.stats()["retrying"])
        for i in range(30):
            w.submit_tick(T0 + 200 + i * 100, host_row={"cpu_pct": 1.0})
        assert w.stats()["dropped"] >= 20
        read_only(w, False)
        assert w.flush(30)
        _wait(lambda: EventKind.STORE_WRITES_RESUMED in [e.kind for e in told])
        time.sleep(0.2)
        w.submit_tick(T0 + 9_000, host_row={"cpu_pct": 1.0})
        kinds = [e.kind for e in told]
        assert EventKind.STORE_TICKS_DROPPED not in kinds and EventKind.STORE_WRITER_CAUGHT_UP not in kinds, kinds
    finally:
        w.close()


def test_a_lag_is_told_once_it_has_lasted_the_tell_time(tmp_path, clock):
    """The default: the drops are told at the first tick `lag_tell_s` after dropping began (not at the first drop,
    which a failing write not yet flagged may explain), still once. The tell time is long (a loaded machine once
    took longer than 0.3 s for 20 submits) and the writer's clock is moved past it."""
    told: list[Event] = []
    w = StoreWriter(tmp_path / "h.db", queue_max=5, linger_s=60.0, on_event=told.append, lag_tell_s=30.0)
    w.start()
    try:
        for i in range(20):
            w.submit_tick(T0 + i * 100, host_row={"cpu_pct": 1.0})
        assert told == [] and w.stats()["dropped"] == 15
        clock.ahead += 31.0  # the lag has lasted longer than lag_tell_s
        for i in range(3):
            w.submit_tick(T0 + 5_000 + i * 100, host_row={"cpu_pct": 1.0})
        assert [e.kind for e in told] == [EventKind.STORE_TICKS_DROPPED], told
    finally:
        w.close()
