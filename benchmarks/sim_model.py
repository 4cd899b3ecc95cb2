#!/usr/bin/env python3
"""Simulator model benchmark: does the parameter table reproduce the published DeepSeek-V4.1 TP8 figures?

Runs the pure scheduler model in virtual time (exact, no wall clock involved): a single long-context
stream, and closed-loop concurrency 1..32 with short prompts. Also reports how many simulated seconds the
model computes per wall second (median of 5 runs), the headroom the EngineCore has at a given --sim-speed.

Last line of output: one JSON object.
"""

from __future__ import annotations

import json
import statistics
import time

from lynxtop.sim import model as m


def main() -> None:
    single = m.run_closed_loop(m.default_engine(), concurrency=1, requests=1, prompt_tokens=m.REF_LONG_PROMPT_TOKENS,
                             output_tokens=m.REF_LONG_OUTPUT_TOKENS).finished[0]
    single_tps = single.generation_tokens / single.e2e_s
    curve = {}
    tpot = {}
    for c in (1, 2, 4, 8, m.PLATEAU_CONCURRENCY, 16, 32):
        run = m.run_closed_loop(m.default_engine(), concurrency=c, requests=c * 3, prompt_tokens=64, output_tokens=256)
        curve[c] = round(run.generation_tokens_per_s, 2)
        tpot[c] = round(statistics.fmean(f.tpot_s for f in run.finished) * 1000, 1)
        print(f"concurrency {c:3d}: {curve[c]:6.1f} tok/s, TPOT {tpot[c]:6.1f} ms")
    speeds = []
    for _ in range(5):
        t0 = time.perf_counter()
        run = m.run_closed_loop(m.default_engine(), concurrency=16, requests=32, prompt_tokens=64, output_tokens=128)
        speeds.append(run.duration_s / (time.perf_counter() - t0))
    print(f"single long stream: {single_tps:.3f} tok/s end to end, TTFT {single.ttft_s:.1f} s of {single.e2e_s:.1f} s")
    print(json.dumps({
        "single_stream_tokens_per_s": round(single_tps, 3),
        "single_stream_ratio_to_target": round(single_tps / m.TARGET_SINGLE_STREAM_TOKENS_PER_S, 3),
        "single_stream_prefill_share": round(single.ttft_s / single.e2e_s, 3),
        "plateau_tokens_per_s": curve[m.PLATEAU_CONCURRENCY],
        "plateau_ratio_to_target": round(curve[m.PLATEAU_CONCURRENCY] / m.TARGET_PLATEAU_TOKENS_PER_S, 3),
        "plateau_tpot_ms": tpot[m.PLATEAU_CONCURRENCY],
        "plateau_tpot_ratio_to_target": round(tpot[m.PLATEAU_CONCURRENCY] / 1000 / m.TARGET_PLATEAU_TPOT_S, 3),
        "throughput_by_concurrency": curve,
        "model_sim_seconds_per_wall_second_median": round(statistics.median(speeds), 1),
    }))


if __name__ == "__main__":
    main()
