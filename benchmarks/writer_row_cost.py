"""CPU per GPU row of the store writer's whole path on one thread: submit_tick, the batch's INSERTs and COMMIT,
the in-memory 1-minute rollups and the rollup steps, as benchmarks/store.py feeds it (8 synthetic GPUs, a host and
a serving row a tick, batches of 1000 ticks) but run inline (no writer thread, no polling), timed by the thread's
CPU clock: a figure the load of other processes on a shared machine disturbs far less than store.py's wall-clock
rows/s. Each run writes `--ticks` ticks after as many of warm-up into a fresh database; the minimum run is the
figure (noise only adds). Last line: one JSON object.
Usage: python benchmarks/writer_row_cost.py [--runs 5] [--ticks 2880]
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import store  # noqa: E402
from lynxtop.store.writer import StoreWriter  # noqa: E402

BATCH = 1000  # ticks per transaction, as store.py's writer takes them (batch_max_ticks)


def _part(w: StoreWriter, pool: list, hosts: list, servs: list, t0: int, lo: int, hi: int) -> float:
    """Thread CPU seconds to write ticks [lo, hi) and their rollups."""
    gc.collect()
    t = time.thread_time()
    for a in range(lo, hi, BATCH):
        for i in range(a, min(hi, a + BATCH)):
            w.submit_tick(t0 + i * 1000, pool[i % 3600], hosts[i % 60], servs[i % 60])
        w._drain_once()  # what the thread does with a batch: insert, commit, roll up (inline: nothing started)
        while w.rollups.pending():
            w.rollups.step()
    return time.thread_time() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ticks", type=int, default=2880, help="ticks a run (default 2880: a --hours 4 part)")
    args = ap.parse_args()
    pool = store.synthetic_gpu_rows(3600)
    hosts = [store.host_row(i) for i in range(60)]
    servs = [store.serving_row(i) for i in range(60)]
    t0 = 1_700_000_000_000 - 1_700_000_000_000 % store.HOUR_MS
    per_row = []
    for _ in range(max(1, args.runs)):
        tmp = Path(tempfile.mkdtemp(prefix="lynxtop-bench-rowcost-"))
        try:
            w = StoreWriter(tmp / "a.db", queue_max=args.ticks + BATCH)
            _part(w, pool, hosts, servs, t0, 0, args.ticks)  # warm-up: caches, statements, the first minute
            cpu = _part(w, pool, hosts, servs, t0, args.ticks, 2 * args.ticks)
            w.close()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        per_row.append(cpu / (args.ticks * store.GPUS) * 1e6)
    print(json.dumps({"writer_cpu_us_per_gpu_row": round(min(per_row), 2),
                      "writer_cpu_us_per_gpu_row_median": round(statistics.median(per_row), 2),
                      "runs_us": [round(x, 2) for x in per_row], "ticks": args.ticks, "gpus": store.GPUS}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
