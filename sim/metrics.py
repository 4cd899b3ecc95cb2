"""vLLM's /metrics page for the simulator: exact names, types, labels and default buckets.

Built with prometheus_client in a private CollectorRegistry, as vLLM does, so the text (the `_total` suffix
of counters, the `*_created` families, `# HELP`/`# TYPE` lines) is byte-for-byte the same machinery. Which
families exist depends on the imitated version (`--sim-vllm-version`): 0.10 still prints the old names
(`gpu_cache_usage_perc`, `gpu_prefix_cache_*`, `time_per_output_token_seconds`) and lacks the newer ones.
The version gates are approximate where vLLM's history is fuzzy; the renames match the reference notes.
The 0.32 set (families, label sets, buckets, the 36 CacheConfig labels) was checked against a real vLLM
0.32.0 server (docs/real_vllm.md; tests/real_vllm compares the two pages).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    gc_collector,
    generate_latest,
    platform_collector,
    process_collector,
)

from lynxtop.sim.httpmetrics import HttpMetrics

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
FINISH_REASONS = ("stop", "length", "abort")
FINISH_REASONS_032 = (*FINISH_REASONS, "error", "repetition")  # vLLM 0.32's FinishReason enum
REQUEST_NUM_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
# First version whose page the simulator copies from a real 0.32.0 server; between 0.13 and this the
# simulator prints the 0.13 set (those intermediate versions were never checked against a real page).
V032 = (0, 32)
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's token-count buckets)."""
    out: list[int] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exponent
            if v > max_value:
                return out
            out.append(v)
        exponent += 1


def cache_config_labels(version: tuple[int, int], *, block_size: int, user_block_size: bool, cache_dtype: str,
                        enable_prefix_caching: bool, gpu_memory_utilization: float, num_gpu_blocks: int,
                        kv_tokens: int, max_model_len: int) -> dict[str, str]:
    """vllm:cache_config_info's labels: str() of every CacheConfig field, as `CacheConfig.metrics_info()` gives.

    0.32's 36 fields (plus `engine`) were read from a real server; older versions carry the pre-0.11 set
    (swap_space, cpu_offload_gb). Values follow the flags and the simulated memory plan.
    """
    common = {"block_size": str(block_size), "cache_dtype": cache_dtype,
              "enable_prefix_caching": str(enable_prefix_caching),
              "gpu_memory_utilization": str(gpu_memory_utilization), "num_gpu_blocks": str(num_gpu_blocks),
              "num_gpu_blocks_override": "None", "is_attention_free": "False", "sliding_window": "None"}
    if version < V032:
        return common | {"num_cpu_blocks": "0", "swap_space": "4", "cpu_offload_gb": "0"}
    return common | {
        "user_specified_block_size": str(user_block_size), "kv_cache_layout": "None", "prefix_match_unit": "None",
        "prefix_caching_hash_algo": "sha256", "prefix_cache_retention_interval": "0",
        "kv_cache_dtype_skip_layers": "[]", "mamba_page_size_padded": "None", "skip_page_size_padded": "None",
        "mamba_block_size": "None", "mamba_cache_dtype": "auto", "mamba_ssm_cache_dtype": "auto",
        "mamba_cache_mode": "none", "enable_mamba_shared_prefix_checkpoint": "False", "replayssm_buffer_len": "16",
        "use_replayssm": "False", "use_kda_recoverssm": "False", "num_cpu_blocks": "None",
        "effective_attention_block_size": str(block_size), "kv_cache_size_tokens": str(kv_tokens),
        "kv_cache_max_concurrency": str(round(kv_tokens / max(max_model_len, 1), 2)),
        "hash_block_size": str(block_size), "cache_hit_alignment_tokens": str(block_size),
        "kv_sharing_fast_prefill": "False", "swa_bounded_replay": "True", "kv_cache_memory_bytes": "None",
        "kv_offloading_size": "None", "kv_offloading_backend": "native", "_block_size_resolved": "True",
    }


