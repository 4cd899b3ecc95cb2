"""Synthetic samples for store tests: realistic magnitudes, deterministic, with NULLs where asked."""

from __future__ import annotations

import random
import time

from lynxtop.contract.columns import GPU_METRICS, HOST_METRICS, SERVING_METRICS, names

# Three days ago, on the hour: inside every default retention window, so only tests that mean to expire
# data see any deleted.
T0 = int(time.time() * 1000) - 3 * 86_400_000
T0 -= T0 % 3_600_000


def gpu_row(gpu: int, i: int, rng: random.Random | None = None, null_every: int = 0) -> dict:
    rng = rng or random.Random(gpu * 1_000_003 + i)
    row: dict = {"gpu": gpu}
    for n in names(GPU_METRICS):
        if n.endswith("_pct"):
            v: float | int = rng.randint(0, 100)
        elif n.endswith("bytes_per_s"):
            v = rng.randint(0, 50_000_000_000)
        elif n.endswith("_bytes"):
            v = rng.randint(1, 141) * 1_000_000_000
        elif n in ("power_w", "power_limit_w"):
            v = rng.uniform(90, 700)  # a float: the writer rounds it
        elif n == "energy_j":
            v = 10_000_000 + i * 500
        else:
            v = rng.randint(0, 2000)
        row[n] = v
    if null_every and i % null_every == 0:
        row["sm_active_pct"] = None  # a reading NVML could not give this tick
        row.pop("temp_c")  # and one the sampler did not even emit
    return row


def host_row(i: int) -> dict:
    row = {n: None for n in names(HOST_METRICS)}
    row.update(cpu_pct=12.5 + i % 7, cpu_per_core_pct=[1.0, 2.5], load1=0.5, mem_used_bytes=10**10 + i)
    return row


def serving_row(i: int, run_id: int | None = None) -> dict:
    row = {n: None for n in names(SERVING_METRICS)}
    row.update(run_id=run_id, scrape_ok=1, requests_per_s=2.0 + i % 3, generation_tokens_per_s=300.0,
               requests_finished=2, generation_tokens=300, ttft_p99_ms=120.0 + i % 10, tpot_p99_ms=30.0)
    return row


def submit(w, n: int, start_i: int = 0, gpus: int = 8, step_ms: int = 1000, null_every: int = 0,
           run_id: int | None = None) -> list[int]:
    out = []
    for i in range(start_i, start_i + n):
        ts = T0 + i * step_ms
        w.submit_tick(ts, [gpu_row(g, i, null_every=null_every) for g in range(gpus)], host_row(i),
                      serving_row(i, run_id))
        out.append(ts)
    return out
