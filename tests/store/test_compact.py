"""Compaction (issue 29.1): chunks decode exactly, every row is read once through the one reader, export is
byte-identical before and after, an interrupted chunk loses nothing, retention drops whole chunks."""

from __future__ import annotations

import io
import math
import random
import shutil
import sqlite3
import time

import pytest

from lynxtop.store import codec, compact, retention
from lynxtop.store.errors import StoreError
from lynxtop.store.export import export_table
from lynxtop.store.reader import StoreReader
from lynxtop.store.rollup import load_watermarks
from lynxtop.store.schema import RESOLUTIONS, ROLLUP_KINDS, chunk_table, connect_rw, migrate
from lynxtop.store.writer import StoreWriter

from .helpers import T0, submit

HOUR = 3_600_000


def _exact(rows: list[tuple]) -> list[tuple]:
    """Rows with each value's type and, for floats, its bit pattern (so -0.0 != 0.0 and NaN == NaN here)."""
    return [tuple((type(v).__name__, v.hex() if isinstance(v, float) else v) for v in r) for r in rows]


def _random_series(rng: random.Random, n: int) -> tuple[list[str], list[tuple]]:
    ts, rows = 1_700_000_000_000 + rng.randint(0, 10**6), []
    counter, scale = rng.randint(0, 10**12), rng.choice([1, 10, 100, 1000])
    for _ in range(n):
        ts += rng.choice([1000, 1000, 1000, 999, 1001, 5000, 0, -3_600_000, 7 * 86_400_000])  # gaps, clock steps
        counter = 0 if rng.random() < 0.02 else counter + rng.randint(0, 10**6)  # resets
        pick = rng.random()
        special = [0.0, -0.0, math.nan, math.inf, -math.inf, 5e-324, 1.7976931348623157e308]
        rows.append((
            ts, rng.randint(0, 7), counter,
            None if pick < 0.1 else rng.randint(-2**63, 2**63 - 1),
            None if pick < 0.2 else rng.uniform(-1e6, 1e6),
            rng.randint(0, 10**6) / scale,  # a decimal resolution: scaled
            rng.choice(special) if pick < 0.3 else rng.randint(0, 100) / 10,  # mostly scaled, sometimes not
            None if pick < 0.5 else rng.choice(["[1.0, 2.5]", "é\n,\"", ""]),
            rng.choice([1, 2.5, "x", None]),  # mixed types
            None,
        ))
    return ["ts_ms", "gpu", "energy_j", "big", "f", "scaled", "special", "text", "mixed", "empty"], rows


@pytest.mark.parametrize("seed", range(40))
def test_codec_round_trips_random_series_exactly(seed):
    rng = random.Random(seed)
    cols, rows = _random_series(rng, rng.choice([0, 1, 2, 7, 600]))
    names, back = codec.decode(codec.encode(cols, rows))
    assert names == cols
    assert _exact(back) == _exact(rows)


def test_codec_refuses_unknown_format_and_bytes():
    with pytest.raises(codec.CodecError, match="format 9"):
        codec.decode(b"\x09xyz")
    with pytest.raises(codec.CodecError, match="column b: values of type bytes"):
        codec.encode(["a", "b"], [(1, b"\x00")])


def _build(db, hours: float = 4.5) -> None:
    w = StoreWriter(db, queue_max=100_000, maintenance_interval_s=3600, clock=lambda: T0 / 1000 + hours * 3600)
    w.start()
    run_id = w.create_run(profile="p", started_ms=T0, ended_ms=T0 + int(hours * HOUR))
    submit(w, int(hours * 3600), gpus=2, null_every=7, run_id=run_id)
    assert w.flush(120)
    w.close()


def _exports(db, tmp_path, tag: str) -> dict[str, bytes]:
    out = {}
    with StoreReader(db) as r:
        for table in ("gpu", "host", "serving"):
            p = tmp_path / f"{tag}_{table}.csv"
            export_table(r, table, "raw", T0 - HOUR, T0 + 10 * HOUR, p, force=True, progress_stream=io.StringIO())
            out[table] = p.read_bytes()
        out["series"] = repr(r.series("gpu", None, T0 + 600_000, T0 + 1_800_000, resolution="raw")).encode()
        out["series_1m_tail"] = repr(r.series("gpu", ["power_w"], T0, T0 + 2 * HOUR, resolution="1m")).encode()
        out["summary"] = repr(r.run(1)).encode()
    return out


