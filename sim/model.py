"""The performance model of the simulated node: ONE parameter table and a pure continuous-batching engine.

Everything the simulator pretends about DeepSeek-V4.1 (284B MoE) served TP8 on 8×H200 lives in `SimParams`,
so a reviewer can check the numbers in one place and `--sim-param KEY=VALUE` can change any of them. The
engine here has no clock and no I/O: `SimEngine.step()` says how long one engine iteration takes in
*simulated* seconds and what it produced. The EngineCore process runs it against the wall clock (divided
by a speed factor); tests and benchmarks run it in virtual time, which is exact and takes milliseconds.

Published figures the defaults reproduce (checked by tests/agent/sim/test_model.py, within 10 %):
  * one long-context stream (REF_LONG_PROMPT_TOKENS in, REF_LONG_OUTPUT_TOKENS out) runs at about
    TARGET_SINGLE_STREAM_TOKENS_PER_S end to end; prefill is ~90 % of its time;
  * aggregate generation throughput rises with concurrency to a plateau near TARGET_PLATEAU_TOKENS_PER_S,
    reached at about TARGET_PLATEAU_TPOT_S per output token (~12 concurrent streams).

Decode step time with d sequences decoding:  max(step_overhead_s + decode_s_per_seq·d, d / max_decode_tokens_per_s)
   – the first term is the memory-bound regime (weights streamed once per step, KV reads per sequence), the
     second the compute ceiling of the expert GEMMs: past the knee throughput stays flat and streams slow down.
Each step also pays prefill_s_per_token for every prompt token it computes (chunked prefill, at most
max_num_batched_tokens per step, mixed with decodes as vLLM V1 does).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field, fields, replace

GIB = 1024**3

# Reference workloads behind the published figures (also used by the tests and benchmarks).
REF_LONG_PROMPT_TOKENS = 120_000
REF_LONG_OUTPUT_TOKENS = 256
TARGET_SINGLE_STREAM_TOKENS_PER_S = 1.2
TARGET_PLATEAU_TOKENS_PER_S = 86.0
TARGET_PLATEAU_TPOT_S = 0.138
PLATEAU_CONCURRENCY = 12


@dataclass(frozen=True)
class SimParams:
    """The parameter table. Units are in the names; comments say where a value comes from."""

    # --- speed (calibrated to the published figures above) ---
    step_overhead_s: float = 0.0693  # fixed cost of one engine step: scheduling, launch, weight streaming
    decode_s_per_seq: float = 0.00573  # extra step time per decoding sequence (KV reads, sampling)
    max_decode_tokens_per_s: float = 88.0  # decode compute ceiling; ~86 measured once short prefills interleave
    prefill_s_per_token: float = 0.00161  # prompt processing cost (~620 tokens/s on this node)
    default_max_num_batched_tokens: int = 8192  # vLLM V1's default chunk for the API server on H100/H200
    default_max_num_seqs: int = 256  # vLLM's default --max-num-seqs
    default_max_model_len: int = 163_840  # the model's context window (config.json)
    default_block_size: int = 64  # FlashMLA forces 64-token blocks for MLA models
    # --- memory (per GPU unless said otherwise) ---
    gpu_mem_bytes: int = 143771 * 1024 * 1024  # H200 as NVML reports it (same as FakeGpuSpec)
    weights_bytes_total: int = 296 * 10**9  # 284B params in FP8 + BF16 norms/embeddings; split over TP·PP
    expert_weights_share: float = 0.95  # routed experts' share of the weights; EP spreads them over DP·TP
    activation_bytes: int = int(5.5 * GIB)  # peak activations + NCCL buffers found by the profiling run
    cuda_graph_bytes: int = int(0.9 * GIB)  # memory the captured graphs take
    kv_bytes_per_token: int = 70_272  # MLA latent (512+64) × 61 layers × 2 bytes, replicated on every TP rank
    kv_fp8_ratio: float = 656 / 1152  # fp8 MLA cache: 656 bytes/layer (with scales) instead of 1152
    # --- start-up: share of --sim-startup-seconds spent in each phase ---
    startup_weights_share: float = 0.70
    startup_profile_share: float = 0.10
    startup_graphs_share: float = 0.15  # the rest is API server start
    # --- behaviour ---
    default_output_tokens_min: int = 32  # when a request sets no max_tokens, it "stops" after a seeded
    default_output_tokens_max: int = 600  # random length in this range (finish reason "stop")
    spec_accept_rate: float = 0.7  # MTP draft acceptance when --speculative-config is given
    # simulated disaggregated decode instance: each request first waits this long for its KV from a prefill node,
    # deferred (vllm:num_requests_waiting_by_reason{reason="deferred"}); 0: no such wait
    remote_kv_wait_s: float = 0.0
    # --- simulated GPU activity ---
    idle_power_w: float = 75.0
    max_power_w: float = 690.0
    ambient_temp_c: float = 30.0
    temp_c_per_w: float = 0.072  # steady-state rise per watt (air-cooled HGX: ~80 °C at full power)
    temp_time_constant_s: float = 20.0
    nvlink_bytes_per_token: float = 3.0e6  # all-reduce traffic per generated/prefilled token per GPU
    active_params: float = 37e9  # MoE parameters one token touches (~37B of 284B): vLLM's estimated_flops
    # --- per-GPU spread and the straggler (--sim-fail straggler=GPU) ---
    gpu_spread: float = 0.03  # GPU-to-GPU spread of activity and power (± share, fixed per GPU index)
    gpu_temp_spread_c: float = 2.0  # ± °C per GPU (airflow: the GPUs of one board never read alike)
    straggler_slowdown: float = 1.3  # a straggler's clock is this much slower; its whole TP group waits for it
    straggler_temp_rise_c: float = 14.0  # how much hotter the straggler runs (the thermal throttling behind it)

    def kv_bytes_per_token_for(self, kv_cache_dtype: str | None) -> int:
        if kv_cache_dtype and kv_cache_dtype.startswith("fp8"):
            return int(self.kv_bytes_per_token * self.kv_fp8_ratio)
        return self.kv_bytes_per_token

    def decode_step_s(self, decoding: int) -> float:
        if decoding <= 0:
            return self.step_overhead_s
        return max(self.step_overhead_s + self.decode_s_per_seq * decoding, decoding / self.max_decode_tokens_per_s)


PARAM_NAMES = tuple(f.name for f in fields(SimParams))


def params_with(overrides: dict[str, str]) -> SimParams:
    """SimParams with KEY=VALUE overrides applied; raises ValueError naming the bad key or value."""
    types = {f.name: f.type for f in fields(SimParams)}
    values: dict[str, float | int] = {}
    for key, raw in overrides.items():
        if key not in types:
            raise ValueError(f"unknown simulator parameter {key!r} (known: {', '.join(PARAM_NAMES)})")
        try:
            value: float | int = int(raw) if types[key] in ("int", int) else float(raw)
        except ValueError:
            raise ValueError(f"simulator parameter {key}={raw!r}: expected a number") from None
        if value < 0 or (isinstance(value, float) and not math.isfinite(value)):
            raise ValueError(f"simulator parameter {key}={raw!r}: must be a finite number >= 0")
        values[key] = value
    return replace(SimParams(), **values)


# ---------------------------------------------------------------------------------------------- memory plan


@dataclass(frozen=True)
class MemoryPlan:
    """What the start-up profiling run would find on one GPU."""

    weights_bytes: int
    activation_bytes: int
    graph_bytes: int
    kv_bytes: int  # may be <= 0: nothing left for the cache
    block_size: int
    num_gpu_blocks: int
    kv_tokens: int
    requested_bytes: int  # gpu_memory_utilization × total

    @property
    def used_bytes(self) -> int:
        return self.weights_bytes + self.activation_bytes + self.graph_bytes + max(self.kv_bytes, 0)


def weights_per_gpu(p: SimParams, *, tp: int, pp: int, dp: int = 1, expert_parallel: bool = False) -> int:
    """One GPU's share of the weights: TP·PP split them all; with --enable-expert-parallel the routed experts
    are split over the whole expert-parallel group (DP·TP) instead, the dense layers stay replicated per DP rank
    (so DP8 + EP with TP1 fits DeepSeek on 8 GPUs, DP8 alone does not)."""
    shards = max(tp * pp, 1)
    if not expert_parallel:
        return p.weights_bytes_total // shards
    experts = p.weights_bytes_total * p.expert_weights_share
    return int((p.weights_bytes_total - experts) / shards + experts / (shards * max(dp, 1)))


def plan_memory(p: SimParams, *, tp: int, pp: int, gpu_memory_utilization: float, block_size: int | None,
                kv_cache_dtype: str | None, dp: int = 1, expert_parallel: bool = False) -> MemoryPlan:
    requested = int(p.gpu_mem_bytes * gpu_memory_utilization)
    weights = weights_per_gpu(p, tp=tp, pp=pp, dp=dp, expert_parallel=expert_parallel)
    kv = requested - weights - p.activation_bytes - p.cuda_graph_bytes
    bs = block_size or p.default_block_size
    per_block = bs * p.kv_bytes_per_token_for(kv_cache_dtype)
    blocks = max(kv // per_block, 0)
    return MemoryPlan(weights, p.activation_bytes, p.cuda_graph_bytes, kv, bs, blocks, blocks * bs, requested)


# ---------------------------------------------------------------------------------------------- engine


@dataclass(eq=False)  # a request is itself: list membership and removal by identity (512 running: O(n) each)
class SimRequest:
    rid: str
    prompt_tokens: int
    max_tokens: int
    arrival_s: float
    finish_reason_at_max: str = "length"  # "stop" when the length was drawn by the simulator
    block_hashes: tuple[int, ...] = ()  # chained hashes of the prompt's full blocks (prefix caching)
    ready_s: float = 0.0  # deferred (not schedulable) before this simulated time: its remote KV has not arrived
    # progress
    computed: int = 0  # tokens whose KV is computed (prompt and recomputed outputs)
    generated: int = 0
    blocks: int = 0
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    cached_tokens: int = 0
    counted_prefix: bool = False
    preemptions: int = 0

    @property
    def to_compute(self) -> int:
        """Tokens to (re)compute before the next token can be sampled."""
        return self.prompt_tokens + self.generated - self.computed

    @property
    def total_len(self) -> int:
        return self.prompt_tokens + self.generated


@dataclass
class FinishedRequest:
    rid: str
    reason: str
    prompt_tokens: int
    generation_tokens: int
    max_tokens: int
    cached_tokens: int
    queue_s: float
    prefill_s: float
    decode_s: float
    inference_s: float
    e2e_s: float
    ttft_s: float
    tpot_s: float  # mean time per output token after the first (0 with one token)
    preemptions: int = 0  # times this request was preempted (vLLM's request_num_preemptions)


@dataclass
class StepResult:
    duration_s: float
    tokens: list[tuple[str, int]] = field(default_factory=list)  # (rid, new tokens this step)
    first_tokens: list[tuple[str, float]] = field(default_factory=list)  # (rid, TTFT seconds)
    finished: list[FinishedRequest] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)  # one per decode token (vLLM's inter_token_latency)
    prefill_tokens: int = 0  # computed this step
    decode_tokens: int = 0
    prompt_tokens_done: int = 0  # prompt tokens of requests that got their first token this step
    prompt_cached_done: int = 0  # of those, tokens that came from the prefix cache
    preemptions: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted: int = 0
    prefill_s: float = 0.0  # the prefill part of duration_s (GPU activity: tensor-heavy)

    @property
    def iteration_tokens(self) -> int:
        return self.prefill_tokens + self.decode_tokens


class SimEngine:
    """vLLM V1-like scheduler: running requests first (decode, then chunked prefill), then waiting ones FCFS.

    KV blocks are allocated as tokens are computed; when a running request needs a block and none is free,
    the newest running request is preempted (recompute mode, as V1 does) and goes back to the queue head.
    """

    def __init__(self, params: SimParams, *, num_gpu_blocks: int, block_size: int, max_num_seqs: int,
                 max_num_batched_tokens: int, enable_prefix_caching: bool = True, spec_tokens: int = 0,
                 seed: int = 0, slowdown: float = 1.0):
        self.p = params
        self.slowdown = slowdown  # > 1: a straggler GPU in the group stretches every step
        self.num_gpu_blocks = num_gpu_blocks
        self.free_blocks = num_gpu_blocks
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_prefix_caching = enable_prefix_caching
        self.spec_tokens = spec_tokens
        self._spec_state = seed * 2654435761 % 2**32 or 1
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self._prefix_cache: OrderedDict[int, None] = OrderedDict()  # block hash -> (LRU order)
        self.hung = False

    # -- queue

    def add(self, req: SimRequest) -> None:
        self.waiting.append(req)

    def abort(self, rid: str, now_s: float) -> FinishedRequest | None:
        for req in list(self.running):
            if req.rid == rid:
                self.running.remove(req)
                self._free(req)
                return self._finish(req, "abort", now_s)
        for req in list(self.waiting):
            if req.rid == rid:
                self.waiting.remove(req)
                return self._finish(req, "abort", now_s)
        return None

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def kv_usage(self) -> float:
        return 1.0 - self.free_blocks / self.num_gpu_blocks if self.num_gpu_blocks else 0.0

    def deferred(self, now_s: float) -> int:
        """Waiting requests that cannot be scheduled yet whatever the room (vLLM's reason "deferred")."""
        return sum(1 for req in self.waiting if req.ready_s > now_s)

    def waiting_for_capacity(self, now_s: float) -> int:
        """Waiting requests that could run if there were room (vLLM's reason "capacity")."""
        return len(self.waiting) - self.deferred(now_s)

    # -- one step

    def step(self, now_s: float) -> StepResult:
        """Schedule and 'run' one iteration starting at simulated time now_s."""
        res = StepResult(duration_s=0.0)
        decoding: list[SimRequest] = []
        prefilling: list[tuple[SimRequest, int]] = []
        budget = self._schedule_running(res, decoding, prefilling)
        self._admit_waiting(res, budget, prefilling, now_s)

        d = len(decoding)
        prefill_tokens = sum(n for _, n in prefilling)
        if d == 0 and prefill_tokens == 0:
            return res
        spec = self._spec_round(d) if d and self.spec_tokens else None
        res.prefill_s = self.p.prefill_s_per_token * prefill_tokens * self.slowdown
        res.duration_s = self.p.decode_step_s(d) * self.slowdown + res.prefill_s
        end = now_s + res.duration_s
        res.prefill_tokens = prefill_tokens
        self._decode(decoding, spec, res, end)
        self._prefill(prefilling, res, end)
        if any(req.generated >= req.max_tokens for req in self.running):
            still: list[SimRequest] = []
            for req in self.running:
                if req.generated >= req.max_tokens:
                    self._free(req)
                    res.finished.append(self._finish(req, req.finish_reason_at_max, end))
                else:
                    still.append(req)
            self.running[:] = still
        return res

    def _schedule_running(self, res: StepResult, decoding: list[SimRequest],
                          prefilling: list[tuple[SimRequest, int]]) -> int:
        """Running requests keep their place first; decode needs one slot, prefill a chunk. Returns the budget
        left."""
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running):
            req = self.running[i]
            want = 1 if req.to_compute <= 0 else min(req.to_compute, budget)
            if want <= 0:
                i += 1
                continue
            preempted = False
            while not self._grow(req, want):
                victim = self.running[-1]
                self._preempt(victim, res)
                if victim is req:
                    preempted = True
                    break
            if preempted:
                continue
            budget -= want
            if req.to_compute <= 0:
                decoding.append(req)
            else:
                prefilling.append((req, want))
            i += 1
        return budget

    def _admit_waiting(self, res: StepResult, budget: int, prefilling: list[tuple[SimRequest, int]],
                       now_s: float) -> None:
        """Then waiting requests, FCFS, while there is room; a deferred one is passed over (as vLLM skips one
        waiting for remote KV), the others keep their order."""
        i = 0
        while i < len(self.waiting) and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[i]
            if req.ready_s > now_s:
                i += 1
                continue
            if not req.counted_prefix:
                self._lookup_prefix(req, res)
            want = min(req.to_compute, budget)
            if not self._grow(req, want):
                break  # KV cache full: the request waits (and later ones wait behind it, FCFS)
            del self.waiting[i]
            self.running.append(req)
            if req.first_scheduled_s is None:
                req.first_scheduled_s = now_s
            budget -= want
            prefilling.append((req, want))

    def _decode(self, decoding: list[SimRequest], spec: list[int] | None, res: StepResult, end: float) -> None:
        for req in decoding:
            new = 1
            if spec is not None:
                accepted = spec.pop()
                new = 1 + accepted
                res.spec_drafts += 1
                res.spec_draft_tokens += self.spec_tokens
                res.spec_accepted += accepted
            new = min(new, req.max_tokens - req.generated)
            req.generated += new
            req.computed += new
            res.decode_tokens += new
            res.tokens.append((req.rid, new))
            gap = end - (req.last_token_s if req.last_token_s is not None else end)
            res.itl_s.extend([gap / new] * new)
            req.last_token_s = end

    def _prefill(self, prefilling: list[tuple[SimRequest, int]], res: StepResult, end: float) -> None:
        for req, n in prefilling:
            req.computed += n
            if req.to_compute > 0:
                continue
            # prefill done: this step samples a token (part of the prefill step, not a decode token)
            req.generated += 1
            req.computed += 1
            res.tokens.append((req.rid, 1))
            if req.first_token_s is None:
                req.first_token_s = end
                res.first_tokens.append((req.rid, end - req.arrival_s))
                res.prompt_tokens_done += req.prompt_tokens
                res.prompt_cached_done += min(req.cached_tokens, req.prompt_tokens)
                self._remember_prefix(req)
            elif req.last_token_s is not None:  # resumed after preemption: one long gap
                res.itl_s.append(end - req.last_token_s)
            req.last_token_s = end

    # -- helpers

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _grow(self, req: SimRequest, new_tokens: int) -> bool:
        need = self._blocks_for(req.computed + new_tokens) - req.blocks
        if need <= 0:
            return True
        if need > self.free_blocks:
            return False
        self.free_blocks -= need
        req.blocks += need
        return True

    def _free(self, req: SimRequest) -> None:
        self.free_blocks += req.blocks
        req.blocks = 0

    def _preempt(self, req: SimRequest, res: StepResult) -> None:
        self.running.remove(req)
        self._free(req)
        req.computed = 0
        req.preemptions += 1
        res.preemptions += 1
        self.waiting.appendleft(req)

    def _lookup_prefix(self, req: SimRequest, res: StepResult) -> None:
        """Longest run of leading blocks already cached; the last prompt token is always computed (as vLLM)."""
        req.counted_prefix = True
        if not self.enable_prefix_caching:
            return
        res.prefix_queries += req.prompt_tokens
        blocks = 0
        for h in req.block_hashes:
            if h not in self._prefix_cache:
                break
            self._prefix_cache.move_to_end(h)
            blocks += 1
        hit = min(blocks * self.block_size, (req.prompt_tokens - 1) // self.block_size * self.block_size)
        req.cached_tokens = hit
        req.computed = hit
        res.prefix_hits += hit

    def _remember_prefix(self, req: SimRequest) -> None:
        """Computed blocks stay reusable until evicted (LRU, as many blocks as the KV cache holds)."""
        if not (self.enable_prefix_caching and req.block_hashes):
            return
        for h in req.block_hashes:
            self._prefix_cache[h] = None
            self._prefix_cache.move_to_end(h)
        while len(self._prefix_cache) > self.num_gpu_blocks:
            self._prefix_cache.popitem(last=False)

    def _spec_round(self, n: int) -> list[int]:
        """Accepted draft tokens for n sequences (deterministic xorshift: runs are reproducible)."""
        out = []
        for _ in range(n):
            accepted = 0
            for _ in range(self.spec_tokens):
                self._spec_state ^= (self._spec_state << 13) & 0xFFFFFFFF
                self._spec_state ^= self._spec_state >> 17
                self._spec_state ^= (self._spec_state << 5) & 0xFFFFFFFF
                if self._spec_state / 2**32 >= self.p.spec_accept_rate:
                    break
                accepted += 1
            out.append(accepted)
        return out

    @staticmethod
    def _finish(req: SimRequest, reason: str, end_s: float) -> FinishedRequest:
        sched = req.first_scheduled_s if req.first_scheduled_s is not None else end_s
        first = req.first_token_s if req.first_token_s is not None else end_s
        decode = max(end_s - first, 0.0)
        return FinishedRequest(
            rid=req.rid, reason=reason, prompt_tokens=req.prompt_tokens, generation_tokens=req.generated,
            max_tokens=req.max_tokens, cached_tokens=req.cached_tokens,
            queue_s=max(sched - req.arrival_s, 0.0), prefill_s=max(first - sched, 0.0), decode_s=decode,
            inference_s=max(end_s - sched, 0.0), e2e_s=max(end_s - req.arrival_s, 0.0),
            ttft_s=max(first - req.arrival_s, 0.0),
            tpot_s=decode / (req.generated - 1) if req.generated > 1 else 0.0,
            preemptions=req.preemptions,
        )


# ---------------------------------------------------------------------------------------------- virtual time


@dataclass
class VirtualRun:
    finished: list[FinishedRequest]
    duration_s: float
    generation_tokens: int
    steps: int

    @property
    def generation_tokens_per_s(self) -> float:
        return self.generation_tokens / self.duration_s if self.duration_s else 0.0


def run_closed_loop(engine: SimEngine, *, concurrency: int, requests: int, prompt_tokens: int,
                    output_tokens: int, max_steps: int = 5_000_000) -> VirtualRun:
    """Keep `concurrency` requests in flight until `requests` have finished; all in simulated time.

    This is how `vllm bench serve --max-concurrency N` loads a server, so the figures compare directly.
    """
    now = 0.0
    submitted = 0
    done: list[FinishedRequest] = []
    gen = 0
    steps = 0
    while len(done) < requests and steps < max_steps:
        while submitted < requests and submitted - len(done) < concurrency:
            engine.add(SimRequest(rid=f"r{submitted}", prompt_tokens=prompt_tokens, max_tokens=output_tokens,
                                  arrival_s=now))
            submitted += 1
        res = engine.step(now)
        steps += 1
        if res.duration_s <= 0:
            raise RuntimeError("engine made no progress (KV cache too small for one request?)")
        now += res.duration_s
        gen += sum(n for _, n in res.tokens)
        done.extend(res.finished)
    return VirtualRun(done, now, gen, steps)


def default_engine(params: SimParams | None = None, *, max_num_seqs: int | None = None,
                   max_num_batched_tokens: int | None = None, tp: int = 8,
                   gpu_memory_utilization: float = 0.9, kv_cache_dtype: str | None = None) -> SimEngine:
    """The engine a `vllm serve` of the reference profile would build (for tests and benchmarks)."""
    p = params or SimParams()
    plan = plan_memory(p, tp=tp, pp=1, gpu_memory_utilization=gpu_memory_utilization, block_size=None,
                       kv_cache_dtype=kv_cache_dtype)
    return SimEngine(p, num_gpu_blocks=plan.num_gpu_blocks, block_size=plan.block_size,
                     max_num_seqs=max_num_seqs or p.default_max_num_seqs,
                     max_num_batched_tokens=max_num_batched_tokens or p.default_max_num_batched_tokens)
