"""NVLink per-link and process readings are stored once, at the tick that read them (store/writer.py SlowRows):
a tick carries the same row objects until the next read, so only a new object is written. A reading that went
away (a link down, a process list read empty, a lost GPU) is stored at the tick it was read, and a writer that
starts again stores what its first tick shows; the reader takes each GPU's newest row at or before a time
(store/reader.py slow_at). A batch the database refuses keeps its readings for the per-tick retry."""

from __future__ import annotations

import sqlite3

from lynxtop.contract.columns import NVLINK_METRICS, names
from lynxtop.store.reader import StoreReader
from lynxtop.store.schema import NO_PROCESS_PID
from lynxtop.store.writer import StoreWriter

from .helpers import T0, gpu_row

LINKS = names(NVLINK_METRICS)


def link(gpu: int, v: int) -> dict:
    return {"gpu": gpu, **dict.fromkeys(LINKS), LINKS[0]: v, LINKS[1]: v + 1}


def proc(gpu: int, pid: int, mem: int = 5) -> dict:
    return {"gpu": gpu, "pid": pid, "used_mem_bytes": mem, "in_vllm_tree": 1, "sm_util_pct": 3}


def rows(db, table: str) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        cols = "ts_ms, gpu, pid" if table == "gpu_processes" else f"ts_ms, gpu, {LINKS[0]}"
        return con.execute(f"SELECT {cols} FROM {table} ORDER BY ts_ms, gpu").fetchall()
    finally:
        con.close()


def read_at(db, table: str, ts: int) -> list:
    r = StoreReader(db)
    try:
        key = "pid" if table == "processes" else LINKS[0]
        return sorted((x["gpu"], x[key]) for x in r.slow_at(table, ts))
    finally:
        r.close()


def test_link_down_process_exit_and_lost_gpu_are_stored_at_the_tick_read(tmp_path):
    db = tmp_path / "h.db"
    l0, l1 = link(0, 100), link(1, 200)
    p0, p1 = [proc(0, 10)], [proc(1, 11), proc(1, 12)]
    with StoreWriter(db) as w:
        for k in range(10):  # one reading carried by ten ticks
            w.submit_tick(T0 + 100 * k, [gpu_row(0, k), gpu_row(1, k)], None, None, [l0, l1], [*p0, *p1])
        # tick 10 reads again: GPU 0's link is down and its process gone; GPU 1 reads new objects
        l1b, p1b = link(1, 300), [proc(1, 12, mem=9)]
        for k in range(10, 15):
            w.submit_tick(T0 + 100 * k, [gpu_row(0, k), gpu_row(1, k)], None, None, [l1b], p1b)
        # tick 15: GPU 1 is lost (its lost row still names it), GPU 0 unchanged
        w.submit_tick(T0 + 1500, [gpu_row(0, 15), {"gpu": 1, "lost": 1}], None, None, [], [])
    assert rows(db, "nvlink_samples") == [(T0, 0, 100), (T0, 1, 200), (T0 + 1000, 0, None), (T0 + 1000, 1, 300),
                                          (T0 + 1500, 1, None)]
    assert rows(db, "gpu_processes") == [(T0, 0, 10), (T0, 1, 11), (T0, 1, 12), (T0 + 1000, 0, NO_PROCESS_PID),
                                         (T0 + 1000, 1, 12), (T0 + 1500, 1, NO_PROCESS_PID)]
    for ts in (T0, T0 + 500, T0 + 999):  # between reads: the newest earlier reading
        assert read_at(db, "nvlink", ts) == [(0, 100), (1, 200)]
        assert read_at(db, "processes", ts) == [(0, 10), (1, 11), (1, 12)]
    for ts in (T0 + 1000, T0 + 1499):
        assert read_at(db, "nvlink", ts) == [(1, 300)]
        assert read_at(db, "processes", ts) == [(1, 12)]
    assert read_at(db, "nvlink", T0 + 1500) == [] and read_at(db, "processes", T0 + 9000) == []


