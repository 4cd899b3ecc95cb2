"""Rollups of minutes whose raw rows compaction already moved into chunks.

What must hold: a late sample (the agent restarted after the wall clock was set back) that lands in such a
minute makes the rollup recompute that minute, and its hour, over the compacted rows and the raw rows
together, the raw row winning on an equal (ts, gpu) key (docs/reliability.md: "rolled up again over both"),
never over the late raw rows alone. The recomputed 1-minute and 1-hour rows are the rows the SQL rollup
gives when every row is raw: same types, same float bits. Minutes that no chunk overlaps take the old path
(no chunk is looked into), and a chunk that cannot be decoded leaves its minute's rollup as it was.
"""

from __future__ import annotations

import random
import sqlite3
import time

import pytest

from lynxtop.store import codec, compact
from lynxtop.store.rollup import Rollups, load_watermarks
from lynxtop.store.schema import RESOLUTIONS, ROLLUP_KINDS, chunk_table, connect_rw, rollup_table
from lynxtop.store.writer import StoreWriter

from .helpers import T0, gpu_row, host_row, serving_row, submit

HOUR = 3_600_000
MINUTE = 60_000
STEP = 10_000  # one tick per 10 s: 6 samples a minute, 360 an hour
TICKS = int(3.6 * 360)  # 3.6 h: compaction (3 h kept raw) moves the first three ten-minute intervals
COMPACTED_UNTIL = T0 + 30 * MINUTE
CLOCK = T0 / 1000 + 4 * 3600


def _wait(cond, what, limit_s=30.0):
    deadline = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _compact_all(conn: sqlite3.Connection) -> None:
    while compact.step(conn, load_watermarks(conn))[1]:
        pass


def _tick(i: int, ts: int | None = None, gpus: tuple[int, ...] = (0, 1)) -> tuple:
    """A tick whose REAL readings are awkward doubles (their sums round), so averages show any change of order."""
    rng = random.Random(i)
    host = host_row(i)
    host.update(cpu_pct=rng.uniform(0, 100), load1=rng.random() * 8)
    serving = serving_row(i)
    serving.update(requests_per_s=rng.random() * 10, ttft_p99_ms=rng.uniform(10, 500), tpot_p99_ms=1 / (i + 3))
    return (T0 + i * STEP if ts is None else ts), [gpu_row(g, i) for g in gpus], host, serving


def _build(db) -> None:
    w = StoreWriter(db, queue_max=100_000, maintenance_interval_s=3600, clock=lambda: CLOCK)
    w.start()
    for i in range(TICKS):
        w.submit_tick(*_tick(i))
    assert w.flush(60)
    w.close()


def _rollups(conn: sqlite3.Connection) -> dict[str, list[tuple]]:
    """Every 1-minute and 1-hour row, each value with its type and (floats) its bit pattern."""
    out = {}
    for kind in ROLLUP_KINDS:
        for res in RESOLUTIONS:
            rows = conn.execute(f"SELECT * FROM {rollup_table(kind, res)} ORDER BY 1, 2").fetchall()
            out[f"{kind}_{res}"] = [tuple((type(v).__name__, v.hex() if isinstance(v, float) else v) for v in r)
                                    for r in rows]
    return out


def test_late_sample_in_compacted_bucket_keeps_the_rollup_whole(tmp_path):
    """The auditor's case, through the writer: 6 samples in the minute (360 in the hour) plus a late one are
    7 (361), not the late one alone."""
    db = tmp_path / "h.db"
    w = StoreWriter(db, queue_max=100_000, maintenance_interval_s=3600, clock=lambda: CLOCK)
    w.start()
    submit(w, TICKS, gpus=1, step_ms=STEP)
    assert w.flush(60)
    w.close()
    conn = connect_rw(db)
    _compact_all(conn)
    assert conn.execute("SELECT count(*) FROM host_samples WHERE ts_ms < ?", (T0 + 600_000,)).fetchone()[0] == 0
    before = conn.execute("SELECT samples FROM host_1m WHERE ts_ms = ?", (T0,)).fetchone()
    before_g = conn.execute("SELECT samples FROM gpu_1m WHERE ts_ms = ? AND gpu = 0", (T0,)).fetchone()
    before_h = conn.execute("SELECT samples FROM gpu_1h WHERE ts_ms = ? AND gpu = 0", (T0,)).fetchone()
    conn.close()
    assert before == (6,) and before_g == (6,) and before_h == (360,)

    # the agent restarts after the wall clock was set back: one sample lands inside the compacted minute
    w = StoreWriter(db, maintenance_interval_s=0.05, clock=lambda: CLOCK)
    w.start()
    try:
        w.submit_tick(T0 + 5_000, [gpu_row(0, 99_999)], host_row(99_999))
        assert w.flush(10)
        c = sqlite3.connect(db)
        _wait(lambda: c.execute("SELECT count(*) FROM host_samples WHERE ts_ms = ?", (T0 + 5_000,)).fetchone()[0]
              == 0 or c.execute("SELECT samples FROM host_1m WHERE ts_ms = ?", (T0,)).fetchone() != (6,),
              "late sample never rolled up")
        time.sleep(0.5)
        got = c.execute("SELECT samples FROM host_1m WHERE ts_ms = ?", (T0,)).fetchone()
        got_g = c.execute("SELECT samples FROM gpu_1m WHERE ts_ms = ? AND gpu = 0", (T0,)).fetchone()
        got_h = c.execute("SELECT samples FROM gpu_1h WHERE ts_ms = ? AND gpu = 0", (T0,)).fetchone()
        c.close()
    finally:
        w.close()
    assert (got, got_g, got_h) == ((7,), (7,), (361,)), "rollup re-rolled from raw rows only, chunks ignored"