def _compact_all(db, fault=None) -> int:
    conn = connect_rw(db)
    try:
        wm = load_watermarks(conn)
        total = 0
        while True:
            n, more = compact.step(conn, wm)
            total += n
            if not more:
                return total
    finally:
        conn.close()


def test_export_and_queries_identical_after_compaction(tmp_path):
    db = tmp_path / "h.db"
    _build(db)
    before = _exports(db, tmp_path, "before")
    moved = _compact_all(db)
    conn = sqlite3.connect(db)
    chunks = conn.execute(f"SELECT count(*), sum(rows) FROM {chunk_table('gpu_samples')}").fetchone()
    raw_min = conn.execute("SELECT min(ts_ms) FROM gpu_samples").fetchone()[0]
    conn.close()
    # the newest 3 hours stay raw: 8 closed ten-minute intervals of 2 GPUs are compacted
    assert moved > 0 and chunks == (16, 2 * 8 * 600) and raw_min == T0 + 80 * 60_000
    after = _exports(db, tmp_path, "after")
    assert after == before


def test_writer_maintenance_compacts(tmp_path):
    db = tmp_path / "h.db"
    _build(db)
    w = StoreWriter(db, maintenance_interval_s=0.05, clock=lambda: T0 / 1000 + 4.5 * 3600)
    w.start()
    try:
        deadline = time.monotonic() + 60
        conn = sqlite3.connect(db)
        while not conn.execute(f"SELECT count(*) FROM {chunk_table('gpu_samples')}").fetchone()[0]:
            assert time.monotonic() < deadline, "the writer's maintenance did not compact"
            time.sleep(0.05)
        conn.close()
    finally:
        w.close()


@pytest.mark.parametrize("where", ["chunk written", "raw deleted"])
def test_interrupted_compaction_keeps_every_row_once(tmp_path, where):
    db = tmp_path / "h.db"
    _build(db, hours=3.3)
    before = _exports(db, tmp_path, "before")

    def fault(step: str) -> None:
        if step == where:
            raise KeyboardInterrupt(step)

    conn = connect_rw(db)
    with pytest.raises(KeyboardInterrupt):
        compact.compact_interval(conn, "gpu_samples", T0, fault)
    assert conn.execute(f"SELECT count(*) FROM {chunk_table('gpu_samples')}").fetchone()[0] == 0
    compact.compact_interval(conn, "gpu_samples", T0)  # then the pass after it
    compact.compact_interval(conn, "gpu_samples", T0)  # and once more: nothing doubles
    conn.close()
    assert _exports(db, tmp_path, "after") == before


def test_late_raw_rows_merge_into_their_chunk(tmp_path):
    db = tmp_path / "h.db"
    _build(db, hours=3.3)
    conn = connect_rw(db)
    compact.compact_interval(conn, "host_samples", T0)
    conn.execute("INSERT INTO host_samples (ts_ms, cpu_pct) VALUES (?, 99.5)", (T0 + 500,))  # a clock stepped back
    compact.compact_interval(conn, "host_samples", T0)
    rows = compact.decode_rows(conn, "host_samples", T0, T0 + 1000, ["ts_ms", "cpu_pct"])
    conn.close()
    assert [r for r in rows if r[0] < T0 + 1000] == [(T0, 12.5), (T0 + 500, 99.5)]


