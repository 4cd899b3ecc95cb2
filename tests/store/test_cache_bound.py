"""SQLite's memory in a long-running agent stays within the page-cache bound of store/schema.py (issue 29.1).

A page cache fills as pages are written or read and is never given back, so its bound is the step the agent's
RSS climbs for as long as it takes to fill: with 32 MiB the soak's agent rose 0.7 MB/min for 25 minutes.
Here a writer stores far more than the bound (wide GPU and NVLink rows), a reader scans it all, and SQLite's
own count of the memory it holds (sqlite3_status64 MEMORY_USED, from the library Python's sqlite3 loaded)
must stay within a budget that fills in the first minutes of a 10 Hz agent (pages are written at about
1 MB/min), not over half an hour: two connections of 8 MiB and a little for schemas and statements.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import pytest

from lynxtop.contract.columns import NVLINK_METRICS, names
from lynxtop.store.reader import StoreReader
from lynxtop.store.writer import StoreWriter

from .helpers import T0, gpu_row, host_row, serving_row

WRITTEN_MB = 40  # far beyond the budget: a cache of 32 MiB (the old bound) fills up
BUDGET_MB = 2 * 8 + 4  # the writer's and a reader's page caches, and what SQLite holds beside them


def _sqlite_used_mb() -> float:
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("sqlite3") or "libsqlite3.so.0")
        status = lib.sqlite3_status64
    except (OSError, AttributeError):
        pytest.skip("no shared libsqlite3 to ask for its memory use")
    cur, hi = ctypes.c_int64(), ctypes.c_int64()
    status(0, ctypes.byref(cur), ctypes.byref(hi), 0)  # 0: SQLITE_STATUS_MEMORY_USED
    return cur.value / 2**20


def test_sqlite_memory_stays_within_the_page_cache_bounds(tmp_path):
    db = tmp_path / "lynxtop.db"
    gpus = [[gpu_row(g, i) for g in range(8)] for i in range(20)]
    links = [{"gpu": g, **{c: 1_000_000_007 * (g + 1) + k for k, c in enumerate(names(NVLINK_METRICS))}}
             for g in range(8)]
    w = StoreWriter(db, queue_max=100_000, batch_max_ticks=500)
    w.start()
    i = 0
    try:
        while db.stat().st_size < WRITTEN_MB * 2**20:
            for _ in range(1000):
                # a new link reading each tick (as at 1 Hz): the writer stores a reading once (store/writer.py)
                w.submit_tick(T0 + i * 100, gpus[i % 20], host_row(i), serving_row(i), [dict(x) for x in links])
                i += 1
            assert w.flush(120)
        r = StoreReader(db)
        try:
            scanned = sum(1 for _ in r.conn.execute("SELECT * FROM gpu_samples"))
            scanned += sum(1 for _ in r.conn.execute("SELECT * FROM nvlink_samples"))
        finally:
            used = _sqlite_used_mb()
            r.close()
    finally:
        w.close()
    assert scanned == 16 * i
    assert used <= BUDGET_MB, f"SQLite holds {used:.1f} MB after {WRITTEN_MB} MB written and read"
