"""Retention: delete rows older than each resolution's age limit, in small chunks.

Small chunks keep each delete transaction short so ticks keep flowing and readers see no stall; freed
pages are reused by new rows, so steady state needs no VACUUM. Raw rows are never deleted before they
are rolled up (the cut-off never passes a rollup watermark). Bench results are never deleted; a run row goes
once nothing is left that it describes or that refers to it (`delete_runs`): a node whose server restarts
often (a crash loop, operators switching profiles) would otherwise grow the runs table forever.

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

# Tables whose rows refer to a run by id, each indexed by run_id first; a run one of them names is kept. Bench
# results (never deleted) name runs too: their runs are left out of `delete_runs`'s walk altogether.
RUN_REFERENCES = ("events", "serving_samples")

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


def oldest_stored_ms(conn: sqlite3.Connection) -> int | None:
    """The time of the oldest row of any table kept by age (raw, chunks, rollups, processes, events): each is
    keyed or indexed by its time first, so each min() is an index lookup."""
    tables = [*(t.name for t in SAMPLE_TABLES.values()), "gpu_processes", "events",
              *(rollup_table(k, r) for k in ROLLUP_KINDS for r in RESOLUTIONS)]
    found = [conn.execute(f"SELECT min(ts_ms) FROM {t}").fetchone()[0] for t in tables]
    found += [conn.execute(f"SELECT min(start_ms) FROM {chunk_table(t)}").fetchone()[0] for t in COMPACTED]
    return min((f for f in found if f is not None), default=None)


def runs_cutoff(conn: sqlite3.Connection, policy: RetentionPolicy, ref_ms: int) -> int:
    """Runs that ended before this may go: older than the longest retention (the hour rollups a run's charts are
    drawn from live longest), and before every row still stored (rows held back, e.g. raw rows not yet rolled up,
    keep the runs of their time)."""
    longest = max(policy.raw_days, policy.minute_days, policy.hour_days)
    cut = ref_ms - int(longest * DAY_MS)
    oldest = oldest_stored_ms(conn)
    return cut if oldest is None else min(cut, oldest)


def _referenced(conn: sqlite3.Connection, run_id: int) -> bool:
    return any(conn.execute(f"SELECT 1 FROM {t} WHERE run_id = ? LIMIT 1", (run_id,)).fetchone()
               for t in RUN_REFERENCES)


def delete_runs(conn: sqlite3.Connection, before_ms: int, chunk: int = CHUNK_ROWS) -> tuple[int, bool]:
    """Delete the runs that ended before `before_ms` and that no row refers to, looking at up to `chunk` runs
    (oldest id first); returns (runs deleted, more remain to look at).

    Never deleted: a run not ended (the server running, or one the agent may adopt), the run with the highest id
    (ids are MAX(id) + 1: deleting it would give its id out again), a run an event, a serving sample or a bench
    result names. The walk stops at the first run that started at or after `before_ms`: later ids started later
    (a run started before a clock step back waits until the runs before it go)."""
    if before_ms <= 0:
        return 0, False
    conn.execute("BEGIN IMMEDIATE")  # read and delete under one lock: no row naming a run slips in between
    try:
        limit = max(1, chunk)
        cur = conn.execute(  # read lazily: the walk usually ends at its first young run
            "SELECT id, started_ms, ended_ms FROM runs WHERE id < (SELECT max(id) FROM runs) AND ended_ms IS NOT "
            "NULL AND id NOT IN (SELECT run_id FROM bench_results WHERE run_id IS NOT NULL) ORDER BY id LIMIT ?",
            (limit,))
        doomed, seen, young = [], 0, False
        for run_id, started, ended in cur:
            seen += 1
            if started is not None and started >= before_ms:
                young = True  # the rest started later still
                break
            if ended < before_ms and not _referenced(conn, run_id):
                doomed.append((run_id,))
        cur.close()
        conn.executemany("DELETE FROM runs WHERE id = ?", doomed)
        conn.execute("COMMIT")
    except BaseException:
        rollback(conn)
        raise
    return len(doomed), seen == limit and not young and bool(doomed)


def step(conn: sqlite3.Connection, policy: RetentionPolicy, now_ms: int,
         watermarks: dict[tuple[str, str], int | None], chunk: int = CHUNK_ROWS) -> tuple[int, bool]:
    """One chunk per table, then a batch of runs; returns (rows deleted, more remain). `now_ms` is held to the
    newest sample."""
    total, more = 0, False
    ref = reference_ms(conn, now_ms)
    for table, before in cutoffs(policy, ref, watermarks).items():
        n, m = delete_chunk(conn, table, before, chunk)
        total += n
        more = more or m
        if table in COMPACTED:
            n, m = delete_chunks(conn, table, before, chunk)
            total += n
            more = more or m
    n, m = delete_runs(conn, runs_cutoff(conn, policy, ref), chunk)
    return total + n, more or m
