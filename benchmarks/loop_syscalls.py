"""What wakes the agent's event loop at 1 Hz, counted by the kernel: each sleep of its thread in epoll, and why.

agent_wakeups.py's `--trace-loop` names the loop's callbacks but runs the stdlib loop (uvloop's select cannot be
wrapped), whose reads and turns differ from the agent's. Here `strace` follows the agent's main thread itself,
on uvloop, under scale.py's load (DP8 agent, 32 streamed requests, 1 Hz sampling and scrape): every epoll_pwait
that was allowed to sleep (timeout not 0) and returned is one wake-up, named by what was ready: the loop's own
wake-up fd (a thread's call_soon_threadsafe: the clock's tick), the page's connection (the one that sent
"GET /metrics"), the /health probe's, a timer (nothing ready), or another fd. Also the page's reads per scrape
and the main thread's syscalls a second. strace slows every syscall: read its counts, not CPU figures.
Usage: python benchmarks/loop_syscalls.py [--seconds 20]. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import _support  # noqa: F401 - tests/ on sys.path, as scale.py needs
from scale import _traffic, running_agent

_CALL = re.compile(r"^\d+:\d+:\d+\.\d+ (\w+)\((.*)$")
_EPOLL = re.compile(r"^epoll_p?wait\(\d+, \[(.*)\], \d+, (-?\d+)")
_FD = re.compile(r"u32=(\d+)")


def summary(lines: list[str], seconds: float) -> dict:
    """The counts of one strace log of the main thread (`strace -tt`), per second."""
    calls: Counter[str] = Counter()
    fd_role: dict[str, str] = {}
    parsed = []
    for line in lines:
        m = _CALL.match(line)
        if m is None:
            continue
        name, rest = m.groups()
        calls[name] += 1
        parsed.append((name, rest))
        if name in ("write", "sendto"):
            fd, _, data = rest.partition(", ")
            if data.startswith('"GET /metrics'):
                fd_role[fd] = "page"
            elif data.startswith('"GET /health'):
                fd_role[fd] = "health"
        elif name == "read" and rest.partition(", ")[2].startswith('"\\1\\0\\0\\0\\0\\0\\0\\0"'):
            fd_role[rest.partition(", ")[0]] = "call_soon_threadsafe"
    woke: Counter[str] = Counter()
    page_reads = 0
    for name, rest in parsed:
        if name.startswith("epoll"):
            m = _EPOLL.match(name + "(" + rest)
            if m is None or m.group(2) == "0":
                continue  # a turn that did not sleep
            fds = _FD.findall(m.group(1))
            for why in sorted({fd_role.get(fd, "other fd") for fd in fds} or {"timer (nothing ready)"}):
                woke[why] += 1
        elif name == "read" and fd_role.get(rest.partition(", ")[0]) == "page":
            page_reads += 1
    sleeps = sum(1 for name, rest in parsed if name.startswith("epoll") and (m := _EPOLL.match(name + "(" + rest))
                 and m.group(2) != "0")
    pages = sum(1 for name, rest in parsed if name in ("write", "sendto") and fd_role.get(rest.partition(", ")[0])
                == "page")
    return {"seconds": seconds, "wakeups_per_s": round(sleeps / seconds, 2),
            "woken_by_per_s": {k: round(v / seconds, 2) for k, v in woke.most_common()},
            "loop_turns_per_s": round(sum(v for k, v in calls.items() if k.startswith("epoll")) / seconds, 2),
            "scrapes": pages, "page_reads_per_scrape": round(page_reads / pages, 2) if pages else None,
            "syscalls_per_s": {k: round(v / seconds, 2) for k, v in calls.most_common()}}


def measure(seconds: float, streams: int) -> dict:
    out = Path(tempfile.mkdtemp(prefix="lynxtop-loop-syscalls-")) / "strace.txt"
    with running_agent(1.0, 1.0) as (agent, _tmp, _sock, url):
        async def measured() -> None:
            await asyncio.sleep(4.0)  # past the first scrapes and the load's ramp
            # -p the agent's pid: its main thread only (the loop), not -f
            tracer = subprocess.Popen(["strace", "-tt", "-s", "16", "-p", str(agent.pid), "-o", str(out)],
                                      stderr=subprocess.DEVNULL)
            await asyncio.sleep(seconds)
            tracer.terminate()
            tracer.wait()

        async def both() -> None:
            task = asyncio.create_task(measured())
            await _traffic(url, seconds + 6.0, streams)
            await task

        asyncio.run(both())
    return summary(out.read_text().splitlines(), seconds)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--streams", type=int, default=32)
    args = ap.parse_args()
    if shutil.which("strace") is None:
        print(json.dumps({"error": "strace not found"}))
        return 1
    print(json.dumps(measure(args.seconds, args.streams)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
