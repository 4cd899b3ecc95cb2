#!/usr/bin/env python3
"""Real NVML at 10 Hz: the sampler's CPU per GPU per tick with field rates (slow readings about once a second,
agent/gpu/refresh.py) against every reading on every tick (refresh_s=0), on this machine's GPUs.

Run on a GPU machine where lynxtop is installed: `python3 benchmarks/nvml_rates.py [--seconds 10]`. Only reads
NVML; never changes clocks, power or modes. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def _ticks(sampler, seconds: float, interval: float) -> dict:
    sampler.sample(set())
    cpu = []
    due = time.monotonic()
    end = due + seconds
    while due < end:
        due += interval
        time.sleep(max(0.0, due - time.monotonic()))
        c0 = time.thread_time_ns()
        sampler.sample(set())
        cpu.append(time.thread_time_ns() - c0)
    return {"median_ms": round(statistics.median(cpu) / 1e6, 4), "mean_ms": round(statistics.fmean(cpu) / 1e6, 4),
            "ticks": len(cpu)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    from lynxtop.agent.gpu.backend import RealNvml
    from lynxtop.agent.gpu.sampler import GpuSampler

    out: dict = {}
    for label, kw in (("rates", {}), ("every_reading", {"refresh_s": 0.0})):
        s = GpuSampler(RealNvml, **kw)
        st = s.open()
        if st["state"] != "ok":
            print(json.dumps({"error": st["message"]}))
            return
        n = len(s.static())
        r = _ticks(s, args.seconds, 0.1)
        r["cpu_ms_per_gpu_mean"] = round(r["mean_ms"] / max(n, 1), 4)
        out[label] = r
        s.close()
    out["mean_ratio_rates_vs_every"] = round(out["rates"]["mean_ms"] / out["every_reading"]["mean_ms"], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
