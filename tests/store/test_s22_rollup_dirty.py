"""Late samples' rollup buckets are kept in the database (rollup_dirty), not only in the writer's memory.

A tick that lands in a minute already rolled up (a clock stepped back, rows carried from a swapped database)
commits its bucket's "re-roll me" mark in the tick's own transaction; a restart loads the marks and the next
rollup step recomputes the bucket and deletes the marks in its own transaction. Each test works on a real
SQLite file; the crash is a real SIGKILL of a child process, at a chosen statement (SQLite's trace callback).
"""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
import sys

from lynxtop.store import rollup, schema
from lynxtop.store.writer import StoreWriter

from .helpers import T0, gpu_row, host_row, serving_row

PRELUDE = r"""
import os, signal, sys, sqlite3
sys.path.insert(0, sys.argv[2])
T0 = int(sys.argv[3])
def kill_at(conn, pattern, nth=1, after=None):
    seen = {"n": 0, "armed": after is None}
    def trace(sql):
        s = sql.strip()
        if not seen["armed"]:
            if s.startswith(after):
                seen["armed"] = True
            return
        if s.startswith(pattern):
            seen["n"] += 1
            if seen["n"] >= nth:
                os.kill(os.getpid(), signal.SIGKILL)
    conn.set_trace_callback(trace)
"""

LATE_CHILD = r"""
from helpers import gpu_row, host_row, serving_row
from lynxtop.store.writer import StoreWriter
w = StoreWriter(sys.argv[1], queue_max=100_000)
w.start()
for i in range(0, 200):  # minutes 0..2 rolled up
    w.submit_tick(T0 + i * 1000, [gpu_row(g, i) for g in range(2)], host_row(i), serving_row(i))
assert w.flush(30)
# a connection of its own: the writer's thread runs its file checks on w.conn every 2 s, flushed or not
c = sqlite3.connect(sys.argv[1])
assert int(c.execute("SELECT value FROM meta WHERE key = 'rollup_wm_gpu_1m'").fetchone()[0]) >= T0 + 180_000
c.close()
kill_at(w.conn, "BEGIN", after="COMMIT")  # the next transaction after the late tick's commit: the rollup step
w.submit_tick(T0 + 60_500, [gpu_row(g, 999) for g in range(2)], host_row(999), serving_row(999))
w.flush(30)
print("not killed", flush=True)
"""


def _tick(w: StoreWriter, i: int, gpus: int = 2, ts: int | None = None) -> None:
    w.submit_tick(T0 + i * 1000 if ts is None else ts, [gpu_row(g, i) for g in range(gpus)], host_row(i),
                  serving_row(i))


def _counts(db) -> dict[str, tuple]:
    """Per kind: (samples of minute 1 in its 1m rollup, raw rows of minute 1, samples of hour 0 in 1h)."""
    c = sqlite3.connect(db)
    out = {}
    for kind, table, gpu in (("gpu", "gpu_samples", " AND gpu = 0"), ("host", "host_samples", ""),
                             ("serving", "serving_samples", "")):
        m = c.execute(f"SELECT samples FROM {kind}_1m WHERE ts_ms = ?{gpu}", (T0 + 60_000,)).fetchone()
        raw = c.execute(f"SELECT count(*) FROM {table} WHERE ts_ms >= ? AND ts_ms < ?{gpu}",
                        (T0 + 60_000, T0 + 120_000)).fetchone()[0]
        h = c.execute(f"SELECT samples FROM {kind}_1h WHERE ts_ms = ?{gpu}", (T0,)).fetchone()
        out[kind] = (m and m[0], raw, h and h[0])
    c.close()
    return out


def _sql_rollups(db) -> dict[str, list]:
    """Every 1m and 1h rollup row, as stored."""
    c = sqlite3.connect(db)
    out = {f"{k}_{r}": c.execute(f"SELECT * FROM {k}_{r} ORDER BY 1, 2").fetchall()
           for k in schema.ROLLUP_KINDS for r in schema.RESOLUTIONS}
    c.close()
    return out


