"""The writer: batching, NULLs, rounding, bounded queue, runs/events/gpus/bench through the real thread."""

from __future__ import annotations

import json
import sqlite3
import threading
import time

import pytest

from lynxtop.contract.events import Event, EventKind
from lynxtop.store.reader import StoreReader
from lynxtop.store.writer import StoreWriter, linger_for

from .helpers import T0, gpu_row, submit


@pytest.fixture
def db(tmp_path):
    return tmp_path / "lynxtop.db"


def test_queued_ticks_are_written_in_one_transaction_each_tick_whole(db):
    w = StoreWriter(db, queue_max=1000)
    submit(w, 50)  # queued before the thread starts: one batch
    w.start()
    assert w.flush(10)
    st = w.stats()
    w.close()
    assert st["written_ticks"] == 50 and st["tick_commits"] == 1 and st["dropped"] == 0 and st["alive"]
    assert not w.alive()  # closed
    assert st["last_tick_ts_ms"] == T0 + 49_000
    c = sqlite3.connect(db)
    per_tick = c.execute("SELECT count(*) FROM gpu_samples GROUP BY ts_ms").fetchall()
    assert per_tick == [(8,)] * 50
    assert c.execute("SELECT count(*) FROM host_samples").fetchone()[0] == 50


def test_missing_reading_stays_null_and_floats_are_rounded(db):
    row = gpu_row(0, 0)
    row.update(sm_active_pct=None, power_w=699.6, util_gpu_pct=12.4)
    del row["temp_c"]
    with StoreWriter(db) as w:
        w.submit_tick(T0, [row], {"cpu_pct": None, "cpu_per_core_pct": [3.5, 4.0]}, None)
    c = sqlite3.connect(db)
    got = c.execute("SELECT sm_active_pct, temp_c, power_w, typeof(power_w), util_gpu_pct FROM gpu_samples").fetchone()
    assert got == (None, None, 700, "integer", 12)
    host = c.execute("SELECT cpu_pct, cpu_per_core_pct, load1 FROM host_samples").fetchone()
    assert host[0] is None and json.loads(host[1]) == [3.5, 4.0] and host[2] is None


def test_full_queue_drops_the_oldest_ticks_and_counts_them(db):
    w = StoreWriter(db, queue_max=5)
    submit(w, 12, gpus=1)
    assert w.stats()["dropped"] == 7 and w.stats()["queued"] == 5
    w.start()
    w.close()
    c = sqlite3.connect(db)
    kept = [r[0] for r in c.execute("SELECT ts_ms FROM gpu_samples ORDER BY ts_ms")]
    assert kept == [T0 + i * 1000 for i in range(7, 12)]


def test_bad_tick_is_dropped_alone(db):
    with StoreWriter(db) as w:
        w.submit_tick(T0, [gpu_row(0, 0)])
        w.submit_tick(T0 + 1000, [{"util_gpu_pct": 5}])  # no "gpu" key: a sampler bug
        w.submit_tick(T0 + 2000, [gpu_row(0, 2)])
        assert w.flush(10)
        st = w.stats()
    assert st["failed"] == 1 and "rejected" in st["last_error"]
    c = sqlite3.connect(db)
    assert [r[0] for r in c.execute("SELECT ts_ms FROM gpu_samples")] == [T0, T0 + 2000]


def test_runs_events_gpus_and_bench(db):
    with StoreWriter(db) as w:
        rid = w.create_run(profile="dsv4-tp8", argv=["/opt/vllm/bin/vllm", "serve", "deepseek-ai/DeepSeek-V4.1"],
                           model="deepseek-ai/DeepSeek-V4.1", host="node1", started_ms=T0, pid=4242,
                           simulated=True, flags={"--tensor-parallel-size": "8"})
        w.update_run(rid, ready_ms=T0 + 600_000, vllm_version="0.11.0", gpu_names=["NVIDIA H200"] * 8, gpu_count=8)
        w.record(Event(EventKind.SERVING_READY, "info", "ready", {"load_s": 600}, run_id=rid, ts_ms=T0 + 600_000))
        w.record(Event(EventKind.SLA_BREACH, "warning", "TTFT p99 above 2000 ms", ts_ms=T0 + 700_000))
        w.upsert_gpus([{"uuid": "GPU-1", "idx": 0, "name": "NVIDIA H200", "gpm_supported": True}])
        w.upsert_gpus([{"uuid": "GPU-1", "idx": 0, "name": "NVIDIA H200", "driver_version": "570.1"}])
        bid = w.add_bench_result({"profile": "dsv4-tp8", "concurrency": 64, "ttft_p99_ms": 900.0, "seed": 7})
        submit(w, 30, run_id=rid)
        with pytest.raises(ValueError, match="severity"):
            w.record(Event(EventKind.SERVING_READY, "fatal", "no such severity"))
        with pytest.raises(ValueError, match="unknown run field"):
            w.update_run(rid, colour="red")
    r = StoreReader(db)
    run = r.runs()[0]
    assert run.id == rid and run.argv and run.argv[1] == "serve" and run.simulated is True
    assert run.gpu_names == ["NVIDIA H200"] * 8 and run.flags == {"--tensor-parallel-size": "8"}
    detail = r.run(rid)
    assert detail is not None and detail.summary is not None
    assert detail.summary["load_s"] == 600
    assert detail.summary["serving"]["samples"] == 30
    assert detail.summary["serving"]["requests_finished"] == 60
    assert len(detail.summary["gpus"]) == 8
    ev = r.events()
    assert [e.message for e in ev] == ["ready", "TTFT p99 above 2000 ms"]
    assert ev[0].details == {"load_s": 600} and ev[0].run_id == rid
    assert r.events(severities=["warning"])[0].kind == "sla.breach"
    gpus = r.gpus()
    assert len(gpus) == 1 and gpus[0]["driver_version"] == "570.1"
    assert r.bench_results()[0]["id"] == bid and r.bench_results()[0]["details"] == {"seed": 7}
    assert r.run(9999) is None


