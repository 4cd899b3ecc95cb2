"""agent_threads.py to the nanosecond: each thread's CPU from /proc/<pid>/task/<tid>/schedstat (time on a CPU, ns).

agent_threads.py reads utime+stime, counted in clock ticks (10 ms): over 20 s a thread's figure moves in steps of
0.05 % of a core, the size of what a small thread (the XID watcher) costs. The scheduler's own run time has no
such step, so a change of a few hundredths of a percent shows in one run. The agent, load and window are
agent_threads.py's (scale.py's DP8 agent under streamed requests). Last line: one JSON object.
Usage: python benchmarks/agent_threads_ns.py [--seconds 20] [--rates 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from pathlib import Path

from agent_threads import thread_names
from scale import _traffic, running_agent


def thread_run_ns(pid: int) -> dict[int, int]:
    """tid -> ns spent on a CPU, for every live thread of `pid`."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended between the listing and the read
    return out


def per_thread(sample_s: float, seconds: float, streams: int) -> dict:
    with running_agent(sample_s, 1.0) as (agent, _tmp, _sock, url):
        pid = agent.pid

        async def measured() -> tuple[dict[int, int], dict[int, int], float]:
            await asyncio.sleep(2.0)  # past the first scrapes and the load's ramp
            c0, t0 = thread_run_ns(pid), time.monotonic()
            await asyncio.sleep(seconds)
            return c0, thread_run_ns(pid), time.monotonic() - t0

        async def both() -> tuple[dict[int, int], dict[int, int], float]:
            task = asyncio.create_task(measured())
            await _traffic(url, seconds + 3.0, streams)
            return await task

        c0, c1, wall = asyncio.run(both())
        names = thread_names(pid)
    by_name: dict[str, float] = {}
    for tid, ns in c1.items():
        name = re.sub(r"_\d+$", "_*", names.get(tid, f"tid {tid} (ended or unnamed)"))
        by_name[name] = by_name.get(name, 0.0) + (ns - c0.get(tid, 0)) / 1e9
    pct = {k: round(100.0 * v / wall, 4) for k, v in sorted(by_name.items(), key=lambda kv: -kv[1])}
    return {"sample_hz": round(1 / sample_s, 3), "seconds": round(wall, 1),
            "process_pct": round(sum(pct.values()), 4), "threads_pct": pct}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--rates", default="1", help="sampling rates in Hz, comma-separated (scrape stays 1 Hz)")
    args = ap.parse_args()
    out = {f"{hz}hz": per_thread(1.0 / float(hz), args.seconds, args.streams) for hz in args.rates.split(",")}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