def test_late_sample_committed_just_before_a_sigkill_is_rolled_up_after_the_restart(tmp_path):
    db = tmp_path / "late.db"
    p = subprocess.run([sys.executable, "-c", PRELUDE + LATE_CHILD, str(db), os.path.dirname(__file__), str(T0)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stdout, p.stderr)
    c = sqlite3.connect(db)
    assert c.execute("SELECT count(*) FROM gpu_samples WHERE ts_ms = ?", (T0 + 60_500,)).fetchone()[0] == 2
    marks = c.execute("SELECT kind, res, bucket_ms FROM rollup_dirty ORDER BY 1, 2").fetchall()
    c.close()
    # the hour is not complete yet (no 1h watermark): only the minute is marked, for each rolled-up kind
    assert marks == [(k, "1m", T0 + 60_000) for k in sorted(schema.ROLLUP_KINDS)], marks
    w = StoreWriter(db, queue_max=100_000)  # the agent restarts and goes on writing
    w.start()
    for i in range(200, 3700):  # past the hour: hour 0 is rolled up too
        _tick(w, i)
    assert w.flush(60)
    w.close()
    got = _counts(db)
    for kind, (minute, raw, hour) in got.items():
        assert raw == 61, (kind, raw)
        assert minute == raw, f"{kind}_1m minute 1 counts {minute} samples, the raw table holds {raw}"
        assert hour == 3600 + 1, (kind, hour)
    c = sqlite3.connect(db)
    assert c.execute("SELECT count(*) FROM rollup_dirty").fetchone()[0] == 0  # re-rolled: the marks are gone
    c.close()


def _fail_minute_1(db) -> None:
    """A trigger that makes every write of gpu_1m's minute 1 fail, as a full disk fails the rollup step."""
    c = sqlite3.connect(db)
    c.execute(f"CREATE TRIGGER fail_1m BEFORE INSERT ON gpu_1m WHEN NEW.ts_ms = {T0 + 60_000} "
              "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END")
    c.commit()
    c.close()


def test_late_sample_whose_rollup_step_kept_failing_is_rolled_up_after_a_clean_restart(tmp_path):
    db = tmp_path / "fail.db"
    w = StoreWriter(db, queue_max=100_000)
    w.start()
    for i in range(200):
        _tick(w, i)
    assert w.flush(30)
    w.close()
    _fail_minute_1(db)
    w = StoreWriter(db, queue_max=100_000, retry_interval_s=0.05)
    w.start()
    _tick(w, 999, ts=T0 + 60_500)
    _tick(w, 200)
    assert w.flush(30)
    assert "rollup/retention failed" in (w.stats().get("last_error") or ""), w.stats()
    w.close()  # a clean stop while the step still fails: the late minute was never re-rolled
    c = sqlite3.connect(db)
    c.execute("DROP TRIGGER fail_1m")  # the disk has room again
    c.commit()
    c.close()
    w = StoreWriter(db, queue_max=100_000)
    w.start()
    for i in range(201, 3700):
        _tick(w, i)
    assert w.flush(60)
    w.close()
    minute, raw, hour = _counts(db)["gpu"]
    assert (minute, raw, hour) == (61, 61, 3601)


def test_common_path_writes_no_mark_and_a_late_tick_marks_inside_its_own_transaction(tmp_path):
    """Issue 29's per-tick cost: in-order ticks run no statement on rollup_dirty; a late tick's marks are
    written between its BEGIN and its COMMIT (one transaction with its rows)."""
    db = tmp_path / "trace.db"
    w = StoreWriter(db, queue_max=100_000)
    w.start()
    for i in range(200):
        _tick(w, i)
    assert w.flush(30)
    seen: list[str] = []
    w.conn.set_trace_callback(seen.append)
    for i in range(200, 260):
        _tick(w, i)
    assert w.flush(30)
    assert not [s for s in seen if "rollup_dirty" in s], seen
    seen.clear()
    _tick(w, 999, ts=T0 + 60_500)
    assert w.flush(30)
    w.conn.set_trace_callback(None)
    w.close()
    stmts = [s.strip().split()[0].upper() + (" dirty" if "rollup_dirty" in s else "") for s in seen]
    first_mark = next(i for i, s in enumerate(stmts) if s == "INSERT dirty")
    begin = max(i for i in range(first_mark) if stmts[i] == "BEGIN")
    commit = next(i for i in range(first_mark, len(stmts)) if stmts[i] == "COMMIT")
    assert "INSERT" in stmts[begin + 1:first_mark], stmts  # the tick's own rows, in the same transaction
    assert any(s == "DELETE dirty" for s in stmts[commit:]), stmts  # the step re-rolled and cleared it
    assert _counts(db)["gpu"][:2] == (61, 61)


def test_a_schema_3_file_with_data_migrates_and_late_rows_are_marked(tmp_path):
    db = tmp_path / "v3.db"
    w = StoreWriter(db, queue_max=100_000)
    w.start()
    for i in range(200):
        _tick(w, i)
    assert w.flush(30)
    w.close()
    c = sqlite3.connect(db, isolation_level=None)
    c.execute("DROP TABLE rollup_dirty")
    c.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")  # as lynxtop before session 22 left it
    c.close()
    w = StoreWriter(db, queue_max=100_000)
    assert schema.schema_version(w.conn) == schema.SCHEMA_VERSION == 4
    ddl = w.conn.execute("SELECT sql FROM sqlite_master WHERE name = 'rollup_dirty'").fetchone()[0]
    assert "WITHOUT ROWID" in ddl
    w.start()
    _tick(w, 999, ts=T0 + 60_500)
    _tick(w, 200)
    assert w.flush(30)
    w.close()
    assert _counts(db)["gpu"][:2] == (61, 61)


def test_a_dirty_minute_whose_raw_rows_were_compacted_re_rolls_over_its_chunks_after_a_restart(tmp_path):
    """Compaction moved the minute's rows into chunks before the restart: the re-roll reads chunks and raw rows
    together, and gives the rollups of a writer that got the late row in order."""
    from lynxtop.store import compact

    db = tmp_path / "got.db"
    w = StoreWriter(db, queue_max=100_000)
    w.start()
    for i in range(0, 900):
        _tick(w, i)
    assert w.flush(60)
    w.close()
    c = schema.connect_rw(db)
    for table in ("gpu_samples", "host_samples", "serving_samples"):
        assert compact.compact_interval(c, table, T0) > 0
    # the late tick's rows and marks, as the writer commits them, then a crash before any rollup step
    c.execute("BEGIN IMMEDIATE")
    wm = rollup.load_watermarks(c)
    c.executemany("INSERT INTO gpu_samples (ts_ms, gpu, util_gpu_pct) VALUES (?, ?, -5)",
                  [(T0 + 60_500, 0), (T0 + 60_500, 1)])
    rollup.mark_late(c, wm, "gpu", [T0 + 60_500])
    c.execute("COMMIT")
    c.close()
    r = rollup.Rollups(schema.connect_rw(db))
    assert r.dirty[("gpu", "1m")] == {T0 + 60_000}
    r.step()
    got = r.conn.execute("SELECT samples, util_gpu_pct_n, util_gpu_pct_min FROM gpu_1m WHERE ts_ms = ? AND gpu = 0",
                         (T0 + 60_000,)).fetchone()
    left = r.conn.execute("SELECT count(*) FROM rollup_dirty").fetchone()[0]
    r.conn.close()
    assert (got, left) == ((61, 61, -5), 0)  # the 60 compacted rows and the late raw one (its -5: the minimum)


def test_a_dirty_minute_older_than_raw_retention_is_dropped_with_a_reason(tmp_path, caplog):
    """Retention deleted (or is about to delete) the minute's other raw rows: a re-roll would replace the
    whole minute's rollup by one of the late rows alone, so the mark is dropped, the rollup kept, and why logged."""
    db = tmp_path / "ret.db"
    w = StoreWriter(db, queue_max=100_000)
    w.start()
    for i in range(200):
        _tick(w, i)
    assert w.flush(30)
    w.close()
    c = schema.connect_rw(db)
    before = c.execute("SELECT * FROM gpu_1m WHERE ts_ms = ?", (T0 + 60_000,)).fetchall()
    c.execute("BEGIN IMMEDIATE")
    c.execute("DELETE FROM gpu_samples WHERE ts_ms < ?", (T0 + 90_000,))  # retention cut inside minute 1
    c.executemany("INSERT INTO gpu_samples (ts_ms, gpu, util_gpu_pct) VALUES (?, ?, 1)",
                  [(T0 + 60_500, 0), (T0 + 60_500, 1)])
    rollup.mark_late(c, rollup.load_watermarks(c), "gpu", [T0 + 60_500])
    c.execute("COMMIT")
    c.close()
    r = rollup.Rollups(schema.connect_rw(db))
    with caplog.at_level(logging.WARNING, logger="lynxtop.store.rollup"):
        r.step(expired={"gpu_samples": T0 + 90_000, "gpu_1m": T0 - 86_400_000})
    after = r.conn.execute("SELECT * FROM gpu_1m WHERE ts_ms = ?", (T0 + 60_000,)).fetchall()
    left = r.conn.execute("SELECT count(*) FROM rollup_dirty").fetchone()[0]
    r.conn.close()
    assert after == before and left == 0
    assert any("gpu_samples" in m and "retention" in m for m in caplog.messages), caplog.messages


def test_rows_carried_from_a_swapped_database_below_its_watermark_are_marked_before_they_are_written(tmp_path):
    """The writer's carry-over (store/swap.py) into a file that already rolled those minutes up: the marks are
    committed first (a crash between leaves a harmless mark, never rows without one); in-order rows mark nothing."""
    from lynxtop.store import swap

    db = tmp_path / "swap.db"
    w = StoreWriter(db, queue_max=100_000)
    w.start()
    for i in range(200):
        _tick(w, i)
    assert w.flush(30)
    w.close()
    c = schema.connect_rw(db)
    StoreWriter._mark_carried(c, swap.Carried({"gpu_samples": (["ts_ms", "gpu"], [(T0 + 250_000, 0)])}))
    assert c.execute("SELECT count(*) FROM rollup_dirty").fetchone()[0] == 0
    StoreWriter._mark_carried(c, swap.Carried({"gpu_samples": (["gpu", "ts_ms"], [(0, T0 + 60_500)]),
                                               "host_samples": (["ts_ms"], [(T0 + 120_001,)])}))
    got = c.execute("SELECT kind, res, bucket_ms FROM rollup_dirty ORDER BY 1").fetchall()
    c.close()
    assert got == [("gpu", "1m", T0 + 60_000), ("host", "1m", T0 + 120_000)]
