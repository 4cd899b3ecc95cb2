"""The performance model in virtual time: the published DeepSeek-V4.1 TP8 figures, within 10 %."""

from __future__ import annotations

import pytest

from lynxtop.sim.model import (
    PLATEAU_CONCURRENCY,
    REF_LONG_OUTPUT_TOKENS,
    REF_LONG_PROMPT_TOKENS,
    TARGET_PLATEAU_TOKENS_PER_S,
    TARGET_PLATEAU_TPOT_S,
    TARGET_SINGLE_STREAM_TOKENS_PER_S,
    SimEngine,
    SimParams,
    SimRequest,
    default_engine,
    params_with,
    plan_memory,
    run_closed_loop,
    weights_per_gpu,
)


def within(value: float, target: float, tol: float = 0.10) -> bool:
    return abs(value - target) <= tol * target


def test_single_long_stream_is_prefill_dominated_and_about_1_2_tokens_per_s():
    run = run_closed_loop(default_engine(), concurrency=1, requests=1, prompt_tokens=REF_LONG_PROMPT_TOKENS,
                          output_tokens=REF_LONG_OUTPUT_TOKENS)
    (req,) = run.finished
    end_to_end = req.generation_tokens / req.e2e_s
    assert within(end_to_end, TARGET_SINGLE_STREAM_TOKENS_PER_S), end_to_end
    assert req.ttft_s > 0.8 * req.e2e_s  # prefill dominates
    assert req.generation_tokens == REF_LONG_OUTPUT_TOKENS


def _throughput(concurrency: int) -> tuple[float, float]:
    run = run_closed_loop(default_engine(), concurrency=concurrency, requests=concurrency * 2, prompt_tokens=64,
                          output_tokens=256)
    tpot = sum(f.tpot_s for f in run.finished) / len(run.finished)
    return run.generation_tokens_per_s, tpot


def test_throughput_rises_with_concurrency_to_the_plateau():
    curve = [_throughput(c)[0] for c in (1, 2, 4, 8)]
    assert curve == sorted(curve) and curve[0] < 0.25 * TARGET_PLATEAU_TOKENS_PER_S
    at_knee, tpot = _throughput(PLATEAU_CONCURRENCY)
    assert within(at_knee, TARGET_PLATEAU_TOKENS_PER_S), at_knee
    assert within(tpot, TARGET_PLATEAU_TPOT_S), tpot
    beyond, tpot_beyond = _throughput(32)
    assert within(beyond, TARGET_PLATEAU_TOKENS_PER_S), beyond  # a plateau: no more throughput...
    assert tpot_beyond > 2 * TARGET_PLATEAU_TPOT_S  # ...each stream just gets slower


def test_max_num_seqs_caps_the_batch_and_the_rest_queue():
    eng = default_engine(max_num_seqs=4)
    for i in range(10):
        eng.add(SimRequest(rid=str(i), prompt_tokens=100, max_tokens=50, arrival_s=0.0))
    eng.step(0.0)
    assert len(eng.running) == 4 and len(eng.waiting) == 6
    run = run_closed_loop(default_engine(max_num_seqs=4), concurrency=10, requests=10, prompt_tokens=100,
                          output_tokens=50)
    queued = [f.queue_s for f in run.finished]
    assert max(queued) > 0 and min(queued) == 0


def test_full_kv_cache_queues_new_requests_and_preempts_growing_ones():
    p = SimParams()
    # 40 blocks of 64 tokens: room for 2 requests of 1000 prompt tokens, not for their whole outputs
    eng = SimEngine(p, num_gpu_blocks=40, block_size=64, max_num_seqs=16, max_num_batched_tokens=8192)
    for i in range(3):
        eng.add(SimRequest(rid=str(i), prompt_tokens=1000, max_tokens=400, arrival_s=0.0))
    now, preempted, finished = 0.0, 0, []
    first = eng.step(now)
    assert len(eng.running) == 2 and len(eng.waiting) == 1  # the third waits for KV blocks
    now += first.duration_s
    while eng.has_work:
        r = eng.step(now)
        assert r.duration_s > 0
        now += r.duration_s
        preempted += r.preemptions
        finished += r.finished
        assert eng.free_blocks >= 0 and eng.kv_usage <= 1.0
    assert preempted > 0
    assert sorted(f.rid for f in finished) == ["0", "1", "2"]
    assert all(f.generation_tokens == 400 for f in finished)
    assert eng.free_blocks == 40  # every block came back


