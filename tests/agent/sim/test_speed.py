"""One short real-server check of the documented figures (compressed clock): latency of a single long
stream and throughput at saturation, measured by a streaming client, within 10 %."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from lynxtop.agent.sim.loadgen import bench
from lynxtop.agent.sim.model import (
    PLATEAU_CONCURRENCY,
    REF_LONG_OUTPUT_TOKENS,
    REF_LONG_PROMPT_TOKENS,
    TARGET_PLATEAU_TOKENS_PER_S,
    TARGET_PLATEAU_TPOT_S,
    TARGET_SINGLE_STREAM_TOKENS_PER_S,
)


def within(value: float, target: float, tol: float = 0.10) -> bool:
    return abs(value - target) <= tol * target


def test_real_server_single_stream_and_saturation_match_the_model(start_sim, kit, tmp_path):
    speed = 40.0
    sp = start_sim(speed=speed, max_model_len=131072)
    sp.wait_ready()
    single = asyncio.run(bench(sp.url, concurrency=1, requests=1, prompt_tokens=REF_LONG_PROMPT_TOKENS,
                               output_tokens=REF_LONG_OUTPUT_TOKENS))
    e2e_sim_s = single["mean_e2el_ms"] / 1000 * speed
    assert within(REF_LONG_OUTPUT_TOKENS / e2e_sim_s, TARGET_SINGLE_STREAM_TOKENS_PER_S), single

    # saturation on a slower clock: at 40x a 138 ms step is 3.5 ms and HTTP overhead would count
    speed = 4.0
    sp = start_sim(speed=speed, state_dir=tmp_path / "second-node")  # the first server still holds its GPUs
    sp.wait_ready()
    sat = asyncio.run(bench(sp.url, concurrency=PLATEAU_CONCURRENCY, requests=PLATEAU_CONCURRENCY,
                            prompt_tokens=16, output_tokens=80))
    assert sat["completed"] == PLATEAU_CONCURRENCY and sat["failed"] == 0
    assert within(sat["output_throughput"] / speed, TARGET_PLATEAU_TOKENS_PER_S), sat
    assert within(sat["mean_tpot_ms"] / 1000 * speed, TARGET_PLATEAU_TPOT_S), sat

    # the server's own histograms (simulated seconds) agree with the client
    fams = {f.name: f for f in text_string_to_metric_families(kit.http(sp.url + "/metrics")[1].decode())}
    tpot = {s.name.rsplit("_", 1)[1]: s.value for s in fams["vllm:request_time_per_output_token_seconds"].samples
            if s.name.endswith(("_sum", "_count"))}
    assert tpot["count"] == PLATEAU_CONCURRENCY
    assert within(tpot["sum"] / tpot["count"], TARGET_PLATEAU_TPOT_S), tpot
