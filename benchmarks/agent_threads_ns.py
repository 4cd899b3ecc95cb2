"""agent_threads.py to the nanosecond: each thread's CPU from /proc/<pid>/task/<tid>/schedstat (time on a CPU, ns).

agent_threads.py reads utime+stime, counted in clock ticks (10 ms): over 20 s a thread's figure moves in steps of
0.05 % of a core, the size of what a small thread (the XID watcher) costs. The scheduler's own run time has no
such step, so a change of a few hundredths of a percent shows in one run. The agent, load and window are
agent_threads.py's (scale.py's DP8 agent under streamed requests). Last line: one JSON object.
Usage: python benchmarks/agent_threads_ns.py [--seconds 20] [--rates 1]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import agent_threads


def thread_run_s(pid: int) -> dict[int, float]:
    """tid -> seconds spent on a CPU (schedstat's ns), for every live thread of `pid`."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = int((task / "schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            continue  # the thread ended between the listing and the read
    return out


def per_thread(sample_s: float, seconds: float, streams: int) -> dict:
    return agent_threads.per_thread(sample_s, seconds, streams, reader=thread_run_s, digits=4)


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
