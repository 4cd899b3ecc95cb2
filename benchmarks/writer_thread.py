"""The store writer thread's CPU fed as the DP8 agent feeds it, without the rest of the agent.

The real GPU sampler over the fake NVML (8 H200s, 18 NVLinks, one vLLM worker a GPU; slow readings once a second
as the agent reads them) on a manual clock, a host row every tick and a serving row once a second (the 1 Hz
scrape), paced in real time into a real StoreWriter with the agent's linger for the rate (linger_for). The
writer thread's CPU comes from /proc/self/task/<tid>/schedstat (ns), so short runs still resolve it, and so does
its checkpoint thread's (checkpoint_cpu_pct: the WAL checkpoints every 5 s); transactions are counted from
stats()["tick_commits"]. `--linger` overrides the agent's linger. Last line: one JSON object.
Usage: python benchmarks/writer_thread.py [--seconds 30] [--rates 1,10] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from slow_rows import Node  # noqa: E402

from lynxtop.agent.gpu.fake import FakeNvml  # noqa: E402
from lynxtop.agent.gpu.sampler import GpuSampler  # noqa: E402
from lynxtop.store.schema import SAMPLE_TABLES  # noqa: E402
from lynxtop.store.writer import StoreWriter, linger_for  # noqa: E402


def thread_cpu_ns(tid: int) -> int:
    return int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])


def host_row(k: int) -> dict:
    row: dict = {n: float(1000 + k % 7) for n, typ, _ in SAMPLE_TABLES["host"].metrics if typ == "REAL"}
    row.update({n: (1 << 30) + k for n, typ, _ in SAMPLE_TABLES["host"].metrics if typ == "INTEGER"})
    row["cpu_per_core_pct"] = [12.5 + (k + i) % 5 for i in range(16)]
    return row


def serving_row(k: int) -> dict:
    row: dict = {n: 10.0 + k % 3 for n, typ, _ in SAMPLE_TABLES["serving"].metrics if typ == "REAL"}
    row.update({n: 100 + k for n, typ, _ in SAMPLE_TABLES["serving"].metrics if typ == "INTEGER"})
    row.update(run_id=1, scrape_ok=1, scrape_errors=0, phase_times_derived=None, spec_decode_acceptance_pct=None)
    for q in ("queue", "prefill", "decode"):  # the DP8 page's histograms the simulator leaves out
        row.update({f"{q}_p50_ms": None, f"{q}_p90_ms": None, f"{q}_p99_ms": None})
    return row


def run(rate: float, seconds: float, linger: float | None) -> dict:
    interval = 1.0 / rate
    clock = [1000.0]
    sampler = GpuSampler(lambda: FakeNvml(Node(), clock=lambda: clock[0]), clock=lambda: clock[0], xid_events=False)
    sampler.open()
    pids = {4000 + g for g in range(8)}
    linger_s = linger_for(interval) if linger is None else linger  # the agent's (agent/node.py)
    with tempfile.TemporaryDirectory() as d:
        w = StoreWriter(Path(d) / "h.db", linger_s=linger_s)
        w.start()
        tid = next(t.native_id for t in threading.enumerate() if t.name == "lynxtop-store-writer")
        ctid = next(t.native_id for t in threading.enumerate() if t.name == "lynxtop-store-checkpoint")
        ts0 = 1_764_000_000_000
        n = int(seconds * rate)
        per_scrape = max(1, round(rate))
        for warm in (True, False):  # a few warm-up seconds, then the measured ones
            count = int(3 * rate) if warm else n
            cpu0, c0, start = thread_cpu_ns(tid), w.stats()["tick_commits"], time.monotonic()
            ccpu0 = thread_cpu_ns(ctid)
            for k in range(count):
                tick = sampler.sample(pids)
                ts = ts0 + int(k * interval * 1000)
                w.submit_tick(ts, tick.gpu_rows, host_row(k), serving_row(k) if k % per_scrape == 0 else None,
                              tick.nvlink_rows, tick.process_rows)
                clock[0] += interval
                time.sleep(max(0.0, start + (k + 1) * interval - time.monotonic()))
            ts0 += int(count * interval * 1000)
            time.sleep(linger_s + 0.05)  # the last batch's own commit falls inside the window
            cpu = thread_cpu_ns(tid) - cpu0
            ccpu = thread_cpu_ns(ctid) - ccpu0
            wall = time.monotonic() - start
            commits = w.stats()["tick_commits"] - c0
        w.close()
    # per tick, then as a share of a core at the rate: the window's tail (the last linger) is not sampling time
    ms_tick = cpu / 1e6 / n
    return {"rate_hz": rate, "linger_s": linger_s, "writer_cpu_pct": round(ms_tick * rate / 10, 4),
            "writer_ms_per_tick": round(ms_tick, 4),
            "checkpoint_cpu_pct": round(ccpu / 1e6 / n * rate / 10, 4), "commits_per_tick": round(commits / n, 3),
            "ticks": n, "seconds": round(wall, 1), "load1": round(os.getloadavg()[0], 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--rates", default="1,10")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--linger", type=float, default=None)
    a = ap.parse_args()
    got: dict[str, dict[str, list[float]]] = {}
    for _ in range(a.runs):
        for rate in (float(r) for r in a.rates.split(",")):
            r = run(rate, a.seconds, a.linger)
            print(json.dumps(r), flush=True)
            for key in ("writer_cpu_pct", "checkpoint_cpu_pct"):
                got.setdefault(f"{rate:g}hz", {}).setdefault(key, []).append(r[key])
    print(json.dumps({k: {**{f"{key}_median": statistics.median(v) for key, v in runs.items()},
                          "runs": runs["writer_cpu_pct"], "checkpoint_runs": runs["checkpoint_cpu_pct"]}
                      for k, runs in got.items()}))


if __name__ == "__main__":
    main()