def test_a_far_future_row_does_not_make_recent_intervals_compact(tmp_path):
    """Compaction ages count from the newest stored sample, but, as retention's, never from later than now: one
    row from a clock years ahead leaves the newest 3 hours (by the wall clock) raw. A `now_ms` behind the data
    (a clock stepped back) holds compaction back until it catches up."""
    db = tmp_path / "h.db"
    conn = connect_rw(db)
    try:
        now = int(time.time() * 1000)
        base = now - now % HOUR - 5 * HOUR
        far = now + 10 * 365 * 86_400_000
        conn.executemany("INSERT INTO host_samples (ts_ms, cpu_pct) VALUES (?, 1.5)",
                         [(t,) for t in (*range(base, now, 10_000), far)])
        wm = {(k, r): far + HOUR for k in ROLLUP_KINDS for r in RESOLUTIONS}  # rolled up past every row
        assert compact.horizon(conn, "host_samples", wm, now_ms=now) == now - compact.KEEP_RAW_MS
        assert compact.step(conn, wm, now_ms=now - 4 * HOUR) == (0, False)  # nothing is 3 h older than that
        while compact.step(conn, wm)[1]:  # the wall clock
            pass
        raw_min = conn.execute("SELECT min(ts_ms) FROM host_samples").fetchone()[0]
        limit = int(time.time() * 1000) - compact.KEEP_RAW_MS
        kept = conn.execute("SELECT count(*) FROM host_samples WHERE ts_ms >= ?", (raw_min,)).fetchone()[0]
    finally:
        conn.close()
    assert now - compact.KEEP_RAW_MS - compact.CHUNK_MS < raw_min <= limit  # was: all but the far row compacted
    assert kept == 1 + len(range(raw_min, now, 10_000))


def test_retention_drops_only_whole_chunks(tmp_path):
    db = tmp_path / "h.db"
    _build(db, hours=3.4)
    conn = connect_rw(db)
    compact.compact_interval(conn, "gpu_samples", T0)
    end = conn.execute("SELECT max(end_ms) FROM gpu_samples_chunks").fetchone()[0]
    assert retention.delete_chunks(conn, "gpu_samples", end - 1) == (0, False)  # one row still inside: kept
    assert retention.delete_chunks(conn, "gpu_samples", end)[0] == 2 * 600
    assert conn.execute("SELECT count(*) FROM gpu_samples_chunks").fetchone()[0] == 0
    conn.close()


def test_chunk_of_unknown_format_is_a_clear_error(tmp_path):
    db = tmp_path / "h.db"
    _build(db, hours=3.3)
    conn = connect_rw(db)
    compact.compact_interval(conn, "gpu_samples", T0)
    conn.execute("UPDATE gpu_samples_chunks SET data = CAST(x'09' || substr(data, 2) AS BLOB)")  # a newer format
    conn.close()
    with StoreReader(db) as r, pytest.raises(StoreError, match="chunk of gpu_samples cannot be read: chunk format 9"):
        export_table(r, "gpu", "raw", T0, T0 + HOUR, tmp_path / "out.csv", progress_stream=io.StringIO())
    assert not (tmp_path / "out.csv").exists()
    with StoreReader(db) as r, pytest.raises(StoreError) as err:
        r.series("gpu", ["power_w"], T0, T0 + 600_000, resolution="raw")
    assert str(db) in str(err.value) and "chunk of gpu_samples" in str(err.value) and "format 9" in str(err.value)
    with StoreReader(db) as r:  # the raw rows after it still read
        assert len(r.series("gpu", ["power_w"], T0 + 600_000, T0 + 700_000, resolution="raw")[1]) == 200


def test_schema_2_file_reads_then_migrates(tmp_path):
    db = tmp_path / "h.db"
    _build(db, hours=0.1)
    old = tmp_path / "old.db"
    conn = sqlite3.connect(db)
    conn.execute("VACUUM INTO ?", (str(old),))
    conn.close()
    conn = sqlite3.connect(old, isolation_level=None)
    for t in compact.COMPACTED:
        conn.execute(f"DROP TABLE {chunk_table(t)}")
    conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    conn.close()
    shutil.copy(old, tmp_path / "copy.db")
    with StoreReader(old) as r:  # read as-is, before any writer migrated it
        res, rows = r.series("gpu", ["power_w"], T0, T0 + HOUR, resolution="raw")
        assert len(rows) == 2 * 360
    conn = connect_rw(old)
    assert migrate(conn) == 4 and conn.execute(f"SELECT count(*) FROM {chunk_table('nvlink_samples')}").fetchone()
    conn.close()
