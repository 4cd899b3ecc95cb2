"""Retention: delete rows older than each resolution's age limit, in small chunks.

Small chunks keep each delete transaction short so ticks keep flowing and readers see no stall; freed
pages are reused by new rows, so steady state needs no VACUUM. Raw rows are never deleted before they
are rolled up (the cut-off never passes a rollup watermark). Runs and bench results are never deleted.

Ages are measured from the newest stored sample, never from the wall clock alone: a clock stepped 8 days
forward (an NTP step after a bad RTC, a snapshot restored, `date -s`) must not make a week of history look
expired. A row newer than (newest stored sample - limit) is never deleted (docs/reliability.md).
"""

from __future__ import annotations

import sqlite3
from typing import Protocol

from lynxtop.store.schema import (
    COMPACTED,
    RESOLUTIONS,
    ROLLUP_KINDS,
    SAMPLE_TABLES,
    chunk_table,
    rollback,
    rollup_table,
)

DAY_MS = 86_400_000
CHUNK_ROWS = 5000


class RetentionPolicy(Protocol):
    raw_days: float
    minute_days: float
    hour_days: float


def reference_ms(conn: sqlite3.Connection, now_ms: int) -> int:
    """The time ages are measured from: `now_ms`, but never later than the newest stored sample.

    A wall clock that jumped ahead of the data would otherwise expire rows that are, by the data's own
    timeline, recent. One max() per sample table: each is keyed by ts_ms first, so it is an index lookup.
    """
    newest = [conn.execute(f"SELECT max(ts_ms) FROM {t}").fetchone()[0]
              for t in (*(t.name for t in SAMPLE_TABLES.values()), "gpu_processes")]
    known = [n for n in newest if n is not None]
    return min(now_ms, max(known)) if known else now_ms


def cutoffs(policy: RetentionPolicy, now_ms: int,
            watermarks: dict[tuple[str, str], int | None]) -> dict[str, int]:
    """Table -> delete rows with ts_ms below this."""
    raw = now_ms - int(policy.raw_days * DAY_MS)
    minute = now_ms - int(policy.minute_days * DAY_MS)
    hour = now_ms - int(policy.hour_days * DAY_MS)
    out: dict[str, int] = {}
    for kind, t in SAMPLE_TABLES.items():
        limit = raw
        if kind in ROLLUP_KINDS:
            for res in RESOLUTIONS:
                wm = watermarks.get((kind, res))
                limit = min(limit, wm if wm is not None else -1)
        out[t.name] = limit
    out["gpu_processes"] = raw
    for kind in ROLLUP_KINDS:
        wm_1h = watermarks.get((kind, "1h"))  # 1-hour rows are computed from 1-minute rows
        out[rollup_table(kind, "1m")] = min(minute, wm_1h if wm_1h is not None else -1)
        out[rollup_table(kind, "1h")] = hour
    out["events"] = minute  # events live as long as the 1-minute history they annotate
    return out


def delete_chunk(conn: sqlite3.Connection, table: str, before_ms: int, chunk: int = CHUNK_ROWS) -> tuple[int, bool]:
    """Delete up to about `chunk` of the oldest rows below `before_ms`; returns (rows deleted, more remain)."""
    if before_ms <= 0:
        return 0, False
    edge = conn.execute(f"SELECT ts_ms FROM {table} WHERE ts_ms < ? ORDER BY ts_ms LIMIT 1 OFFSET ?",
                        (before_ms, chunk)).fetchone()
    upto = edge[0] if edge else before_ms
    if edge and upto == conn.execute(f"SELECT min(ts_ms) FROM {table}").fetchone()[0]:
        upto += 1  # more than `chunk` rows share one timestamp: take that whole timestamp
    conn.execute("BEGIN IMMEDIATE")
    try:
        n = conn.execute(f"DELETE FROM {table} WHERE ts_ms < ?", (upto,)).rowcount
        conn.execute("COMMIT")
    except BaseException:
        rollback(conn)
        raise
    return n, edge is not None


def delete_chunks(conn: sqlite3.Connection, table: str, before_ms: int, chunk: int = CHUNK_ROWS) -> tuple[int, bool]:
    """Drop up to `chunk` // 100 compacted chunks of `table` whose every row is below `before_ms` (whole chunks
    only: a chunk that reaches the cut-off waits until all of it has aged out); returns (rows, more remain)."""
    if before_ms <= 0:
        return 0, False
    limit = max(1, chunk // 100)
    name = chunk_table(table)
    ids = conn.execute(f"SELECT id, rows FROM {name} WHERE end_ms <= ? ORDER BY start_ms LIMIT ?",
                       (before_ms, limit + 1)).fetchall()
    if not ids:
        return 0, False
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.executemany(f"DELETE FROM {name} WHERE id = ?", [(i,) for i, _ in ids[:limit]])
        conn.execute("COMMIT")
    except BaseException:
        rollback(conn)
        raise
    return sum(n for _, n in ids[:limit]), len(ids) > limit


def step(conn: sqlite3.Connection, policy: RetentionPolicy, now_ms: int,
         watermarks: dict[tuple[str, str], int | None], chunk: int = CHUNK_ROWS) -> tuple[int, bool]:
    """One chunk per table; returns (rows deleted, more remain). `now_ms` is held to the newest sample."""
    total, more = 0, False
    for table, before in cutoffs(policy, reference_ms(conn, now_ms), watermarks).items():
        n, m = delete_chunk(conn, table, before, chunk)
        total += n
        more = more or m
        if table in COMPACTED:
            n, m = delete_chunks(conn, table, before, chunk)
            total += n
            more = more or m
    return total, more
