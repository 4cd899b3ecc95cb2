"""Compaction: closed ten-minute intervals of each sample table, per GPU, become one encoded row (codec.py).

Recent rows stay raw (the live views, the rollups and the in-memory rollup path read them); an interval is
closed once it ends KEEP_RAW_MS before the newest stored sample (ages from the data, not the wall clock,
as retention does; and as there, the newest sample counts no later than the wall clock, so one far-future
row from a bad clock compacts nothing early) and, for rolled-up tables, before every rollup watermark. Each
chunk is written and its raw rows deleted in one transaction, so an interruption leaves every row readable
exactly once: either still raw, or in the chunk. Raw rows that arrive later inside a compacted interval (a
clock stepped back) are merged into its chunk by the next pass (the raw row wins on an equal key, as INSERT OR
REPLACE would); the rollups re-roll such a minute over both (rollup.Rollups._roll_with_chunks).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable

from lynxtop.store import codec
from lynxtop.store.schema import COMPACTED, RESOLUTIONS, ROLLUP_KINDS, SAMPLE_TABLES, chunk_table, rollback

CHUNK_MS = 600_000
KEEP_RAW_MS = 3 * 3_600_000
_KIND_OF = {t.name: kind for kind, t in SAMPLE_TABLES.items()}


def columns(conn: sqlite3.Connection, table: str, schema: str = "main") -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA {schema}.table_info({table})")]


def horizon(conn: sqlite3.Connection, table: str, watermarks: dict[tuple[str, str], int | None],
            keep_raw_ms: int | None = None, now_ms: int | None = None) -> int | None:
    """Rows before this may be compacted; None while nothing may.

    Ages are measured from the newest stored sample of `table`, but never from later than `now_ms` (the wall
    clock when not given), as retention.reference_ms does: one row from a clock that was far ahead must not
    make every interval look old. The other way round, a wall clock stepped back holds compaction back until
    it has caught up with the data (the conservative side: rows then just stay raw a while longer).
    """
    newest = conn.execute(f"SELECT max(ts_ms) FROM {table}").fetchone()[0]
    if newest is None:
        return None
    newest = min(newest, int(time.time() * 1000) if now_ms is None else now_ms)
    limit = newest - (KEEP_RAW_MS if keep_raw_ms is None else keep_raw_ms)
    kind = _KIND_OF.get(table)
    if kind in ROLLUP_KINDS:
        for res in RESOLUTIONS:
            wm = watermarks.get((kind, res))
            if wm is None:
                return None
            limit = min(limit, wm)
    return limit


def compact_interval(conn: sqlite3.Connection, table: str, start_ms: int,
                     fault: Callable[[str], None] | None = None) -> int:
    """Move [start_ms, start_ms + CHUNK_MS) of `table` into chunks, one transaction per GPU; returns rows moved.

    `fault(step)` is a test hook called between the steps of each transaction.
    """
    key = COMPACTED[table]
    per_gpu = "gpu" in key
    end_ms = start_ms + CHUNK_MS
    cols = columns(conn, table)
    gpus = [r[0] for r in conn.execute(f"SELECT DISTINCT gpu FROM {table} WHERE ts_ms >= ? AND ts_ms < ?",
                                       (start_ms, end_ms))] if per_gpu else [0]
    moved = 0
    for gpu in gpus:
        where, args = ("ts_ms >= ? AND ts_ms < ?" + (" AND gpu = ?" if per_gpu else ""),
                       (start_ms, end_ms, *((gpu,) if per_gpu else ())))
        conn.execute("BEGIN IMMEDIATE")
        try:
            raw = conn.execute(f"SELECT {', '.join(cols)} FROM {table} WHERE {where}", args).fetchall()
            old = conn.execute(f"SELECT data FROM {chunk_table(table)} WHERE start_ms = ? AND gpu = ?",
                               (start_ms, gpu)).fetchone()
            rows = merge(cols, key, old[0] if old else None, raw)
            blob = codec.encode(cols, rows)
            conn.execute(f"INSERT OR REPLACE INTO {chunk_table(table)} (start_ms, gpu, end_ms, rows, data) "
                         "VALUES (?, ?, ?, ?, ?)", (start_ms, gpu, max(r[cols.index('ts_ms')] for r in rows) + 1,
                                                    len(rows), blob))
            if fault:
                fault("chunk written")
            conn.execute(f"DELETE FROM {table} WHERE {where}", args)
            if fault:
                fault("raw deleted")
            conn.execute("COMMIT")
        except BaseException:
            rollback(conn)
            raise
        moved += len(raw)
    return moved


def merge(cols: list[str], key: tuple[str, ...], old_blob: bytes | None, raw: list[tuple]) -> list[tuple]:
    """The chunk's rows and the raw rows, ordered by key; a raw row replaces a chunk row with its key."""
    idx = [cols.index(k) for k in key]
    by_key: dict[tuple, tuple] = {}
    if old_blob is not None:
        names, rows = codec.decode(old_blob)
        pos = [names.index(c) if c in names else None for c in cols]  # a column added since: NULL
        for r in rows:
            t = tuple(None if p is None else r[p] for p in pos)
            by_key[tuple(t[i] for i in idx)] = t
    for r in raw:
        by_key[tuple(r[i] for i in idx)] = tuple(r)
    return [by_key[k] for k in sorted(by_key)]


