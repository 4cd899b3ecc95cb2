"""Non-finite readings (NaN, +-Inf) end as no reading: the writer stores them as NULL in INTEGER and REAL columns
alike (on every path a tick's rows take), and `lynxtop export` writes an empty cell for the +-Inf an older writer
left: INT64 max/min in an INTEGER column (its CAST(? + 0.5 AS INTEGER) made them so), Inf in a REAL one. Such a
file exports without failing, the same before and after compaction, and the chunk codec keeps INT64 min/max."""

from __future__ import annotations

import csv
import io
import math
import sqlite3

import pytest

from lynxtop.store import codec, compact
from lynxtop.store.export import export_table
from lynxtop.store.reader import StoreReader
from lynxtop.store.rollup import load_watermarks
from lynxtop.store.schema import chunk_table, connect_rw
from lynxtop.store.writer import StoreWriter

from .helpers import T0, gpu_row, host_row, serving_row, submit

pytestmark = pytest.mark.timeout(120)

INT64_MAX, INT64_MIN = 2**63 - 1, -(2**63)
NONFINITE = [math.inf, -math.inf, math.nan]


def _export(db, tmp_path, table: str = "gpu", name: str = "out") -> list[list[str]]:
    out = tmp_path / f"{name}_{table}.csv"
    with StoreReader(db) as r:
        export_table(r, table, "raw", T0 - 1000, T0 + 10 * 3_600_000, out, force=True,
                     progress_stream=io.StringIO())
    return list(csv.reader(out.open(newline="")))


def _cell(rows: list[list[str]], ts: int, col: str, gpu: int | None = None) -> str:
    head = rows[0]
    for r in rows[1:]:
        if int(r[1]) == ts and (gpu is None or int(r[head.index("gpu")]) == gpu):
            return r[head.index(col)]
    raise AssertionError(f"no row at {ts} (gpu {gpu})")


def _stored(db, sql: str, params: tuple = ()) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def _writer(db) -> StoreWriter:
    w = StoreWriter(db, queue_max=10_000)
    w.start()
    return w


@pytest.mark.parametrize("value", NONFINITE, ids=["inf", "-inf", "nan"])
def test_a_nonfinite_reading_is_stored_as_null_and_exports_empty(tmp_path, value):
    """One tick alone (its rows go row by row) and one among many in a batch (whole-statement paths): each
    non-finite INTEGER (power_w, a process's memory) and REAL (host cpu_pct, serving requests_per_s) reading
    is stored as NULL, its neighbours as they were, and the export has an empty cell."""
    db = tmp_path / "h.db"
    w = _writer(db)
    submit(w, 2, gpus=2)
    assert w.flush(60)
    alone = T0 + 10_000  # one tick written by itself: one host and one serving row
    w.submit_tick(alone, [{**gpu_row(0, 10), "power_w": value}, gpu_row(1, 10)],
                  {**host_row(10), "cpu_pct": value}, {**serving_row(10), "requests_per_s": value},
                  process_rows=[{"gpu": 0, "pid": 42, "used_mem_bytes": value, "in_vllm_tree": 1}])
    assert w.flush(60)
    w.close()
    # 40 ticks queued before the writer starts: one batch, GPU rows as whole statements, host and serving rows
    # (text, None) by their NULL pattern
    w = StoreWriter(db, queue_max=10_000)
    batch = [T0 + (100 + i) * 1000 for i in range(40)]
    for i, ts in enumerate(batch):
        odd = i == 20
        w.submit_tick(ts, [gpu_row(0, i), {**gpu_row(1, i), "power_w": value} if odd else gpu_row(1, i)],
                      {**host_row(i), "cpu_pct": value} if odd else host_row(i),
                      {**serving_row(i), "requests_per_s": value} if odd else serving_row(i))
    w.start()
    assert w.flush(60)
    w.close()

    odd_ts = batch[20]
    assert _stored(db, "SELECT gpu, typeof(power_w) FROM gpu_samples WHERE ts_ms IN (?, ?) ORDER BY ts_ms, gpu",
                   (alone, odd_ts)) == [(0, "null"), (1, "integer"), (0, "integer"), (1, "null")]
    for table, col in (("host_samples", "cpu_pct"), ("serving_samples", "requests_per_s")):
        got = _stored(db, f"SELECT ts_ms, typeof({col}) FROM {table} WHERE ts_ms IN (?, ?, ?) ORDER BY ts_ms",
                      (alone, odd_ts, odd_ts + 1000))
        assert got == [(alone, "null"), (odd_ts, "null"), (odd_ts + 1000, "real")], table
    assert _stored(db, "SELECT typeof(used_mem_bytes) FROM gpu_processes WHERE ts_ms = ? AND pid = 42",
                   (alone,)) == [("null",)]

    gpu = _export(db, tmp_path)
    assert _cell(gpu, alone, "power_w", 0) == "" and _cell(gpu, odd_ts, "power_w", 1) == ""
    assert _cell(gpu, alone, "power_w", 1).isdigit() and _cell(gpu, odd_ts, "power_w", 0).isdigit()
    host = _export(db, tmp_path, "host")
    assert _cell(host, alone, "cpu_pct") == "" and _cell(host, odd_ts, "cpu_pct") == ""
    serving = _export(db, tmp_path, "serving")
    assert _cell(serving, odd_ts, "requests_per_s") == "" and _cell(serving, odd_ts + 1000, "requests_per_s") != ""


