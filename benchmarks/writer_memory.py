"""What of the agent's RSS growth is SQLite's: feed a StoreWriter 10 Hz ticks of 8 GPUs as fast as it writes them.

Every minute of data it prints the process' anonymous RSS beside SQLite's own allocations (sqlite3_status64
MEMORY_USED, read through ctypes from the libsqlite3 that Python's sqlite3 module loaded) and the database size.
The soak (benchmarks/soak.py) saw the agent's anonymous RSS rise ~1 MB/min for ~25 minutes and then stay flat;
this shows the rise is the writer connection's page cache (PRAGMA cache_size = -32768 in store/schema.py) filling
and stopping at its bound. Last line: one JSON object.
Usage: python benchmarks/writer_memory.py [--minutes 90]   (minutes of 10 Hz data, written in about one minute)
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

from _support import TESTS

from lynxtop.store import schema
from lynxtop.store.writer import StoreWriter

# the store tests' row makers, by path: benchmarks/store.py shadows the tests' `store` package here
_spec = importlib.util.spec_from_file_location("store_helpers", TESTS / "store" / "helpers.py")
assert _spec is not None and _spec.loader is not None
helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(helpers)


def sqlite_mb(lib: ctypes.CDLL) -> float:
    cur, hi = ctypes.c_int64(), ctypes.c_int64()
    lib.sqlite3_status64(0, ctypes.byref(cur), ctypes.byref(hi), 0)  # 0: SQLITE_STATUS_MEMORY_USED
    return cur.value / 2**20


def anon_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=90.0, help="minutes of 10 Hz data to write")
    ap.add_argument("--cache-mib", type=float, default=None,
                    help="the connections' page cache bound (default: store/schema.py's CACHE_KIB)")
    args = ap.parse_args()
    if args.cache_mib is not None:
        schema.CACHE_KIB = int(args.cache_mib * 1024)
    lib = ctypes.CDLL(ctypes.util.find_library("sqlite3") or "libsqlite3.so.0")
    db = Path(tempfile.mkdtemp(prefix="lynxtop-wmem-")) / "lynxtop.db"
    w = StoreWriter(db, queue_max=100_000)
    w.start()
    rows = [[helpers.gpu_row(g, i) for g in range(8)] for i in range(50)]
    points = []
    t0, cpu0 = time.perf_counter(), time.process_time()
    for i in range(int(args.minutes * 600) + 1):
        w.submit_tick(helpers.T0 + i * 100, rows[i % 50], helpers.host_row(i), helpers.serving_row(i, None))
        if i % 600 == 0:
            w.flush(60)
            p = {"data_min": i // 600, "anon_mb": round(anon_mb(), 1), "sqlite_mb": round(sqlite_mb(lib), 1),
                 "db_mb": round(sum(f.stat().st_size for f in db.parent.glob(db.name + "*")) / 2**20, 1)}
            points.append(p)
            print(json.dumps(p), flush=True)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    w.close()
    last = points[-1]
    gpu_rows = 8 * (int(args.minutes * 600) + 1)
    print(json.dumps({"cache_kib": schema.CACHE_KIB, "anon_mb_end": last["anon_mb"],
                      "sqlite_mb_end": last["sqlite_mb"], "db_mb_end": last["db_mb"],
                      "gpu_rows_per_s": round(gpu_rows / wall), "gpu_rows_per_cpu_s": round(gpu_rows / cpu),
                      "points": points}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
