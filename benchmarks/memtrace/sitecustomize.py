"""Allocation sites of a soak's agent (benchmarks/soak.py --tracemalloc FILE puts this folder on PYTHONPATH).

Only in the process whose command line runs `lynxtop agent` and only when LYNXTOP_TRACEMALLOC_OUT is set:
tracemalloc starts before the agent imports anything, and every LYNXTOP_TRACEMALLOC_EVERY seconds (60) a
daemon thread appends one JSON line to that file: the traced total and the 25 allocation sites (file:line,
5 frames deep, the innermost named) that grew most since the first snapshot. Every other process (the
simulated vLLM, the load) is untouched.
"""

from __future__ import annotations

import json
import os
import threading
import time
import tracemalloc
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2]) + "/"  # the repository: its files are named relative to it

def _dump(out: Path, every: float) -> None:
    base = tracemalloc.take_snapshot()
    t0 = time.monotonic()
    while True:
        time.sleep(every)
        snap = tracemalloc.take_snapshot()
        top = snap.compare_to(base, "traceback")[:25]
        line = {"min": round((time.monotonic() - t0) / 60, 2),
                "traced_mb": round(tracemalloc.get_traced_memory()[0] / 2**20, 2),
                "top": [{"kb": round(s.size_diff / 1024, 1), "count": s.count_diff,
                         "where": [f"{f.filename.removeprefix(_ROOT)}:{f.lineno}" for f in s.traceback]}
                        for s in top]}
        with out.open("a") as f:
            f.write(json.dumps(line) + "\n")


def _maybe_start() -> None:
    out = os.environ.get("LYNXTOP_TRACEMALLOC_OUT")
    if not out:
        return
    try:
        argv = Path("/proc/self/cmdline").read_bytes().split(b"\0")
    except OSError:
        return
    if b"lynxtop" not in argv or b"agent" not in argv:
        return
    tracemalloc.start(5)
    every = float(os.environ.get("LYNXTOP_TRACEMALLOC_EVERY", "60"))
    threading.Thread(target=_dump, args=(Path(out), every), name="tracemalloc-dump", daemon=True).start()


_maybe_start()