def test_recomputed_compacted_minutes_give_the_rollups_they_had_before_compaction(tmp_path):
    """Every compacted minute (and its hour) recomputed from scratch, its old rollup rows deleted first, gives
    the 1-minute and 1-hour rows it had before compaction, byte for byte, for all three kinds."""
    db = tmp_path / "h.db"
    _build(db)
    conn = connect_rw(db)
    try:
        before = _rollups(conn)
        _compact_all(conn)
        assert conn.execute("SELECT min(ts_ms) FROM host_samples").fetchone()[0] == COMPACTED_UNTIL
        minutes = list(range(T0, COMPACTED_UNTIL, MINUTE))
        for kind in ROLLUP_KINDS:  # what is there afterwards is what the recomputation wrote
            conn.execute(f"DELETE FROM {rollup_table(kind, '1m')} WHERE ts_ms < ?", (COMPACTED_UNTIL,))
            conn.execute(f"DELETE FROM {rollup_table(kind, '1h')} WHERE ts_ms = ?", (T0,))
        r = Rollups(conn)
        for kind in ROLLUP_KINDS:
            r.note_many(kind, minutes)  # as late samples in each of them would
        while r.step():
            pass
        after = _rollups(conn)
    finally:
        conn.close()
    assert all(before[k] for k in before) and after == before


def test_late_samples_in_compacted_minutes_roll_up_as_if_nothing_was_compacted(tmp_path):
    """Two copies of one database, one compacted, take the same late ticks (a new sample time inside a compacted
    minute; one on the very time and GPU of a compacted row, which replaces it; one in a minute still raw):
    their 1-minute and 1-hour tables end byte-identical."""
    db = tmp_path / "h.db"
    twin = tmp_path / "twin.db"
    _build(db)
    src, dst = sqlite3.connect(db), sqlite3.connect(twin)
    src.backup(dst)
    src.close()
    dst.close()
    conn = connect_rw(db)
    _compact_all(conn)
    assert conn.execute("SELECT min(ts_ms) FROM gpu_samples").fetchone()[0] == COMPACTED_UNTIL
    conn.close()

    late = [_tick(90_001, T0 + MINUTE + 5_000),  # a new time in compacted minute 1, both GPUs
            _tick(90_002, T0 + 20 * MINUTE, gpus=(1,)),  # an existing (time, GPU 1) of minute 20: replaced
            _tick(90_003, T0 + 2 * HOUR + 5_000)]  # a minute never compacted: the raw path
    for path in (db, twin):
        w = StoreWriter(path, maintenance_interval_s=3600, clock=lambda: CLOCK)
        w.start()
        try:
            for t in late:
                w.submit_tick(*t)
            assert w.flush(30)  # the batch and the maintenance after it (the rollup step) are done
        finally:
            w.close()
    got = {}
    for path in (db, twin):
        c = sqlite3.connect(path)
        got[path] = _rollups(c)
        samples = c.execute("SELECT ts_ms, gpu, samples FROM gpu_1m WHERE ts_ms IN (?, ?) ORDER BY 1, 2",
                            (T0 + MINUTE, T0 + 20 * MINUTE)).fetchall()
        hours = c.execute("SELECT gpu, samples FROM gpu_1h WHERE ts_ms = ? ORDER BY 1", (T0,)).fetchall()
        c.close()
        assert samples == [(T0 + MINUTE, 0, 7), (T0 + MINUTE, 1, 7), (T0 + 20 * MINUTE, 0, 6),
                           (T0 + 20 * MINUTE, 1, 6)], path
        assert hours == [(0, 361), (1, 361)], path
    assert got[db] == got[twin]