def test_background_checkpoint_moves_pages_into_the_main_file(db):
    w = StoreWriter(db, queue_max=5000)
    w.start()
    try:
        submit(w, 2000, gpus=8)
        assert w.flush(30)
        deadline = time.monotonic() + 15
        while db.stat().st_size < 1_000_000:  # without a checkpoint the rows would all sit in the -wal
            assert time.monotonic() < deadline, "no checkpoint reached the main file"
            time.sleep(0.05)
        assert w._checkpointer is not None and w._checkpointer.runs > 0
    finally:
        w.close()
    assert sqlite3.connect(db).execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == 16_000


def test_rows_with_different_missing_readings_in_one_batch_keep_every_value(db):
    # missing readings are written as literal NULLs, grouped by their pattern: each row must keep its own values
    w = StoreWriter(db)
    rows = [{"gpu": 0, "power_w": 301.6, "temp_c": None, "sm_active_pct": 40.2},
            {"gpu": 1, "power_w": None, "temp_c": 55, "sm_active_pct": None},
            {"gpu": 2, "power_w": 88, "temp_c": 41, "sm_active_pct": 7}]
    for i in range(3):
        w.submit_tick(T0 + i * 1000, rows, {"cpu_pct": 10.0 + i, "load1": None if i % 2 else 1.5},
                      {"requests_running": i, "ttft_p99_ms": None if i == 1 else 100.0 + i})
    w.start()
    w.close()
    c = sqlite3.connect(db)
    got = c.execute("SELECT ts_ms, gpu, power_w, temp_c, sm_active_pct, util_gpu_pct FROM gpu_samples "
                    "ORDER BY ts_ms, gpu").fetchall()
    assert got == [(T0 + i * 1000, g, *want, None) for i in range(3)
                   for g, want in enumerate([(302, None, 40), (None, 55, None), (88, 41, 7)])]
    assert c.execute("SELECT cpu_pct, load1 FROM host_samples ORDER BY ts_ms").fetchall() == [
        (10.0, 1.5), (11.0, None), (12.0, 1.5)]
    assert c.execute("SELECT requests_running, ttft_p99_ms FROM serving_samples ORDER BY ts_ms").fetchall() == [
        (0, 100.0), (1, None), (2, 102.0)]


def test_lingering_writer_puts_a_second_of_ticks_in_one_transaction_yet_flush_and_events_do_not_wait(db):
    """At 10 Hz the agent's writer lingers (issue 29.3): ticks arriving one by one, the thread awake between
    them, share one commit; flush() and an event are written at once, not after the linger."""
    w = StoreWriter(db, queue_max=1000, linger_s=600.0)
    w.start()
    try:
        for i in range(10):
            submit(w, 1, start_i=i)
            time.sleep(0.02)  # the old writer committed each tick here; the lingering one waits for more
        assert w.stats()["tick_commits"] == 0
        w.record(Event(EventKind.SLA_BREACH, "warning", "TTFT p99 above 2000 ms", ts_ms=T0 + 5_000))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and w.stats()["tick_commits"] == 0:
            time.sleep(0.05)  # the event breaks the linger: it and the ticks before it are written
        assert w.stats()["tick_commits"] == 1 and w.stats()["written_ticks"] == 10
        submit(w, 5, start_i=10)
        assert w.flush(30)  # a flush does not wait out the 600 s linger
        st = w.stats()
    finally:
        w.close()
    assert st["written_ticks"] == 15 and st["tick_commits"] == 2 and st["dropped"] == 0
    r = StoreReader(db)
    try:
        assert [e.message for e in r.events()] == ["TTFT p99 above 2000 ms"]
    finally:
        r.close()