def test_a_writer_started_again_stores_what_its_first_tick_shows(tmp_path):
    db = tmp_path / "h.db"
    with StoreWriter(db) as w:
        w.submit_tick(T0, [gpu_row(0, 0)], None, None, [link(0, 100)], [proc(0, 10)])
    with StoreWriter(db) as w:  # the agent again: GPU 0 now idle, no link reading yet (the first is a base)
        for k in range(1, 5):
            w.submit_tick(T0 + 100 * k, [gpu_row(0, k)], None, None, [], [])
    assert rows(db, "gpu_processes") == [(T0, 0, 10), (T0 + 100, 0, NO_PROCESS_PID)]
    assert rows(db, "nvlink_samples") == [(T0, 0, 100), (T0 + 100, 0, None)]
    assert read_at(db, "processes", T0 + 50) == [(0, 10)]
    assert read_at(db, "processes", T0 + 400) == [] and read_at(db, "nvlink", T0 + 400) == []


def test_a_refused_batch_keeps_its_readings_for_the_retry(tmp_path):
    db = tmp_path / "h.db"
    w = StoreWriter(db)
    l0, p0 = link(0, 100), [proc(0, 10)]
    # queued before the thread starts: one batch; its last tick holds an int SQLite cannot take
    w.submit_tick(T0, [gpu_row(0, 0)], None, None, [l0], p0)
    bad = {**gpu_row(0, 1), "power_w": 2 ** 70}
    w.submit_tick(T0 + 100, [bad], None, None, [l0], p0)
    w.submit_tick(T0 + 200, [gpu_row(0, 2)], None, None, [l0], p0)
    w.start()
    w.close()
    # the batch failed as a whole; tick by tick, the first stores the reading, the others carry it
    assert rows(db, "nvlink_samples") == [(T0, 0, 100)]
    assert rows(db, "gpu_processes") == [(T0, 0, 10)]


def test_newest_at_or_before_reads_compacted_chunks_as_raw_rows(tmp_path):
    from lynxtop.store import compact
    from lynxtop.store.rollup import load_watermarks
    from lynxtop.store.schema import chunk_table, connect_rw

    db = tmp_path / "h.db"
    hour = 3_600_000
    with StoreWriter(db, maintenance_interval_s=3600) as w:
        l0, p0 = link(0, 100), proc(0, 10)
        w.submit_tick(T0, [gpu_row(0, 0), gpu_row(1, 0)], None, None, [l0], [p0, proc(1, 11)])
        lost = {"gpu": 1, "lost": 1}  # GPU 1 lost: its process list gone
        w.submit_tick(T0 + 1000, [gpu_row(0, 1), lost], None, None, [l0], [p0])
        w.submit_tick(T0 + 4 * hour, [gpu_row(0, 2), lost], None, None, [link(0, 300)], [proc(0, 12)])  # raw
    times = (T0, T0 + 500, T0 + 1000, T0 + 2 * hour, T0 + 4 * hour)
    before = {(t, k): read_at(db, k, t) for t in times for k in ("processes", "nvlink")}
    conn = connect_rw(db)
    try:
        wm = load_watermarks(conn)
        while compact.step(conn, wm)[1]:
            pass
        chunked = conn.execute(f"SELECT sum(rows) FROM {chunk_table('gpu_processes')}").fetchone()[0]
    finally:
        conn.close()
    assert chunked == 3  # the first two ticks' rows (the marker too) moved into chunks
    assert {(t, k): read_at(db, k, t) for t in times for k in ("processes", "nvlink")} == before
    assert before[(T0 + 500, "processes")] == [(0, 10), (1, 11)]
    assert before[(T0 + 2 * hour, "processes")] == [(0, 10)]
    assert before[(T0 + 4 * hour, "nvlink")] == [(0, 300)]


def test_a_tick_dropped_from_a_full_queue_loses_no_reading(tmp_path):
    db = tmp_path / "h.db"
    w = StoreWriter(db, queue_max=2)
    l0, p0 = link(0, 100), [proc(0, 10)]
    for k in range(3):  # queued before the thread starts: the first (the read) is dropped
        w.submit_tick(T0 + 100 * k, [gpu_row(0, k)], None, None, [l0], p0)
    w.start()
    w.close()
    assert rows(db, "nvlink_samples") == [(T0 + 100, 0, 100)]
    assert rows(db, "gpu_processes") == [(T0 + 100, 0, 10)]