class VllmMetrics:
    """The engine families of one served model; one series per data-parallel engine (label engine="0", "1"…).

    Families are registered in vLLM 0.32's order (spec decode, perf, scheduler gauges, counters, histograms,
    cache_config_info, then the HTTP instrumentator's), children value-major (every engine for one reason, then
    the next reason), so the page reads like a real one line for line. With `page_registry` (a multiprocess
    registry, see promdir.py) the page is rendered from it instead, as vLLM does with more than one API server:
    no process/python families and no `_created` samples there.
    """

    def __init__(self, *, model_name: str, version: tuple[int, int], max_model_len: int, spec_decode: bool,
                 cache_info: dict[str, str], engines: int = 1, page_registry: CollectorRegistry | None = None):
        self.registry = CollectorRegistry(auto_describe=True)
        if page_registry is None:  # a single API server: prometheus_client's default collectors, in its order
            gc_collector.GCCollector(registry=self.registry)
            platform_collector.PlatformCollector(registry=self.registry)
            process_collector.ProcessCollector(registry=self.registry)
        self.page_registry = page_registry or self.registry
        self.version = version
        self.old_tpot = version < (0, 13)
        self.new_itl = version >= (0, 11)
        self._model = model_name
        self._labels = ("model_name", "engine")
        self._ids = [str(e) for e in range(engines)]
        self._spec_and_perf(spec_decode)
        self._gauges()
        for e in range(engines):  # every engine's series from the start (an unset multiprocess gauge is not shown)
            self.set_gauges(0, 0, 0.0, e)
        self._counters()
        self._histograms(max_model_len)
        info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                     (*sorted(cache_info), "engine"), registry=self.registry, multiprocess_mode="mostrecent")
        for e in self._ids:
            info.labels(**cache_info, engine=e).set(1)
        # not vLLM's: says on the page itself (and in Grafana) that this server is simulated
        Gauge("lynxtop_simulated_info", "This vLLM server is SIMULATED by lynxtop: no model, no GPU.",
              ("imitated_version",), registry=self.registry,
              multiprocess_mode="mostrecent").labels(".".join(map(str, version))).set(1)
        self.http = HttpMetrics(self.registry)

    def render(self) -> bytes:
        """The /metrics body."""
        return generate_latest(self.page_registry)

    # ------------------------------------------------------------------ family builders (children by engine)

    def _gauge(self, name: str, doc: str) -> list[Any]:
        fam = Gauge(name, doc, self._labels, registry=self.registry, multiprocess_mode="mostrecent")
        return [fam.labels(self._model, e) for e in self._ids]

    def _counter(self, name: str, doc: str) -> list[Any]:
        fam = Counter(name, doc, self._labels, registry=self.registry)
        return [fam.labels(self._model, e) for e in self._ids]

    def _hist(self, name: str, doc: str, buckets: Any) -> list[Any]:
        fam = Histogram(name, doc, self._labels, buckets=buckets, registry=self.registry)
        return [fam.labels(self._model, e) for e in self._ids]

    def _by(self, fam: Any, values: tuple[str, ...]) -> list[dict[str, Any]]:
        """Children per engine and extra label value, created value-major as vLLM does."""
        children = {(v, e): fam.labels(self._model, e, v) for v in values for e in self._ids}
        return [{v: children[v, e] for v in values} for e in self._ids]

    def _gauge_by(self, name: str, doc: str, label: str, values: tuple[str, ...]) -> list[dict[str, Any]]:
        return self._by(Gauge(name, doc, (*self._labels, label), registry=self.registry,
                              multiprocess_mode="mostrecent"), values)

    def _counter_by(self, name: str, doc: str, label: str, values: tuple[str, ...]) -> list[dict[str, Any]]:
        return self._by(Counter(name, doc, (*self._labels, label), registry=self.registry), values)

    def _spec_and_perf(self, spec_decode: bool) -> None:
        counter = self._counter
        self.spec = None
        if spec_decode:
            self.spec = (counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
                         counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
                         counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."))
        self.perf = None
        if self.version >= V032:
            self.perf = (
                counter("vllm:estimated_flops_per_gpu",
                        "Estimated number of floating point operations per GPU (for Model Flops Utilization "
                        "calculations)."),
                counter("vllm:estimated_read_bytes_per_gpu",
                        "Estimated number of bytes read from memory per GPU (for Model Flops Utilization "
                        "calculations)."),
                counter("vllm:estimated_write_bytes_per_gpu",
                        "Estimated number of bytes written to memory per GPU (for Model Flops Utilization "
                        "calculations)."),
            )

    def _gauges(self) -> None:
        version, gauge = self.version, self._gauge
        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.waiting_by_reason = None
        if version >= (0, 12):
            self.waiting_by_reason = self._gauge_by("vllm:num_requests_waiting_by_reason",
                                                    "Number of waiting requests by reason. Reason labels: "
                                                    "'capacity' = waiting for scheduling capacity; 'deferred' = "
                                                    "deferred by transient constraints (LoRA budget, KV transfer, "
                                                    "blocked status). Sum of all reasons equals "
                                                    "vllm:num_requests_waiting.", "reason",
                                                    ("capacity", "deferred"))
        self.sleep_state = None
        if version >= (0, 11):
            self.sleep_state = self._gauge_by("vllm:engine_sleep_state",
                                              "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 "
                                              "means engine is awake; weights_offloaded = 1 means sleep level 1; "
                                              "discard_all = 1 means sleep level 2.",
                                              "sleep_state", SLEEP_STATES)
            for per in self.sleep_state:  # every state set, as vLLM does (an unset multiprocess gauge is not shown)
                for state, child in per.items():
                    child.set(1 if state == "awake" else 0)
        self.kv_usage = [gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")]
        if version < (0, 12):  # old cache names printed alongside the new ones until 0.12
            self.kv_usage.append(gauge("vllm:gpu_cache_usage_perc",
                                       "GPU KV-cache usage. 1 means 100 percent usage. DEPRECATED: use "
                                       "vllm:kv_cache_usage_perc."))

    def _counters(self) -> None:
        """The cache counters, then the token and request counters. The simulator has no KV connector, no
        multi-modal input, no offloading tier and no queue limit, so those series stay at 0 as they do on a
        real server configured the same way."""
        version, counter = self.version, self._counter
        new = version >= V032
        self.prefix_queries = [counter("vllm:prefix_cache_queries",
                                       "Prefix cache queries, in terms of number of queried tokens.")]
        self.prefix_hits = [counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached "
                                                              "tokens.")]
        if version < (0, 12):
            self.prefix_queries.append(counter("vllm:gpu_prefix_cache_queries",
                                               "GPU prefix cache queries. DEPRECATED: use vllm:prefix_cache_queries."))
            self.prefix_hits.append(counter("vllm:gpu_prefix_cache_hits",
                                            "GPU prefix cache hits. DEPRECATED: use vllm:prefix_cache_hits."))
        if new:
            self.external_queries = counter("vllm:external_prefix_cache_queries",
                                            "External prefix cache queries from KV connector cross-instance cache "
                                            "sharing, in terms of number of queried tokens.")
            self.external_hits = counter("vllm:external_prefix_cache_hits",
                                         "External prefix cache hits from KV connector cross-instance cache "
                                         "sharing, in terms of number of cached tokens.")
            self.mm_queries = counter("vllm:mm_cache_queries",
                                      "Multi-modal cache queries, in terms of number of queried items.")
            self.mm_hits = counter("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.by_source = self.cached_by_source = self.prompt_tokens_cached = None
        if new:
            self.by_source = self._counter_by("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.",
                                              "source", PROMPT_SOURCES)
        if version >= (0, 12):
            self.prompt_tokens_cached = counter("vllm:prompt_tokens_cached",
                                                "Number of cached prompt tokens (local + external).")
        if new:
            self.cached_by_source = self._counter_by(
                "vllm:prompt_tokens_cached_by_source",
                "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded "
                "to DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at "
                "admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
                "source", CACHE_HIT_SOURCES)
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.success = self._counter_by("vllm:request_success", "Count of successfully processed requests.",
                                        "finished_reason", FINISH_REASONS_032 if new else FINISH_REASONS)
        if new:
            rejections = Counter("vllm:admission_rejections",
                                 "Number of admission attempts rejected by a queue limit, by reason.",
                                 ("model_name", "reason"), registry=self.registry)  # no engine label, as in vLLM
            self.admission_rejections = {r: rejections.labels(self._model, r) for r in ADMISSION_REASONS}

    def _histograms(self, max_model_len: int) -> None:
        hist = self._hist
        tokens_buckets = build_1_2_5_buckets(max_model_len)
        self.req_prompt = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens_buckets)
        self.req_gen = hist("vllm:request_generation_tokens", "Number of generation tokens processed.",
                            tokens_buckets)
        self.iteration_tokens = hist("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                                     ITERATION_TOKENS_BUCKETS)
        self.req_max_gen = hist("vllm:request_max_num_generation_tokens",
                                "Histogram of maximum number of requested generation tokens.", tokens_buckets)
        self.params_n = hist("vllm:request_params_n", "Histogram of the n request parameter.", PARAMS_N_BUCKETS)
        self.params_max_tokens = hist("vllm:request_params_max_tokens",
                                      "Histogram of the max_tokens request parameter.", tokens_buckets)
        self.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                         TTFT_BUCKETS)
        self.itl: list[list[Any]] = []
        if self.new_itl:
            self.itl.append(hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                                 ITL_BUCKETS))
        if self.old_tpot:
            self.itl.append(hist("vllm:time_per_output_token_seconds",
                                 "Histogram of time per output token in seconds. DEPRECATED: use "
                                 "vllm:inter_token_latency_seconds.", ITL_BUCKETS))
        self.tpot = None
        if self.new_itl:
            self.tpot = hist("vllm:request_time_per_output_token_seconds",
                             "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                        REQUEST_LATENCY_BUCKETS)
        self.queue = hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                          REQUEST_LATENCY_BUCKETS)
        self.inference = hist("vllm:request_inference_time_seconds",
                              "Histogram of time spent in RUNNING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.prefill = hist("vllm:request_prefill_time_seconds",
                            "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS)
        self.decode = hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
                           REQUEST_LATENCY_BUCKETS)
        self.req_preemptions = self.req_prefill_computed = None
        if self.version >= V032:
            self.req_preemptions = hist("vllm:request_num_preemptions",
                                        "Histogram of the number of times a request was preempted.",
                                        REQUEST_NUM_PREEMPTIONS_BUCKETS)
            self.req_prefill_computed = hist("vllm:request_prefill_kv_computed_tokens",
                                             "Histogram of new KV tokens computed during prefill (excluding cached "
                                             "tokens).", tokens_buckets)

    # ------------------------------------------------------------------ updates (e = data-parallel engine)

    def set_gauges(self, running: int, waiting: int, kv: float, e: int = 0, deferred: int = 0) -> None:
        """`deferred`: of the waiting requests, those held whatever the room (--sim-param remote_kv_wait_s); the
        by-reason family adds up to `waiting`, as vLLM's does."""
        self.running[e].set(running)
        self.waiting[e].set(waiting)
        if self.waiting_by_reason is not None:
            deferred = min(max(deferred, 0), waiting)
            self.waiting_by_reason[e]["capacity"].set(waiting - deferred)
            self.waiting_by_reason[e]["deferred"].set(deferred)
        for g in self.kv_usage:
            g[e].set(kv)

    def on_step(self, m: dict[str, Any], e: int = 0) -> None:
        """Fold one engine step message (see engine.send_step) into the families."""
        self.set_gauges(m.get("running", 0), m.get("waiting", 0), m.get("kv", 0.0), e, m.get("deferred", 0))
        if m.get("it"):
            self.iteration_tokens[e].observe(m["it"])
        if m.get("prompt"):
            self.prompt_tokens[e].inc(m["prompt"])
        if m.get("gen"):
            self.generation_tokens[e].inc(m["gen"])
        if m.get("pre"):
            self.preemptions[e].inc(m["pre"])
        for c in self.prefix_queries:
            c[e].inc(m.get("pq", 0))
        for c in self.prefix_hits:
            c[e].inc(m.get("ph", 0))
        if self.by_source is not None and m.get("prompt"):
            cached = min(m.get("pc", 0), m["prompt"])
            self.by_source[e]["local_compute"].inc(m["prompt"] - cached)
            self.by_source[e]["local_cache_hit"].inc(cached)
        if self.cached_by_source is not None and m.get("ph"):
            self.cached_by_source[e]["device"].inc(m["ph"])  # the only tier the simulator has
        if self.perf is not None:
            for c, key in zip(self.perf, ("fl", "rb", "wb"), strict=True):
                if m.get(key):
                    c[e].inc(m[key])
        if self.spec is not None and m.get("sd"):
            self.spec[0][e].inc(m["sd"])
            self.spec[1][e].inc(m.get("sdt", 0))
            self.spec[2][e].inc(m.get("sa", 0))
        for _rid, ttft in m.get("first", ()):
            self.ttft[e].observe(ttft)
        for x in m.get("itl", ()):
            for h in self.itl:
                h[e].observe(x)
        for f in m.get("fin", ()):
            self.on_finished(f, e)

    def on_finished(self, f: dict[str, Any], e: int = 0) -> None:
        reason = f["reason"] if f["reason"] in self.success[e] else "abort"
        self.success[e][reason].inc()
        if reason == "abort" and not f.get("generation_tokens"):
            return
        self.e2e[e].observe(f["e2e_s"])
        self.queue[e].observe(f["queue_s"])
        self.inference[e].observe(f["inference_s"])
        self.prefill[e].observe(f["prefill_s"])
        self.decode[e].observe(f["decode_s"])
        self.req_prompt[e].observe(f["prompt_tokens"])
        self.req_gen[e].observe(f["generation_tokens"])
        self.req_max_gen[e].observe(f["max_tokens"])
        self.params_n[e].observe(1)
        self.params_max_tokens[e].observe(f["max_tokens"])
        if self.tpot is not None and f["generation_tokens"] > 1:
            self.tpot[e].observe(f["tpot_s"])
        if self.req_preemptions is not None and self.req_prefill_computed is not None:
            self.req_preemptions[e].observe(f.get("preemptions", 0))
            self.req_prefill_computed[e].observe(max(f["prompt_tokens"] - f.get("cached_tokens", 0), 0))
        if self.prompt_tokens_cached is not None and f.get("cached_tokens"):
            self.prompt_tokens_cached[e].inc(f["cached_tokens"])