def step(conn: sqlite3.Connection, watermarks: dict[tuple[str, str], int | None], intervals: int = 4,
         keep_raw_ms: int | None = None, now_ms: int | None = None) -> tuple[int, bool]:
    """Compact up to `intervals` closed intervals per table, oldest first; returns (rows moved, more remain).

    `now_ms` (default: the wall clock) caps the newest sample ages are measured from (see horizon)."""
    total, more = 0, False
    if now_ms is None:
        now_ms = int(time.time() * 1000)
    for table in COMPACTED:
        limit = horizon(conn, table, watermarks, keep_raw_ms, now_ms)
        if limit is None:
            continue
        for _ in range(intervals):
            oldest = conn.execute(f"SELECT min(ts_ms) FROM {table}").fetchone()[0]
            if oldest is None:
                break
            start = oldest - oldest % CHUNK_MS
            if start + CHUNK_MS > limit:
                break
            try:
                total += compact_interval(conn, table, start)
            except codec.CodecError:  # a value the codec cannot keep exactly: those rows stay raw
                break
        else:
            more = True
    return total, more


def decode_rows(conn: sqlite3.Connection, table: str, start_ms: int, end_ms: int, cols: list[str],
                gpu: int | None = None) -> list[tuple]:
    """Rows of the chunks overlapping [start_ms, end_ms) (only those are read), in `cols` order.

    Whole chunks: the caller's SQL applies its own time filter.
    """
    out: list[tuple] = []
    for blob in chunk_blobs(conn, table, start_ms, end_ms, gpu):
        out += decode_blob(blob, cols)
    return out


def chunk_blobs(conn: sqlite3.Connection, table: str, start_ms: int, end_ms: int,
                gpu: int | None = None) -> list[bytes]:
    """The encoded chunks of `table` overlapping [start_ms, end_ms) (of one GPU, or all), by interval and GPU."""
    sql = (f"SELECT data FROM {chunk_table(table)} WHERE start_ms > ? AND start_ms < ? AND end_ms > ?"
           + ("" if gpu is None else " AND gpu = ?") + " ORDER BY start_ms, gpu")
    return [blob for (blob,) in conn.execute(sql, (start_ms - CHUNK_MS, end_ms, start_ms,
                                                   *(() if gpu is None else (gpu,))))]


def decode_blob(blob: bytes, cols: list[str]) -> list[tuple]:
    """One chunk's rows in `cols` order (a column the chunk does not hold, added since: NULL)."""
    names, rows = codec.decode(blob)
    pos = [names.index(c) if c in names else None for c in cols]
    return [tuple(None if p is None else r[p] for p in pos) for r in rows]


def has_chunks(conn: sqlite3.Connection, table: str, start_ms: int, end_ms: int) -> bool:
    try:
        return conn.execute(f"SELECT 1 FROM {chunk_table(table)} WHERE start_ms > ? AND start_ms < ? "
                            "AND end_ms > ? LIMIT 1", (start_ms - CHUNK_MS, end_ms, start_ms)).fetchone() is not None
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):  # a file of schema 2 opened read-only before the writer migrated it
            return False
        raise
