"""The ingest part of benchmarks/store.py alone: its figures without the export, compaction and queries.

The same database (29 days of synthetic rollups, then `--hours` of raw 1 Hz ticks of 8 GPUs written through a
StoreWriter in store.PARTS timed parts, each followed by the bare executemany ceiling and the SQLite-only floor
of the same rows), so an A/B of the writer takes a minute instead of five. The figures mean what they mean
there. Last line: one JSON object.
Usage: python benchmarks/store_ingest.py [--hours 4] [--nvlink]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import store  # noqa: E402
from lynxtop.store import compact  # noqa: E402
from lynxtop.store.writer import StoreWriter  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hours", type=float, default=4.0, help="hours of raw 1 Hz samples (default 4)")
    ap.add_argument("--nvlink", action="store_true", help="also write per-link NVLink rows every tick")
    args = ap.parse_args()
    if not args.hours >= 0.1:
        ap.error("--hours: at least 0.1")
    tmp = Path(tempfile.mkdtemp(prefix="lynxtop-bench-ingest-"))
    try:
        db = tmp / "bench.db"
        ticks = int(args.hours * 3600)
        now = int(time.time() * 1000)
        now -= now % 1000
        raw_start = now - ticks * 1000
        raw_start -= raw_start % store.HOUR_MS  # as store.py: hour-aligned
        end = raw_start + ticks * 1000
        StoreWriter(db).close()
        store.generate_rollups(db, end - 30 * store.DAY_MS, raw_start)
        with sqlite3.connect(db) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        compact.KEEP_RAW_MS = 10 ** 15  # as store.py: no compaction during the ingest
        ing = store._ingest(db, raw_start, end, ticks, args.nvlink)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = statistics.median
    print(json.dumps({
        "ingest_rows_per_s": round(ing["ingest"]),
        "ingest_with_rollups_rows_per_s": round(med(ing["with_rollups"])),
        "ingest_with_rollups_parts": [round(x) for x in ing["with_rollups"]],
        "ingest_with_rollups_cpu_rows_per_s": round(med(ing["cpu"])),
        "bare_executemany_rows_per_s": round(med(ing["bare"])),
        "bare_executemany_parts": [round(x) for x in ing["bare"]],
        "bare_executemany_cpu_rows_per_s": round(med(ing["bare_cpu"])),
        "ingest_with_rollups_vs_bare": round(med(ing["with_rollups"]) / med(ing["bare"]), 2),
        "ingest_with_rollups_vs_bare_cpu": round(med(ing["cpu"]) / med(ing["bare_cpu"]), 2),
        "sqlite_only_rows_per_s": round(med(ing["floor"])),
        "hours_raw": args.hours, "gpu_rows": ing["rows"],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
