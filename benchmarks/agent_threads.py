"""Where the agent's CPU goes, per thread: the DP8 agent of benchmarks/scale.py, measured thread by thread.

The agent (8 simulated GPUs through the fake NVML, the simulated vLLM DP8 + EP under streamed load) runs as in
scale.py; over the measured seconds each thread's utime+stime comes from /proc/<pid>/task/<tid>/stat, and its
name from `py-spy dump` (Python does not name OS threads). Threads of one name are summed (asyncio_0, asyncio_1:
the executor threads that sample the host and the GPUs). Figures are % of one core over wall time; one run per
rate, so read them beside scale.py's medians, not instead of them. Last line: one JSON object.
Usage: python benchmarks/agent_threads.py [--seconds 30] [--rates 1,10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from scale import _traffic, running_agent

_TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int) -> dict[int, float]:
    """tid -> utime+stime in seconds, for every live thread of `pid`."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            raw = (task / "stat").read_text()
        except OSError:
            continue  # the thread ended between the listing and the read
        fields = raw[raw.rfind(")") + 2:].split()
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / _TICK
    return out


def thread_names(pid: int) -> dict[int, str]:
    """tid -> Python thread name, from `py-spy dump` (empty when py-spy is missing or not allowed)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    try:
        text = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return {int(tid): name for tid, name in re.findall(r'^Thread (\d+) \([^)]*\): "([^"]*)"', text, re.M)}


def per_thread(sample_s: float, seconds: float, streams: int,
               reader: Callable[[int], dict[int, float]] = thread_cpu_s, digits: int = 3) -> dict:
    """% of one core per thread name over the window; `reader` gives each thread's CPU seconds (ticks here,
    schedstat in agent_threads_ns.py), rounded to `digits`."""
    with running_agent(sample_s, 1.0) as (agent, _tmp, _sock, url):
        pid = agent.pid

        async def measured() -> tuple[dict[int, float], dict[int, float], float]:
            await asyncio.sleep(2.0)  # past the first scrapes and the load's ramp
            c0, t0 = reader(pid), time.monotonic()
            await asyncio.sleep(seconds)
            return c0, reader(pid), time.monotonic() - t0

        async def both() -> tuple[dict[int, float], dict[int, float], float]:
            task = asyncio.create_task(measured())
            await _traffic(url, seconds + 3.0, streams)
            return await task

        c0, c1, wall = asyncio.run(both())
        names = thread_names(pid)
    by_name: dict[str, float] = {}
    for tid, cpu in c1.items():
        name = re.sub(r"_\d+$", "_*", names.get(tid, f"tid {tid} (ended or unnamed)"))
        by_name[name] = by_name.get(name, 0.0) + cpu - c0.get(tid, 0.0)
    pct = {k: round(100.0 * v / wall, digits) for k, v in sorted(by_name.items(), key=lambda kv: -kv[1])}
    return {"sample_hz": round(1 / sample_s, 3), "seconds": round(wall, 1),
            "process_pct": round(sum(pct.values()), digits), "threads_pct": pct}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--rates", default="1,10", help="sampling rates in Hz, comma-separated (scrape stays 1 Hz)")
    args = ap.parse_args()
    out = {f"{hz}hz": per_thread(1.0 / float(hz), args.seconds, args.streams) for hz in args.rates.split(",")}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