def test_prefix_cache_hits_skip_prefill():
    eng = default_engine()
    hashes = tuple(range(100, 140))  # 40 full blocks = 2560 tokens of shared prefix
    eng.add(SimRequest(rid="a", prompt_tokens=3000, max_tokens=2, arrival_s=0.0, block_hashes=hashes))
    now = 0.0
    while eng.has_work:
        now += eng.step(now).duration_s
    cold = eng.p.prefill_s_per_token * 3000
    eng.add(SimRequest(rid="b", prompt_tokens=3000, max_tokens=2, arrival_s=now, block_hashes=hashes))
    r = eng.step(now)
    assert r.prefix_queries == 3000 and r.prefix_hits == 2560
    assert r.prefill_tokens == 3000 - 2560
    assert r.duration_s < cold / 3


def test_memory_plan_follows_the_flags():
    p = SimParams()
    base = plan_memory(p, tp=8, pp=1, gpu_memory_utilization=0.9, block_size=None, kv_cache_dtype="auto")
    fp8 = plan_memory(p, tp=8, pp=1, gpu_memory_utilization=0.9, block_size=None, kv_cache_dtype="fp8")
    less = plan_memory(p, tp=8, pp=1, gpu_memory_utilization=0.8, block_size=None, kv_cache_dtype="auto")
    tp4 = plan_memory(p, tp=4, pp=1, gpu_memory_utilization=0.9, block_size=None, kv_cache_dtype="auto")
    assert base.weights_bytes == p.weights_bytes_total // 8
    assert fp8.kv_tokens > 1.7 * base.kv_tokens
    assert less.kv_tokens < base.kv_tokens
    assert tp4.kv_bytes < base.kv_bytes  # bigger weight shards leave less for the cache
    assert base.used_bytes <= base.requested_bytes


def test_expert_parallelism_spreads_the_experts_over_the_dp_ranks():
    """DP8 + EP with TP1 (DeepSeek's serving shape) fits on 8 H200s; DP8 without EP would need the whole
    model on every GPU; with TP8 and no DP the experts are split by TP anyway."""
    p = SimParams()
    ep = plan_memory(p, tp=1, pp=1, dp=8, expert_parallel=True, gpu_memory_utilization=0.9, block_size=None,
                     kv_cache_dtype="auto")
    no_ep = plan_memory(p, tp=1, pp=1, dp=8, gpu_memory_utilization=0.9, block_size=None, kv_cache_dtype="auto")
    assert no_ep.weights_bytes == p.weights_bytes_total and no_ep.kv_bytes <= 0
    dense = p.weights_bytes_total * (1 - p.expert_weights_share)
    assert ep.weights_bytes == pytest.approx(dense + (p.weights_bytes_total - dense) / 8, rel=1e-6)
    assert ep.num_gpu_blocks > 0 and ep.kv_tokens > 163_840
    assert weights_per_gpu(p, tp=8, pp=1, dp=1, expert_parallel=True) == pytest.approx(
        weights_per_gpu(p, tp=8, pp=1), rel=1e-6)


def test_params_overrides_are_validated():
    assert params_with({"max_decode_tokens_per_s": "40"}).max_decode_tokens_per_s == 40.0
    with pytest.raises(ValueError, match="unknown simulator parameter 'nope'"):
        params_with({"nope": "1"})
    with pytest.raises(ValueError, match="expected a number"):
        params_with({"step_overhead_s": "fast"})
    with pytest.raises(ValueError, match=">= 0"):
        params_with({"step_overhead_s": "-1"})


def test_a_straggler_slows_its_whole_group_by_its_factor():
    def closed_loop(slowdown: float):
        eng = default_engine()
        eng.slowdown = slowdown
        return run_closed_loop(eng, concurrency=4, requests=8, prompt_tokens=500, output_tokens=40)

    fast, slow = closed_loop(1.0), closed_loop(1.3)
    assert slow.steps == fast.steps  # the same schedule...
    assert slow.duration_s == pytest.approx(1.3 * fast.duration_s)  # ...every step stretched
    assert slow.generation_tokens_per_s == pytest.approx(fast.generation_tokens_per_s / 1.3)
