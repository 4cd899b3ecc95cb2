"""A write the database refuses (a huge int, any exception in an op) costs that write only: the ticks, events
and runs drained with it are all written, and the caller of the bad write gets its answer at once."""

from __future__ import annotations

import sqlite3

import pytest

from lynxtop.contract.events import Event
from lynxtop.store.errors import StoreError
from lynxtop.store.writer import StoreWriter

from .helpers import T0, gpu_row, submit


@pytest.fixture
def db(tmp_path):
    return tmp_path / "lynxtop.db"


def _boom(c: sqlite3.Connection) -> None:
    raise ZeroDivisionError("a bug in an op")


def test_poisoned_ops_fail_alone_and_every_other_write_of_their_batch_lands(db):
    w = StoreWriter(db)
    rid = w.create_run(profile="p", started_ms=T0)  # not started: written inline
    # everything below is queued before the thread starts, so it is drained as one batch
    submit(w, 3, gpus=2)
    w.record(Event("action.stop", "info", "stop asked by operator", ts_ms=T0 + 1))
    w.update_run(rid, exit_code=2**64)  # OverflowError in the driver, not an sqlite3.Error
    bad = w._enqueue_op(_boom)  # any exception at all
    w.update_run(rid, ended_ms=T0 + 5000)
    w.record(Event("agent.stopped", "info", "agent stopped", ts_ms=T0 + 2))
    submit(w, 2, start_i=3, gpus=2)
    w.start()
    try:
        assert w.flush(10)
        with pytest.raises(StoreError, match="ZeroDivisionError"):
            bad.future.result(0)
        assert w.alive()
        submit(w, 1, start_i=5, gpus=2)  # and the writer keeps writing
        assert w.flush(10)
    finally:
        w.close()
    c = sqlite3.connect(db)
    assert [r[0] for r in c.execute("SELECT DISTINCT ts_ms FROM gpu_samples ORDER BY ts_ms")] == \
        [T0 + i * 1000 for i in range(6)]
    assert c.execute("SELECT count(*) FROM host_samples").fetchone()[0] == 6
    assert [r[0] for r in c.execute("SELECT kind FROM events ORDER BY ts_ms")] == ["action.stop", "agent.stopped"]
    assert c.execute("SELECT exit_code, ended_ms FROM runs WHERE id = ?", (rid,)).fetchone() == (None, T0 + 5000)


def test_a_refused_bench_result_is_answered_at_once_and_stores_nothing(db):
    with StoreWriter(db) as w:
        w.submit_tick(T0, [gpu_row(0, 0)])
        # the caller learns the cause (not "did not accept the write within 30 s")
        with pytest.raises(StoreError, match="OverflowError"):
            w.add_bench_result({"profile": "p", "concurrency": 2**63}, timeout=30)
        bid = w.add_bench_result({"profile": "p", "concurrency": 8})
        w.submit_tick(T0 + 1000, [gpu_row(0, 1)])
        assert w.flush(10)
    c = sqlite3.connect(db)
    assert c.execute("SELECT id, concurrency FROM bench_results").fetchall() == [(bid, 8)]
    assert c.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == 2


def test_a_refused_tick_counts_as_dropped(db):
    with StoreWriter(db) as w:
        w.submit_tick(T0, [gpu_row(0, 0)])
        w.submit_tick(T0 + 1000, [gpu_row(0, 1)], serving_row={"requests_running": 10**300})  # SQLite refuses it
        w.submit_tick(T0 + 2000, [gpu_row(0, 2)])
        assert w.flush(10)
        st = w.stats()
    assert st["rejected"] == 1 and st["dropped"] == 1 and st["rejected_age_s"] is not None
    assert "rejected" in st["last_error"]
    c = sqlite3.connect(db)
    assert [r[0] for r in c.execute("SELECT ts_ms FROM gpu_samples")] == [T0, T0 + 2000]
