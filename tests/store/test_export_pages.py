"""`lynxtop export` reads in pages, each in its own short read transaction (store/export.py `pages`).

What must hold: an export whose consumer stalls (`lynxtop export | less` left open) holds no read snapshot, so a
checkpoint can reset the WAL meanwhile (one snapshot for the whole export let the WAL grow without bound); the pages
join to exactly the rows one query gives (byte for byte, ties in the order's first column included); compaction and
retention running between two pages neither repeat nor drop a row of the range; rows written after the export began
past its newest row are not in it (the range is fixed at the start). A reader's query over compacted rows ends its
read transaction too (the temp table's implicit BEGIN kept one open).
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lynxtop.store import compact, retention
from lynxtop.store.export import TABLES, build_query, count, export_table, pages, write_csv
from lynxtop.store.reader import StoreReader
from lynxtop.store.rollup import load_watermarks
from lynxtop.store.schema import chunk_table, connect_rw
from lynxtop.store.writer import StoreWriter

from .helpers import T0, submit

HOUR = 3_600_000
HOURS = 4.5  # the newest 3 h stay raw: 8 ten-minute intervals can be compacted
SPAN = (T0 - HOUR, T0 + 10 * HOUR)
LATE = T0 + 60 * 60_000 + 5_000  # a key of gpu 0 in the compacted hour, far ahead of the first pages


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("pages") / "h.db"
    w = StoreWriter(db, queue_max=100_000, maintenance_interval_s=3600, clock=lambda: T0 / 1000 + HOURS * 3600)
    w.start()
    run_id = w.create_run(profile="p", started_ms=T0, ended_ms=T0 + int(HOURS * HOUR))
    submit(w, int(HOURS * 3600), gpus=2, null_every=7, run_id=run_id)
    assert w.flush(120)
    w.close()
    return db


@pytest.fixture
def db(built, tmp_path) -> Path:
    path = tmp_path / "h.db"
    for suffix in ("", "-wal"):
        if Path(f"{built}{suffix}").exists():
            shutil.copy(f"{built}{suffix}", f"{path}{suffix}")
    return path


def _export(db: Path, table: str = "gpu", span: tuple[int, int] = SPAN) -> str:
    out = db.with_name(f"{table}-{time.monotonic_ns()}.csv")
    with StoreReader(db) as r:
        export_table(r, table, "raw", *span, out, force=True, progress_stream=io.StringIO())
    return out.read_text()


def _compact_all(db: Path) -> int:
    conn = connect_rw(db)
    try:
        wm, total = load_watermarks(conn), 0
        while True:
            n, more = compact.step(conn, wm)
            total += n
            if not more:
                return total
    finally:
        conn.close()


def _writer(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(db, isolation_level=None, timeout=0.1)


def _wal(db: Path) -> int:
    try:
        return os.stat(f"{db}-wal").st_size
    except FileNotFoundError:
        return 0


def _write_newer_rows_and_reset_the_wal(w: sqlite3.Connection, db: Path, n: int = 200) -> tuple[tuple, int]:
    """What the agent does while an export waits: commits (rows newer than any exported), then a checkpoint that
    must reset the WAL (TRUNCATE: busy unless no reader holds a snapshot). Returns its result and the WAL size."""
    top = w.execute("SELECT max(ts_ms) FROM gpu_samples").fetchone()[0]
    w.executemany("INSERT INTO gpu_samples (ts_ms, gpu, util_gpu_pct) VALUES (?, ?, 1)",
                  [(top + 1000 * (i + 1), g) for i in range(n) for g in (0, 1)])
    assert _wal(db) > 0
    return tuple(w.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()), _wal(db)


@pytest.mark.parametrize("compacted", [False, True])
def test_an_export_stalled_in_its_output_holds_no_snapshot(db, compacted):
    """write_csv's consumer stalls after the first lines (a pipe nobody reads): meanwhile the writer commits and a
    TRUNCATE checkpoint resets the WAL; the export then ends where it would have, without the newer rows."""
    if compacted:
        assert _compact_all(db) > 0
    want = _export(db)
    w = _writer(db)
    seen: list[tuple[tuple, int, bool]] = []

    class Stalled(io.StringIO):
        def write(self, text: str) -> int:
            if not seen and self.tell() > 0:  # the first page's lines, after the header
                seen.append((*_write_newer_rows_and_reset_the_wal(w, db), r.conn.in_transaction))
            return super().write(text)

    out = Stalled()
    with StoreReader(db) as r:
        write_csv(r, build_query("gpu", "raw", *SPAN, columns_of=r.columns), out)
    w.close()
    (busy, _, _), wal, in_txn = seen[0]
    assert (busy, wal, in_txn) == (0, 0, False)  # one snapshot for the whole export: busy 1, the WAL kept
    assert out.getvalue() == want


def test_lynxtop_export_into_an_unread_pipe_lets_the_wal_be_reset(db):
    """The audit's case through the real command: `lynxtop export --resolution raw | less`, less never reading."""
    want = _export(db)
    p = subprocess.Popen([sys.executable, "-m", "lynxtop", "export", "--table", "gpu", "--resolution", "raw",
                          "--from", str(SPAN[0]), "--to", str(SPAN[1]), "--database", str(db)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        head = p.stdout.readline()  # it has read its first page
        time.sleep(0.5)  # and fills the pipe: blocked in write()
        w = _writer(db)
        result, wal = _write_newer_rows_and_reset_the_wal(w, db)
        for _ in range(20):  # a page being read at that moment is a few ms
            if result[0] == 0:
                break
            time.sleep(0.1)
            result, wal = tuple(w.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()), _wal(db)
        w.close()
        assert p.poll() is None  # still stalled: nobody has read the pipe
        assert (result[0], wal) == (0, 0)
        rest = p.stdout.read()
        assert p.wait(60) == 0, p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(5)
    assert (head + rest).decode() == want  # the range was fixed when it began: the newer rows are not in it


def test_a_query_over_compacted_rows_ends_its_read_transaction(db):
    """The dashboard's reader after charting an older (compacted) range: it sees new rows, a checkpoint resets."""
    assert _compact_all(db) > 0
    with StoreReader(db) as r:
        _, rows = r.series("gpu", ["util_gpu_pct"], T0, T0 + 30 * 60_000, resolution="raw")
        assert len(rows) == 2 * 1800
        assert not r.conn.in_transaction
        w = _writer(db)
        newest = r.latest("host")[0]["ts_ms"]
        w.execute("INSERT INTO host_samples (ts_ms, cpu_pct) VALUES (?, 1.5)", (newest + 1000,))
        assert r.latest("host")[0]["ts_ms"] == newest + 1000
        assert w.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0 and _wal(db) == 0
        w.close()


def _keys(text: str, table: str) -> list[tuple[str, ...]]:
    rows = list(csv.reader(io.StringIO(text, newline="")))[1:]
    return [(r[1], r[2]) if table == "gpu" else (r[1],) for r in rows]


@pytest.mark.parametrize("table", ["gpu", "host", "serving"])
def test_compaction_between_pages_neither_repeats_nor_drops_a_row(db, table):
    """One interval compacted after each page (behind, under and ahead of the export's position): every row once,
    byte for byte what the export of the uncompacted file gave."""
    want = _export(db, table)
    conn = connect_rw(db)
    wm, moved, lines = load_watermarks(conn), 0, []
    with StoreReader(db) as r:
        q = build_query(table, "raw", *SPAN, columns_of=r.columns)
        for page in pages(r, q, rows=700):  # 700: pages end inside ten-minute intervals, at varying places
            lines += page
            moved += compact.step(conn, wm, intervals=1)[0]
    conn.close()
    assert moved > 0 and len(lines) > 8 * 700  # compaction ran while the export went on
    got = ",".join(q.header) + "\n" + "".join(f"{x}\n" for x in lines)
    assert got == want
    assert len(set(_keys(got, table))) == len(_keys(got, table))
    assert _export(db, table) == want  # and after it


def test_retention_and_a_late_row_between_pages(db):
    """Retention deletes raw rows and drops whole chunks behind the export's position after each page; a clock
    stepped back writes a raw row on the key of a compacted row ahead of it: that key is exported once, as the raw
    row (the reader's rule), and no other row changes, repeats or goes missing."""
    assert _compact_all(db) > 0
    want = _export(db)
    conn = connect_rw(db)
    lines: list[str] = []
    with StoreReader(db) as r:
        q = build_query("gpu", "raw", *SPAN, columns_of=r.columns)
        for page in pages(r, q, rows=700):
            lines += page
            if len(lines) == 700:
                conn.execute("INSERT INTO gpu_samples (ts_ms, gpu, util_gpu_pct) VALUES (?, 0, 4242)", (LATE,))
            behind = int(lines[-1].split(",")[1])  # the newest time exported so far
            retention.delete_chunk(conn, "gpu_samples", behind)
            retention.delete_chunks(conn, "gpu_samples", behind)
        left = conn.execute(f"SELECT count(*) FROM {chunk_table('gpu_samples')}").fetchone()[0]
    conn.close()
    assert left == 0  # every chunk was dropped behind the export
    got = ",".join(q.header) + "\n" + "".join(f"{x}\n" for x in lines)
    assert _keys(got, "gpu") == _keys(want, "gpu")
    late = [i for i, k in enumerate(_keys(got, "gpu")) if k == (str(LATE), "0")]
    assert len(late) == 1
    head = next(csv.reader([want.splitlines()[0]]))
    assert next(csv.reader([lines[late[0]]]))[head.index("util_gpu_pct")] == "4242"
    assert [x for i, x in enumerate(lines) if i != late[0]] == \
        [x for i, x in enumerate(want.splitlines()[1:]) if i != late[0]]


def test_pages_join_to_the_one_query_in_every_table_with_ties(db):
    """Tiny pages (3 rows) over every table and resolution: the keyset continues within a timestamp shared by many
    rows (8 events and 5 runs at one time, 2 GPUs a tick) and the pages join to the single query's rows."""
    w = _writer(db)  # not a StoreWriter: its maintenance would compact the rows this compares raw
    w.executemany("INSERT INTO events (ts_ms, kind, severity, message) VALUES (?, 'serving.phase', 'info', ?)",
                  [(T0 + 5000, f"e{i}") for i in range(8)])
    w.executemany("INSERT INTO runs (profile, started_ms, ended_ms) VALUES (?, ?, ?)",
                  [(f"r{i}", T0 + 7000, T0 + 9000) for i in range(5)])
    w.close()
    span = (T0, T0 + 20 * 60_000)
    with StoreReader(db) as r:
        for table in TABLES:
            for res in (("raw", "1m") if table in ("gpu", "host", "serving") else ("raw",)):
                q = build_query(table, res, *span, columns_of=r.columns)
                one = [row[0] for row in r.stream(q.sql, q.params)[1]]
                paged = [x for page in pages(r, q, rows=3) for x in page]
                assert paged == one and len(one) > 3, (table, res)  # more than a page
                assert count(r, q) == len(one), (table, res)


def test_the_count_matches_the_rows_for_ranges_that_cut_chunks(db):
    """The progress bar's total (raw rows plus chunk rows, edge chunks decoded) is the number of rows exported."""
    assert _compact_all(db) > 0
    with StoreReader(db) as r:
        for start, end in ((T0 + 123_456, T0 + 2 * HOUR + 7), (T0 + 30 * 60_000, T0 + 40 * 60_000),
                           (T0 + 599_999, T0 + 600_001), SPAN):
            q = build_query("gpu", "raw", start, end, columns_of=r.columns)
            assert count(r, q) == sum(len(p) for p in pages(r, q)), (start, end)
