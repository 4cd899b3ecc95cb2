"""Where the agent's event loop (MainThread) spends its CPU at 1 Hz: each named function's share, in the agent.

py-spy sees only busy Python and, at a rate high enough to count a 1 Hz loop, pauses the agent so often that its
figures swell (issue 29.3: the main thread read 1.4 % of a core at 1000 Hz sampling against 0.25 % by schedstat).
Here a sitecustomize on the agent's PYTHONPATH wraps a list of synchronous functions (the scrape's parse and
bookkeeping, the ticker's landing and end, the SLA, the status line) with `time.thread_time_ns` around each call
on the main thread, and the main thread's own schedstat gives the whole: what the list does not name is the loop,
its wake-ups, the page's socket reads and the coroutines' glue. The agent, load and window are agent_threads.py's
(scale.py's DP8 agent under 32 streamed requests, 1 Hz sampling and scrape). Coroutine functions cannot be timed
so (only their creation would be); a nested function's time is in its caller's too.
Usage: python benchmarks/main_thread_parts.py [--seconds 30]; with PYTHONPATH=DIR where DIR holds a `lynxtop`
package of another checkout, that code is measured (an A/B). Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import _support  # noqa: F401 - tests/ on sys.path, as scale.py needs
from scale import _traffic, running_agent

# (module, qualified name) of the functions timed; a class's static method stays one
PARTS = [
    ("lynxtop.agent.metrics.layout", "PageLayout.parse"), ("lynxtop.agent.metrics.layout", "PageLayout._known"),
    ("lynxtop.agent.metrics.layout", "PageLayout._read"), ("lynxtop.agent.metrics.layout", "_type_starts"),
    ("lynxtop.agent.metrics.page", "_Plan.totals"), ("lynxtop.agent.metrics.page", "_page_of"),
    ("lynxtop.agent.metrics.scrape", "MetricsScraper._accept"),
    ("lynxtop.agent.metrics.continuity", "ResetCorrections.corrected"),
    ("lynxtop.agent.metrics.windows", "ServingWindows.add"),
    ("lynxtop.agent.metrics.windows", "ServingWindows.latency_columns"),
    ("lynxtop.agent.metrics.scrape", "engine_loads"), ("lynxtop.agent.metrics.scrape", "checked"),
    ("lynxtop.agent.metrics.scrape", "MetricsScraper.events"),
    ("lynxtop.agent.metrics.lifetime", "ServingTotals.observe"),
    ("lynxtop.agent.ticker", "Ticker._landed"), ("lynxtop.agent.ticker", "Ticker._end"),
    ("lynxtop.agent.ticker", "Ticker._finish"), ("lynxtop.agent.node", "Node._on_change"),
    ("lynxtop.agent.node", "Node._record"), ("lynxtop.agent.sampling", "GpuSource.sample_now"),
    ("lynxtop.agent.sampling", "SlaSource.sample_now"), ("lynxtop.agent.serving.health", "HangDetector.observe"),
    ("lynxtop.agent.serving.lifecycle", "RunLifecycle.on_verdict"),
    # the landing's and the end's own parts, and the status line's
    ("lynxtop.agent.sampling", "stages_now"), ("lynxtop.agent.sampling", "ScrapeSource.sample_now"),
    ("lynxtop.agent.node", "Node._scrape_target"), ("lynxtop.agent.node", "Node._beat"),
    ("lynxtop.agent.ticker", "Ticker._arm"), ("lynxtop.agent.status_view", "StatusView.line"),
    ("lynxtop.agent.serving.supervisor", "Supervisor.serving_status"),
    ("lynxtop.store.writer", "StoreWriter.stats"), ("lynxtop.store.writer", "StoreWriter.submit_tick"),
    ("lynxtop.agent.metrics.windows", "ServingWindows.counter_columns"),
    ("lynxtop.agent.metrics.histogram", "SlidingHistogram._prepare"),
]

# Loaded by the agent's interpreter only (its argv says `agent`): wraps PARTS, writes the sums every second.
_SITE = r'''
import sys
if "agent" in sys.argv:
    import functools, importlib, json, os, threading, time
    _acc = {}

    def _wrap(modname, qual):
        mod = importlib.import_module(modname)
        owner, name = (getattr(mod, qual.split(".")[0]), qual.split(".")[1]) if "." in qual else (mod, qual)
        static = isinstance(owner, type) and isinstance(owner.__dict__.get(name), staticmethod)
        fn, main = getattr(owner, name), threading.main_thread()

        @functools.wraps(fn)
        def timed(*a, **k):
            if threading.current_thread() is not main:
                return fn(*a, **k)
            t = time.thread_time_ns()
            try:
                return fn(*a, **k)
            finally:
                c = _acc.setdefault(qual, [0, 0])
                c[0] += time.thread_time_ns() - t
                c[1] += 1
        setattr(owner, name, staticmethod(timed) if static else timed)

    for m, q in json.loads(os.environ["LYNXTOP_PARTS"]):
        try:
            _wrap(m, q)
        except (ImportError, AttributeError):  # not in the code measured (an older checkout): left out
            pass

    def _dump():
        out, tid = os.environ["LYNXTOP_PARTS_OUT"], threading.main_thread().native_id
        while True:
            time.sleep(1.0)
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    ns = int(f.read().split()[0])
                with open(out + ".tmp", "w") as f:
                    json.dump({"t": time.monotonic(), "main_ns": ns, "parts": _acc}, f)
                os.replace(out + ".tmp", out)
            except OSError:
                pass
    threading.Thread(target=_dump, daemon=True, name="parts-dump").start()
'''


def measure(seconds: float, streams: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="lynxtop-parts-"))
    (tmp / "sitecustomize.py").write_text(_SITE)
    out = tmp / "parts.json"
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp), os.environ.get("PYTHONPATH")])),
           "LYNXTOP_PARTS": json.dumps(PARTS), "LYNXTOP_PARTS_OUT": str(out)}
    with running_agent(1.0, 1.0, env) as (_agent, _tmp, _sock, url):
        async def measured() -> tuple[dict, dict]:
            await asyncio.sleep(6.0)  # past the first scrapes, the layout's learning and the load's ramp
            a = json.loads(out.read_text())
            await asyncio.sleep(seconds)
            return a, json.loads(out.read_text())

        async def both() -> tuple[dict, dict]:
            task = asyncio.create_task(measured())
            await _traffic(url, seconds + 8.0, streams)
            return await task

        a, b = asyncio.run(both())
    span = b["t"] - a["t"]
    parts = {q: (round((ns - a["parts"].get(q, [0, 0])[0]) / span / 1000, 1),
                 round((n - a["parts"].get(q, [0, 0])[1]) / span, 2)) for q, (ns, n) in b["parts"].items()}
    return {"seconds": round(span, 1), "main_us_per_s": round((b["main_ns"] - a["main_ns"]) / span / 1000, 1),
            "parts_us_per_s": {q: v[0] for q, v in sorted(parts.items(), key=lambda kv: -kv[1][0])},
            "calls_per_s": {q: v[1] for q, v in sorted(parts.items(), key=lambda kv: -kv[1][0])}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--streams", type=int, default=32)
    args = ap.parse_args()
    t0 = time.monotonic()
    out = measure(args.seconds, args.streams)
    out["wall_s"] = round(time.monotonic() - t0, 1)
    out["code"] = os.environ.get("PYTHONPATH") or "this tree"
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