def test_each_re_roll_reads_the_chunks_as_they_are_now(tmp_path):
    """Decoded chunks are reused only while their blob is unchanged: a late row that compaction merged into its
    chunk after one re-roll counts in the next re-roll of that minute. They are not kept after a step that
    re-rolls no compacted minute."""
    db = tmp_path / "h.db"
    _build(db)
    conn = connect_rw(db)
    try:
        _compact_all(conn)
        r = Rollups(conn)
        got = []
        for ts in (T0 + MINUTE + 5_000, T0 + MINUTE + 6_000):
            conn.execute("INSERT INTO host_samples (ts_ms, cpu_pct) VALUES (?, 1.0)", (ts,))
            r.note_many("host", [ts])
            r.step()
            got.append(conn.execute("SELECT samples FROM host_1m WHERE ts_ms = ?", (T0 + MINUTE,)).fetchone())
            _compact_all(conn)  # the late row moves into its chunk: a new blob
            assert conn.execute("SELECT count(*) FROM host_samples WHERE ts_ms = ?", (ts,)).fetchone() == (0,)
        kept = set(r._decoded)
        r.note_many("host", [T0 + 2 * HOUR + 5_000])  # a late sample in a minute still raw
        r.step()
        hour = conn.execute("SELECT samples FROM host_1h WHERE ts_ms = ?", (T0,)).fetchone()
    finally:
        conn.close()
    assert got == [(7,), (8,)] and hour == (362,)
    assert kept == {"host_samples"} and r._decoded == {}


def test_a_late_sample_where_nothing_is_compacted_never_looks_into_chunks(tmp_path, monkeypatch):
    """The common path stays as it was: a late sample in a minute no chunk overlaps is rolled up by the one SQL
    statement over the raw table (no chunk decoded, no scratch table)."""
    db = tmp_path / "h.db"
    _build(db)
    conn = connect_rw(db)
    try:
        before = conn.execute("SELECT samples FROM host_1m WHERE ts_ms = ?", (T0 + MINUTE,)).fetchone()
        conn.execute("INSERT INTO host_samples (ts_ms, cpu_pct) VALUES (?, 1.0)", (T0 + MINUTE + 5_000,))

        def never(*a, **k):
            raise AssertionError("a chunk was looked into")

        for name in ("decode_rows", "chunk_blobs", "decode_blob"):
            monkeypatch.setattr(compact, name, never)
        monkeypatch.setattr(Rollups, "_roll_with_chunks", never)
        r = Rollups(conn)
        r.note_many("host", [T0 + MINUTE + 5_000])
        while r.step():
            pass
        after = conn.execute("SELECT samples FROM host_1m WHERE ts_ms = ?", (T0 + MINUTE,)).fetchone()
        scratch = conn.execute("SELECT count(*) FROM temp.sqlite_master").fetchone()[0]
    finally:
        conn.close()
    assert (before, after, scratch) == ((6,), (7,), 0)


def test_an_unreadable_chunk_leaves_its_minute_rollup_as_it_was(tmp_path):
    """A late sample in a minute whose chunk cannot be decoded (damage, a newer format) keeps that minute's
    rollup (never replaced by the late rows alone) and does not stop the rollups of the other kinds."""
    db = tmp_path / "h.db"
    _build(db)
    conn = connect_rw(db)
    try:
        _compact_all(conn)
        before = conn.execute("SELECT * FROM host_1m WHERE ts_ms = ?", (T0,)).fetchall()
        conn.execute(f"UPDATE {chunk_table('host_samples')} SET data = ? WHERE start_ms = ?", (b"\xff", T0))
        with pytest.raises(codec.CodecError):
            codec.decode(b"\xff")
        conn.execute("INSERT INTO host_samples (ts_ms, cpu_pct) VALUES (?, 1.0)", (T0 + 5_000,))
        conn.execute("INSERT INTO gpu_samples (ts_ms, gpu, temp_c) VALUES (?, 0, 1)", (T0 + 5_000,))
        r = Rollups(conn)
        r.note_many("host", [T0 + 5_000])
        r.note_many("gpu", [T0 + 5_000])
        while r.step():
            pass
        after = conn.execute("SELECT * FROM host_1m WHERE ts_ms = ?", (T0,)).fetchall()
        gpu = conn.execute("SELECT samples FROM gpu_1m WHERE ts_ms = ? AND gpu = 0", (T0,)).fetchone()
    finally:
        conn.close()
    assert after == before and gpu == (7,)
