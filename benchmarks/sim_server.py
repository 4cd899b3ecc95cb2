#!/usr/bin/env python3
"""Simulated server benchmark: the real process tree under `vllm bench serve`-like load, on a compressed clock.

Starts `lynxtop-sim-vllm serve` (speed factor --speed), measures with a streaming client at concurrency
1, 4 and 12 (figures converted back to simulated time), the /metrics scrape latency (median of 30) and how
closely start-up follows --sim-startup-seconds. Everything is killed by process group at the end.

Last line of output: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import _support  # noqa: F401 - puts tests/ on sys.path for `support`
from support.ports import free_port

from lynxtop.sim.loadgen import bench
from lynxtop.sim.model import TARGET_PLATEAU_TOKENS_PER_S, TARGET_PLATEAU_TPOT_S


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--speed", type=float, default=4.0)
    ap.add_argument("--startup-seconds", type=float, default=2.0)
    opts = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    tmp = Path(tempfile.mkdtemp(prefix="lynxtop-sim-bench-"))
    exe = Path(sys.executable).parent / "lynxtop-sim-vllm"
    argv = [str(exe), "serve", "deepseek-ai/DeepSeek-V4.1", "--port", str(port), "-tp", "8",
            "--max-model-len", "32768", "--sim-speed", str(opts.speed), "--sim-startup-seconds",
            str(opts.startup_seconds), "--sim-state-dir", str(tmp / "sim"), "--sim-log-interval", "0"]
    t0 = time.monotonic()
    with open(tmp / "sim.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None:
                    raise SystemExit(f"simulator exited {proc.returncode}: {(tmp / 'sim.log').read_text()}") from None
                time.sleep(0.05)
        ready_s = time.monotonic() - t0
        results = {}
        for c in (1, 4, 12):
            r = asyncio.run(bench(url, concurrency=c, requests=c * 2, prompt_tokens=16, output_tokens=60))
            results[c] = {"tokens_per_s": round(r["output_throughput"] / opts.speed, 2),
                          "tpot_ms": round(r["mean_tpot_ms"] * opts.speed, 1), "failed": r["failed"]}
            print(f"concurrency {c:2d}: {results[c]}")
        scrapes = []
        for _ in range(30):
            s0 = time.perf_counter()
            with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
                r.read()
            scrapes.append((time.perf_counter() - s0) * 1000)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    print(json.dumps({
        "speed": opts.speed,
        "plateau_tokens_per_s": results[12]["tokens_per_s"],
        "plateau_ratio_to_target": round(results[12]["tokens_per_s"] / TARGET_PLATEAU_TOKENS_PER_S, 3),
        "plateau_tpot_ms": results[12]["tpot_ms"],
        "plateau_tpot_ratio_to_target": round(results[12]["tpot_ms"] / 1000 / TARGET_PLATEAU_TPOT_S, 3),
        "tokens_per_s_by_concurrency": {c: v["tokens_per_s"] for c, v in results.items()},
        "failed": sum(v["failed"] for v in results.values()),
        "metrics_scrape_median_ms": round(statistics.median(scrapes), 2),
        "ready_over_startup_seconds_ratio": round(ready_s / opts.startup_seconds, 2),
    }))


if __name__ == "__main__":
    main()
