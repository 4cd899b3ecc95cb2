#!/usr/bin/env python3
"""Does `lynxtop bench`'s client distort what it measures? 512 concurrent streams against the simulator.

The simulator is set up so every engine step takes the same time (decode only: a fixed step cost, no
per-sequence cost, no throughput ceiling, near-free prefill), so the server-known inter-token latency is that
step time, the same for every gap; the server's own ITL histogram (its sum and count) confirms the mean. The
client (cli/bench_load.py, the code `lynxtop bench` runs) streams 512 requests at once and measures ITL per
event. Reported:

- `tokens_per_s`: output tokens the client received per second (target >= 20,000 on this 2-core machine);
- `itl_p99_error_ms`: client p99 ITL minus the server-known ITL (target <= 5 ms): what the client's own
  event loop adds at the tail, plus whatever the server lags behind its model;
- `itl_mean_error_ms`, `server_itl_mean_ms` (from /metrics) for context.

Each figure is the median of `--runs` runs (3), each on a fresh simulator; `per_run` lists the main ones.
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
import psutil
from support.ports import free_port

from lynxtop.cli.bench_load import Level, Workload, run_level, streams
from lynxtop.cli.bench_stats import summarize
from lynxtop.contract.loop import run_loop
from lynxtop.sim.model import SimParams

MODEL = "deepseek-ai/DeepSeek-V4.1"
PARAMS = {"step_overhead_s": 0.02, "decode_s_per_seq": 0.0, "max_decode_tokens_per_s": 1e9,
          "prefill_s_per_token": 1e-6}


def start_sim(tmp: Path, port: int, streams: int) -> subprocess.Popen:
    exe = Path(sys.executable).parent / "lynxtop-sim-vllm"
    argv = [str(exe), "serve", MODEL, "--port", str(port), "-tp", "8", "--max-model-len", "4096",
            "--max-num-seqs", str(streams), "--sim-speed", "1", "--sim-startup-seconds", "0.3",
            "--sim-state-dir", str(tmp / "sim"), "--sim-log-interval", "0"]
    for k, v in PARAMS.items():
        argv += ["--sim-param", f"{k}={v}"]
    log = open(tmp / "sim.log", "wb")  # noqa: SIM115 - the process keeps it
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"simulator exited {proc.returncode}: "
                                 f"{(tmp / 'sim.log').read_text()[-2000:]}") from None
            time.sleep(0.1)
    raise SystemExit("simulator not ready in 60 s")


def server_itl(url: str) -> tuple[float | None, float | None]:
    """Mean and p99 ITL (s) from the server's own histogram: the mean exact (sum / count), the p99 interpolated
    linearly inside its bucket (so only as fine as vLLM's ITL buckets)."""
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    sums = counts = 0.0
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:inter_token_latency_seconds"):
            continue
        value = float(line.rsplit(" ", 1)[1])
        if line.startswith("vllm:inter_token_latency_seconds_sum"):
            sums += value
        elif line.startswith("vllm:inter_token_latency_seconds_count"):
            counts += value
        elif 'le="' in line:
            le = float(line.split('le="', 1)[1].split('"', 1)[0])
            buckets[le] = buckets.get(le, 0.0) + value
    if not counts:
        return None, None
    return sums / counts, _quantile(sorted(buckets.items()), 0.99 * counts)


def _quantile(buckets: list[tuple[float, float]], rank: float) -> float | None:
    lo, below = 0.0, 0.0
    for le, cum in buckets:
        if cum >= rank:
            if le == float("inf"):
                return lo
            return lo + (le - lo) * (rank - below) / max(cum - below, 1e-12)
        lo, below = le, cum
    return None


async def measure(url: str, concurrency: int, requests: int, output_len: int) -> dict:
    wl = Workload(url, MODEL, input_len=8, output_len=output_len)
    stop = asyncio.Event()
    async with streams(url, 300) as pool:
        await run_level(pool, wl, Level(concurrency=32, requests=32), stop)  # warm-up: connections, the loop
        run = await run_level(pool, wl, Level(concurrency=concurrency, requests=requests), stop, offset=1)
    s = summarize(run)
    s["elapsed_s"] = run.duration_s
    return s


def _cpu(p: psutil.Process) -> float:
    try:
        t = p.cpu_times()
    except psutil.Error:
        return 0.0
    return t.user + t.system


def one_run(opts: argparse.Namespace) -> dict:
    """A fresh simulator, a warm-up, then `requests` requests at `streams` at once."""
    tmp = Path(tempfile.mkdtemp(prefix="lynxtop-bench-client-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_sim(tmp, port, opts.streams)
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        cpu0, scpu0 = time.process_time(), sum(_cpu(p) for p in tree)
        s = run_loop(measure(url, opts.streams, opts.requests, opts.output_len))
        client_cpu, server_cpu = time.process_time() - cpu0, sum(_cpu(p) for p in tree) - scpu0
        server_mean, server_p99 = server_itl(url)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    known_ms = SimParams(**PARAMS).decode_step_s(opts.streams) * 1000
    return {
        "completed": s["completed"], "failed": s["failed"],
        "tokens_per_s": round(s["output_throughput"], 1), "elapsed_s": round(s["elapsed_s"], 2),
        "server_known_itl_ms": known_ms,
        "server_itl_mean_ms": round(server_mean * 1000, 3) if server_mean else None,
        "server_itl_p99_ms": round(server_p99 * 1000, 3) if server_p99 else None,
        "client_itl_mean_ms": round(s["mean_itl_ms"], 3), "client_itl_p99_ms": round(s["p99_itl_ms"], 3),
        # against what the server recorded for the same gaps (it lags its model when the CPU is short)
        "itl_mean_error_ms": round(s["mean_itl_ms"] - server_mean * 1000, 3) if server_mean else None,
        "itl_p99_error_ms": round(s["p99_itl_ms"] - server_p99 * 1000, 3) if server_p99 else None,
        "itl_p99_vs_model_ms": round(s["p99_itl_ms"] - known_ms, 3),
        "client_cpu_s": round(client_cpu, 2), "server_cpu_s": round(server_cpu, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=512)
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=200)
    ap.add_argument("--runs", type=int, default=3, help="runs, each on a fresh simulator; the figures are medians")
    opts = ap.parse_args()
    runs = [one_run(opts) for _ in range(max(opts.runs, 1))]
    out: dict = {"streams": opts.streams, "requests": opts.requests, "runs": len(runs)}
    for key in runs[0]:
        values = [r[key] for r in runs if r[key] is not None]
        out[key] = statistics.median(values) if values else None
    out["failed"] = sum(r["failed"] for r in runs)
    out["per_run"] = {k: [r[k] for r in runs] for k in ("tokens_per_s", "itl_p99_error_ms", "itl_mean_error_ms")}
    out["ok"] = out["tokens_per_s"] >= 20_000 and abs(out["itl_p99_error_ms"] or 1e9) <= 5 and not out["failed"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
