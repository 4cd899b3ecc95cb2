"""The writer's share of slow readings at 10 Hz: NVLink per-link rates and process lists stored once a read.

The real GPU sampler over the fake NVML (8 H200s, 18 NVLinks each, one vLLM worker a GPU) on a manual clock
advanced 0.1 s a tick, paced at 10 Hz in real time into a real StoreWriter (linger 1 s, as the agent at 10 Hz).
Mode "once": the ticks as the sampler hands them (the same row objects until the next read: stored once, at the
read). Mode "every": each tick's link and process rows copied, as the sampler did before (every row new: stored
every tick). Reports per mode the writer thread's CPU (% of a core, /proc utime+stime), rows and bytes per hour
per table, interleaved runs, medians and spread. Last line: one JSON object.
Usage: python benchmarks/slow_rows.py [--seconds 30] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import tempfile
import threading
import time
from pathlib import Path

from lynxtop.agent.gpu.fake import FakeNvml, h200_specs
from lynxtop.agent.gpu.protocol import FakeGpuState
from lynxtop.agent.gpu.sampler import GpuSampler
from lynxtop.store.writer import StoreWriter

_TICK = os.sysconf("SC_CLK_TCK")
TABLES = ("gpu_samples", "nvlink_samples", "gpu_processes")
MIB = 1 << 20


class Node:
    """8 GPUs at a steady load: one vLLM worker each, 18 links moving."""

    def __init__(self):
        self.specs = h200_specs(8)
        self.states = [FakeGpuState(util_gpu_pct=90, sm_active_pct=70.0, power_w=600.0, temp_c=70,
                                    mem_used_bytes=100 << 30, nvlink_tx_bytes_per_s=[(100 + g) * MIB] * 18,
                                    nvlink_rx_bytes_per_s=[50 * MIB] * 18, processes=[(4000 + g, 80 << 30)],
                                    process_sm_pct={4000 + g: 60.0}) for g in range(8)]

    def driver_version(self) -> str:
        return "580.159.04"

    def gpus(self):
        return list(self.specs)

    def state(self, index: int, now: float) -> FakeGpuState:
        return self.states[index]


def thread_cpu_s(tid: int) -> float:
    raw = Path(f"/proc/self/task/{tid}/stat").read_text()
    f = raw[raw.rfind(")") + 2:].split()
    return (int(f[11]) + int(f[12])) / _TICK


def run(mode: str, seconds: float) -> dict:
    clock = [1000.0]
    node = Node()
    sampler = GpuSampler(lambda: FakeNvml(node, clock=lambda: clock[0]), clock=lambda: clock[0], xid_events=False)
    sampler.open()
    pids = {4000 + g for g in range(8)}
    with tempfile.TemporaryDirectory() as d:
        db = Path(d) / "h.db"
        w = StoreWriter(db, linger_s=1.0)
        w.start()
        tid = next(t.native_id for t in threading.enumerate() if t.name == "lynxtop-store-writer")
        ts0 = 1_764_000_000_000
        n = int(seconds * 10)
        cpu0, start = thread_cpu_s(tid), time.monotonic()
        for k in range(n):
            tick = sampler.sample(pids)
            links, procs = tick.nvlink_rows, tick.process_rows
            if mode == "every":
                links, procs = [r.copy() for r in links], [r.copy() for r in procs]
            w.submit_tick(ts0 + 100 * k, tick.gpu_rows, None, None, links, procs)
            clock[0] += 0.1
            time.sleep(max(0.0, start + (k + 1) * 0.1 - time.monotonic()))
        w.flush(60)
        cpu = thread_cpu_s(tid) - cpu0
        wall = time.monotonic() - start
        w.close()
        conn = sqlite3.connect(db)
        per_h = 3600 / (n / 10)
        rows = {t: round(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] * per_h) for t in TABLES}
        size = {t: round((conn.execute("SELECT sum(pgsize) FROM dbstat WHERE name = ?", (t,)).fetchone()[0] or 0)
                         * per_h / 1e6, 2) for t in TABLES}
        conn.close()
    return {"mode": mode, "writer_cpu_pct": round(100 * cpu / wall, 3), "rows_per_h": rows, "mb_per_h": size}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    got: dict[str, list[dict]] = {"every": [], "once": []}
    for i in range(a.runs):
        for mode in (("every", "once") if i % 2 == 0 else ("once", "every")):  # interleaved, both orders
            r = run(mode, a.seconds)
            got[mode].append(r)
            print(json.dumps(r), flush=True)
    out = {}
    for mode, rs in got.items():
        cpus = [r["writer_cpu_pct"] for r in rs]
        out[mode] = {"writer_cpu_pct_median": statistics.median(cpus), "writer_cpu_pct_runs": cpus,
                     "rows_per_h": rs[-1]["rows_per_h"], "mb_per_h": rs[-1]["mb_per_h"]}
    out["seconds"], out["runs"] = a.seconds, a.runs
    print(json.dumps(out))


if __name__ == "__main__":
    main()