def _old_writer_infinities(db, ts: int) -> None:
    """What an older writer stored for +-Inf: INT64 max/min in INTEGER columns, +-Inf in REAL ones."""
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE gpu_samples SET power_w = ?, temp_c = ? WHERE ts_ms = ? AND gpu = 0",
                     (INT64_MAX, INT64_MIN, ts))
        conn.execute("UPDATE host_samples SET cpu_pct = ?, load1 = ? WHERE ts_ms = ?", (math.inf, -math.inf, ts))
    conn.close()
    assert _stored(db, "SELECT power_w, temp_c FROM gpu_samples WHERE ts_ms = ? AND gpu = 0",
                   (ts,)) == [(INT64_MAX, INT64_MIN)]


def test_an_older_writers_infinities_export_as_empty_cells(tmp_path):
    """INT64 max exported as 9223372036854775807 and INT64 min failed the whole export ('integer overflow',
    reported as a database that is not ours); both are empty cells now, as REAL +-Inf are."""
    db = tmp_path / "h.db"
    w = _writer(db)
    submit(w, 3, gpus=2)
    assert w.flush(60)
    w.close()
    ts = T0 + 1000
    _old_writer_infinities(db, ts)
    gpu = _export(db, tmp_path)
    assert (_cell(gpu, ts, "power_w", 0), _cell(gpu, ts, "temp_c", 0)) == ("", "")
    assert _cell(gpu, ts, "power_w", 1).isdigit() and _cell(gpu, T0, "temp_c", 0).isdigit()
    host = _export(db, tmp_path, "host")
    assert (_cell(host, ts, "cpu_pct"), _cell(host, ts, "load1")) == ("", "")
    assert _cell(host, T0, "cpu_pct") != ""


def test_codec_round_trips_int64_extremes_exactly():
    rows = [(1, INT64_MAX, INT64_MIN), (2, INT64_MIN, INT64_MAX), (3, 0, None), (4, INT64_MAX, INT64_MAX),
            (5, -1, INT64_MIN)]
    names, back = codec.decode(codec.encode(["ts_ms", "a", "b"], rows))
    assert names == ["ts_ms", "a", "b"]
    assert back == rows and all(type(v) is type(o) for r, s in zip(back, rows, strict=True)
                                for v, o in zip(r, s, strict=True))


def test_older_infinities_export_the_same_after_compaction(tmp_path, monkeypatch):
    """A compacted interval holding INT64 max/min (and REAL +-Inf) exports byte for byte as it did raw."""
    db = tmp_path / "h.db"
    hours = 2.5
    w = StoreWriter(db, queue_max=100_000, maintenance_interval_s=3600, clock=lambda: T0 / 1000 + hours * 3600)
    w.start()
    submit(w, int(hours * 360), gpus=2, step_ms=10_000)
    assert w.flush(120)
    w.close()
    ts = T0 + 20_000  # in the first ten-minute interval: compacted below
    _old_writer_infinities(db, ts)
    before = {t: (tmp_path / f"before_{t}.csv") for t in ("gpu", "host")}
    for t in before:
        _export(db, tmp_path, t, "before")
    monkeypatch.setattr(compact, "KEEP_RAW_MS", 30 * 60_000)
    conn = connect_rw(db)
    try:
        wm = load_watermarks(conn)
        moved = 0
        while True:
            n, more = compact.step(conn, wm, now_ms=T0 + int(hours * 3_600_000))
            moved += n
            if not more:
                break
    finally:
        conn.close()
    assert moved > 0
    assert _stored(db, "SELECT count(*) FROM gpu_samples WHERE ts_ms = ?", (ts,)) == [(0,)]  # in a chunk now
    assert _stored(db, f"SELECT count(*) FROM {chunk_table('gpu_samples')}")[0][0] > 0
    for t in before:
        _export(db, tmp_path, t, "after")
        assert (tmp_path / f"after_{t}.csv").read_bytes() == (tmp_path / f"before_{t}.csv").read_bytes(), t
    assert _cell(_export(db, tmp_path), ts, "power_w", 0) == ""


def test_the_minute_rollups_leave_out_an_infinite_reading(tmp_path):
    """The in-memory 1-minute rollups get the rows as submitted: an Inf the raw table holds as NULL must not
    count there either (n 59 of 60, the average of the others), for INTEGER and REAL columns alike."""
    db = tmp_path / "h.db"
    w = StoreWriter(db, queue_max=10_000, clock=lambda: T0 / 1000 + 600)
    for i in range(180):
        odd = i == 30
        w.submit_tick(T0 + i * 1000, [{**gpu_row(0, i), "power_w": math.inf} if odd else gpu_row(0, i)],
                      {**host_row(i), "cpu_pct": math.inf} if odd else host_row(i), serving_row(i))
    w.start()
    assert w.flush(60)
    w.close()
    assert _stored(db, "SELECT power_w_n FROM gpu_1m WHERE ts_ms = ?", (T0,)) == [(59,)]
    want = _stored(db, "SELECT min(cpu_pct), max(cpu_pct), count(cpu_pct) FROM host_samples "
                   "WHERE ts_ms >= ? AND ts_ms < ?", (T0, T0 + 60_000))
    assert want[0][2] == 59
    assert _stored(db, "SELECT cpu_pct_min, cpu_pct_max, cpu_pct_n FROM host_1m WHERE ts_ms = ?", (T0,)) == want