def test_the_agent_s_1_hz_writer_puts_five_seconds_of_ticks_in_a_transaction_and_loses_none(db):
    """At 1 s sampling the agent's writer lingers 5 s (session 12, linger_for; 2 s in session 9, none before):
    5 ticks submitted 0.8 s apart, then a flush, are one commit (the 2 s linger made 2 or 3, the old agent's
    writer one a tick: 5); flush() still writes at once and every tick is stored whole. A crash may cost the
    last 5 s of ticks, as a power loss may (docs/store.md). Below 1 s a second of ticks a transaction as before;
    slower sampling does not wait."""
    assert linger_for(1.0) == linger_for(1.5) == 5.0
    assert linger_for(0.1) == linger_for(0.5) == 1.0 and linger_for(2.0) == linger_for(5.0) == 0.0
    w = StoreWriter(db, queue_max=1000, linger_s=linger_for(1.0))
    w.start()
    try:
        for i in range(5):
            submit(w, 1, start_i=i)
            if i < 4:
                time.sleep(0.8)  # about the agent's cadence, with 1.8 s to spare on a loaded machine
        assert w.flush(30)
        st = w.stats()
    finally:
        w.close()
    assert st["written_ticks"] == 5 and st["dropped"] == 0
    assert st["tick_commits"] == 1, st
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT count(*), count(DISTINCT ts_ms) FROM gpu_samples").fetchone() == (40, 5)
        assert conn.execute("SELECT count(*) FROM host_samples").fetchone()[0] == 5
    finally:
        conn.close()


class _CountingCondition(threading.Condition):
    """The writer's condition, counting submit_tick's notifies (the test thread's) and the thread's wake-ups."""

    def __init__(self) -> None:
        super().__init__()
        self.notifies = 0
        self.writer_wakeups = 0

    def notify(self, n: int = 1) -> None:
        if threading.current_thread() is threading.main_thread():
            self.notifies += 1
        super().notify(n)

    def notify_all(self) -> None:  # flush() and close(): not counted
        super().notify(len(self._waiters))

    def wait(self, timeout: float | None = None) -> bool:
        out = super().wait(timeout)
        if threading.current_thread().name == "lynxtop-store-writer":
            self.writer_wakeups += 1
        return out


def _asleep(w: StoreWriter, cv: _CountingCondition) -> None:
    deadline = time.monotonic() + 30
    while not cv._waiters and time.monotonic() < deadline:  # the thread waits on the condition
        time.sleep(0.01)


def test_a_lingering_writer_fed_tick_after_tick_is_not_woken_by_each_second_s_first_tick(db):
    """At 10 Hz (issue 29.3) the old writer was woken twice a linger: by the first tick of each second (to start
    waiting for the rest) and at the linger's end. Now the thread, after a batch, already waits one linger ahead,
    and ticks submitted meanwhile do not wake it (no notify from the sampling thread). Each cycle here is a tick
    then a flush (the flush stands in for the linger's end, so nothing depends on timing): one notify for the
    very first tick and one wake-up a batch, where the old writer had a notify and two wake-ups a batch."""
    w = StoreWriter(db, queue_max=1000, linger_s=600.0, wal_check_interval_s=1e6, maintenance_interval_s=1e6)
    cv = w._cv = _CountingCondition()
    w.start()
    cycles = 10
    try:
        _asleep(w, cv)
        for i in range(cycles):
            submit(w, 1, start_i=i)
            _asleep(w, cv)  # woken or not, back asleep before the flush (the old one lingered)
            assert w.flush(30)
            _asleep(w, cv)
        st = w.stats()
    finally:
        w.close()
    assert st["written_ticks"] == cycles and st["tick_commits"] == cycles and st["dropped"] == 0
    assert cv.notifies == 1  # the first tick, the thread then idle; the old writer: one per tick (10)
    assert cv.writer_wakeups <= cycles + 2  # a flush's each, and the first tick's; the old writer: 2 a cycle


def test_a_tick_is_due_within_one_linger_of_its_submit_even_while_the_thread_waits_ahead(db):
    """The promise the wake-ups were cut under (docs/store.md): a tick waits at most `linger_s` to be written,
    whether it starts a second (the thread idle: it is woken) or comes while the thread already waits for the
    next batch (not woken: that batch is due sooner); it lingers at least until then for the others."""
    linger = 600.0
    w = StoreWriter(db, queue_max=1000, linger_s=linger, wal_check_interval_s=1e6, maintenance_interval_s=1e6)
    cv = w._cv = _CountingCondition()
    w.start()
    try:
        _asleep(w, cv)
        for i in range(4):
            before = time.monotonic()
            submit(w, 1, start_i=i)
            assert before - 1.0 < w._due_at <= time.monotonic() + linger  # never later than a linger
            if i % 2:
                assert w.flush(30)
                _asleep(w, cv)
        assert cv.notifies == 1
        st = w.stats()
    finally:
        w.close()
    assert st["tick_commits"] == 2 and st["written_ticks"] == 4  # nothing went before its linger but by flush


def test_a_lingering_writer_never_started_writes_its_ticks_when_closed(db):
    """A tool or test may use the writer without its thread; with a linger, close() used to find the queued
    ticks not yet due and drain nothing, forever. Now closing writes them at once."""
    w = StoreWriter(db, queue_max=1000, linger_s=600.0)
    submit(w, 3)
    closer = threading.Thread(target=w.close, daemon=True)
    closer.start()
    closer.join(30)
    assert not closer.is_alive()
    c = sqlite3.connect(db)
    try:
        assert c.execute("SELECT count(DISTINCT ts_ms) FROM gpu_samples").fetchone()[0] == 3
    finally:
        c.close()
