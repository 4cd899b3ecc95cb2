"""One short real-server check of the documented figures (compressed clock): latency of a single long
stream and throughput at saturation, measured by a streaming client, within 10 %."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from lynxtop.sim import model as sim_model
from lynxtop.sim.loadgen import bench


def within(value: float, target: float, tol: float = 0.10) -> bool:
    return abs(value - target) <= tol * target


def test_real_server_single_stream_and_saturation_match_the_model(start_sim, kit, tmp_path):
    speed = 40.0
    sp = start_sim(speed=speed, max_model_len=131072)
    sp.wait_ready()
    single = asyncio.run(bench(sp.url, concurrency=1, requests=1, prompt_tokens=sim_model.REF_LONG_PROMPT_TOKENS,
                               output_tokens=sim_model.REF_LONG_OUTPUT_TOKENS))
    e2e_sim_s = single["mean_e2el_ms"] / 1000 * speed
    assert within(sim_model.REF_LONG_OUTPUT_TOKENS / e2e_sim_s, sim_model.TARGET_SINGLE_STREAM_TOKENS_PER_S), single

    # saturation on a slower clock: at 40x a 138 ms step is 3.5 ms and HTTP overhead would count
    speed = 4.0
    sp = start_sim(speed=speed, state_dir=tmp_path / "second-node")  # the first server still holds its GPUs
    sp.wait_ready()
    sat = asyncio.run(bench(sp.url, concurrency=sim_model.PLATEAU_CONCURRENCY, requests=sim_model.PLATEAU_CONCURRENCY,
                            prompt_tokens=16, output_tokens=80))
    assert sat["completed"] == sim_model.PLATEAU_CONCURRENCY and sat["failed"] == 0
    assert within(sat["output_throughput"] / speed, sim_model.TARGET_PLATEAU_TOKENS_PER_S), sat
    assert within(sat["mean_tpot_ms"] / 1000 * speed, sim_model.TARGET_PLATEAU_TPOT_S), sat

    # the server's own histograms (simulated seconds) agree with the client
    fams = {f.name: f for f in text_string_to_metric_families(kit.http(sp.url + "/metrics")[1].decode())}
    tpot = {s.name.rsplit("_", 1)[1]: s.value for s in fams["vllm:request_time_per_output_token_seconds"].samples
            if s.name.endswith(("_sum", "_count"))}
    assert tpot["count"] == sim_model.PLATEAU_CONCURRENCY
    assert within(tpot["sum"] / tpot["count"], sim_model.TARGET_PLATEAU_TPOT_S), tpot
