"""Each agent thread's wake-ups per second and CPU at 1 Hz: what every wake-up costs on a small VM (45-120 us).

The agent, load and window are agent_threads_ns.py's (scale.py's DP8 agent under streamed requests). Per thread
name: wake-ups a second (voluntary context switches, /proc/<pid>/task/<tid>/status: each is one sleep that
ended), preemptions a second (nonvoluntary) and CPU in % of one core (schedstat, ns). With `--trace-loop` the
agent's event loop also counts, per loop turn, what woke it (the callbacks' names: a timer, a reader, a
thread's call_soon_threadsafe), through a sitecustomize put on its PYTHONPATH; that runs the agent (and the
simulator) on asyncio's own loop, not uvloop, whose select cannot be wrapped, and costs CPU of its own: read its
CPU and wake-up figures apart from untraced runs. Last line: one JSON object.
Usage: python benchmarks/agent_wakeups.py [--seconds 20] [--rates 1] [--trace-loop]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from agent_threads import thread_names
from scale import _traffic, running_agent

# Loaded by the agent's interpreter (PYTHONPATH): counts each event-loop turn's callbacks, written at exit.
_TRACE = r'''
import asyncio, atexit, json, os, sys, time
from asyncio import base_events

sys.modules["uvloop"] = None  # the stdlib loop, whose select can be wrapped: uvloop's is C (so no uvloop here)

_out = os.environ["LYNXTOP_LOOP_TRACE"]
_turns = []  # (monotonic, tuple of callback names) per turn that ran something


def _name(h):
    cb = getattr(h, "_callback", None)
    owner = getattr(cb, "__self__", None)
    if isinstance(owner, asyncio.Task):
        coro = owner.get_coro()
        return "task " + getattr(coro, "__qualname__", repr(coro))
    return getattr(cb, "__qualname__", None) or repr(cb)[:60]


def _wrap(loop):
    sel = loop._selector
    orig = sel.select

    def select(timeout=None):
        got = orig(timeout)
        t = time.monotonic()
        names = []
        for key, mask in got:
            r, w = key.data
            for h in (r, w):
                if h is not None:
                    names.append("fd " + _name(h))
        now = loop.time() + loop._clock_resolution
        for h in loop._scheduled:
            if h._when < now and not h._cancelled:
                names.append("timer " + _name(h))
        names.extend("soon " + _name(h) for h in loop._ready)
        _turns.append((t, tuple(names)))
        return got

    sel.select = select


_run_forever = base_events.BaseEventLoop.run_forever


def run_forever(self):
    if "agent" in sys.argv:  # the agent, not the simulated server (it inherits PYTHONPATH)
        _wrap(self)
        atexit.register(_dump)
    return _run_forever(self)


base_events.BaseEventLoop.run_forever = run_forever


def _dump():
    with open(_out, "w") as f:
        json.dump(_turns, f)
'''


def thread_counts(pid: int) -> dict[int, tuple[int, int, int]]:
    """tid -> (ns on a CPU, voluntary, nonvoluntary context switches) of every live thread of `pid`."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            ns = int((task / "schedstat").read_text().split()[0])
            status = (task / "status").read_text()
            vol = int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]
            inv = int(re.search(r"^nonvoluntary_ctxt_switches:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]
        except (OSError, ValueError, IndexError, AttributeError):
            continue  # the thread ended between the listing and the read
        out[int(task.name)] = (ns, vol, inv)
    return out


def loop_turns(path: Path, t0: float, t1: float) -> dict:
    """The traced loop's turns within [t0, t1] (monotonic): turns a second and what woke them, per second."""
    try:
        turns = [(t, names) for t, names in json.loads(path.read_text()) if t0 <= t <= t1]
    except (OSError, ValueError):
        return {}
    span = t1 - t0
    why: dict[str, float] = {}
    for _t, names in turns:
        for n in set(names) or {"(nothing: a spurious or empty wake-up)"}:
            why[n] = why.get(n, 0.0) + 1
    return {"turns_per_s": round(len(turns) / span, 2),
            "by_callback_per_s": {k: round(v / span, 2) for k, v in sorted(why.items(), key=lambda kv: -kv[1])}}


def per_thread(sample_s: float, seconds: float, streams: int, trace: bool) -> dict:
    env: dict[str, str] = {}
    tmp = Path(tempfile.mkdtemp(prefix="lynxtop-wakeups-"))
    trace_out = tmp / "turns.json"
    if trace:
        (tmp / "sitecustomize.py").write_text(_TRACE)
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp), os.environ.get("PYTHONPATH")])),
               "LYNXTOP_LOOP_TRACE": str(trace_out)}
    window: dict[str, float] = {}
    with running_agent(sample_s, 1.0, env) as (agent, _tmp, _sock, url):
        pid = agent.pid

        async def measured() -> tuple[dict, dict, float]:
            await asyncio.sleep(2.0)  # past the first scrapes and the load's ramp
            c0, t0 = thread_counts(pid), time.monotonic()
            await asyncio.sleep(seconds)
            c1, t1 = thread_counts(pid), time.monotonic()
            window.update(t0=t0, t1=t1)
            return c0, c1, t1 - t0

        async def both() -> tuple[dict, dict, float]:
            task = asyncio.create_task(measured())
            await _traffic(url, seconds + 3.0, streams)
            return await task

        c0, c1, wall = asyncio.run(both())
        names = thread_names(pid)
    by_name: dict[str, list[float]] = {}
    for tid, (ns, vol, inv) in c1.items():
        b0 = c0.get(tid, (0, 0, 0))
        name = re.sub(r"_\d+$", "_*", names.get(tid, f"tid {tid} (ended or unnamed)"))
        acc = by_name.setdefault(name, [0.0, 0.0, 0.0])
        acc[0] += (ns - b0[0]) / 1e9
        acc[1] += vol - b0[1]
        acc[2] += inv - b0[2]
    order = sorted(by_name, key=lambda k: -by_name[k][0])
    out = {"sample_hz": round(1 / sample_s, 3), "seconds": round(wall, 1),
           "process_pct": round(100.0 * sum(v[0] for v in by_name.values()) / wall, 4),
           "threads_pct": {k: round(100.0 * by_name[k][0] / wall, 4) for k in order},
           "wakeups_per_s": {k: round(by_name[k][1] / wall, 2) for k in order},
           "preempted_per_s": {k: round(by_name[k][2] / wall, 2) for k in order},
           "process_wakeups_per_s": round(sum(v[1] for v in by_name.values()) / wall, 2)}
    if trace:
        out["loop"] = loop_turns(trace_out, window["t0"], window["t1"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--rates", default="1", help="sampling rates in Hz, comma-separated (scrape stays 1 Hz)")
    ap.add_argument("--trace-loop", action="store_true", help="count what wakes the event loop (costs CPU)")
    args = ap.parse_args()
    out = {f"{hz}hz": per_thread(1.0 / float(hz), args.seconds, args.streams, args.trace_loop)
           for hz in args.rates.split(",")}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
