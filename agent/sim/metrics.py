"""vLLM's /metrics page for the simulator: exact names, types, labels and default buckets.

Built with prometheus_client in a private CollectorRegistry, as vLLM does, so the text (the `_total` suffix
of counters, the `*_created` families, `# HELP`/`# TYPE` lines) is byte-for-byte the same machinery. Which
families exist depends on the imitated version (`--sim-vllm-version`): 0.10 still prints the old names
(`gpu_cache_usage_perc`, `gpu_prefix_cache_*`, `time_per_output_token_seconds`) and lacks the newer ones.
The version gates are approximate where vLLM's history is fuzzy; the renames match the reference notes.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    gc_collector,
    platform_collector,
    process_collector,
)

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
HTTP_DURATION_BUCKETS = (0.1, 0.5, 1.0)
FINISH_REASONS = ("stop", "length", "abort")
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


class VllmMetrics:
    """The engine families of one served model (one engine, label engine="0")."""

    def __init__(self, *, model_name: str, version: tuple[int, int], max_model_len: int, spec_decode: bool,
                 cache_info: dict[str, str]):
        self.registry = CollectorRegistry(auto_describe=True)
        process_collector.ProcessCollector(registry=self.registry)
        gc_collector.GCCollector(registry=self.registry)
        platform_collector.PlatformCollector(registry=self.registry)
        self.version = version
        old = version < (0, 12)  # old cache names printed alongside the new ones until 0.12
        self.old_tpot = version < (0, 13)
        self.new_itl = version >= (0, 11)
        labels = ("model_name", "engine")
        lv = (model_name, "0")
        reg = self.registry

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, labels, registry=reg, multiprocess_mode="mostrecent").labels(*lv)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, labels, registry=reg).labels(*lv)

        def hist(name: str, doc: str, buckets: Any) -> Any:
            return Histogram(name, doc, labels, buckets=buckets, registry=reg).labels(*lv)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.waiting_by_reason = None
        if version >= (0, 12):
            fam = Gauge("vllm:num_requests_waiting_by_reason", "Number of requests waiting, by reason.",
                        (*labels, "reason"), registry=reg, multiprocess_mode="mostrecent")
            self.waiting_by_reason = {r: fam.labels(*lv, r) for r in ("capacity", "deferred")}
        self.sleep_state = None
        if version >= (0, 11):
            fam = Gauge("vllm:engine_sleep_state", "Engine sleep state; awake = 0 means the engine is sleeping.",
                        (*labels, "sleep_state"), registry=reg, multiprocess_mode="mostrecent")
            self.sleep_state = {s: fam.labels(*lv, s) for s in SLEEP_STATES}
            self.sleep_state["awake"].set(1)
        self.kv_usage = [gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")]
        if old:
            self.kv_usage.append(gauge("vllm:gpu_cache_usage_perc",
                                       "GPU KV-cache usage. 1 means 100 percent usage. DEPRECATED: use "
                                       "vllm:kv_cache_usage_perc."))
        info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                     (*sorted(cache_info), "engine"), registry=reg, multiprocess_mode="mostrecent")
        info.labels(**cache_info, engine="0").set(1)

        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.prompt_tokens_cached = None
        if version >= (0, 12):
            self.prompt_tokens_cached = counter("vllm:prompt_tokens_cached",
                                                "Number of cached prompt tokens (local prefix cache hits).")
        fam = Counter("vllm:request_success", "Count of successfully processed requests.",
                      (*labels, "finished_reason"), registry=reg)
        self.success = {r: fam.labels(*lv, r) for r in FINISH_REASONS}
        self.prefix_queries = [counter("vllm:prefix_cache_queries",
                                       "Prefix cache queries, in terms of number of queried tokens.")]
        self.prefix_hits = [counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached "
                                                              "tokens.")]
        if old:
            self.prefix_queries.append(counter("vllm:gpu_prefix_cache_queries",
                                               "GPU prefix cache queries. DEPRECATED: use vllm:prefix_cache_queries."))
            self.prefix_hits.append(counter("vllm:gpu_prefix_cache_hits",
                                            "GPU prefix cache hits. DEPRECATED: use vllm:prefix_cache_hits."))
        self.spec = None
        if spec_decode:
            self.spec = (counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
                         counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
                         counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."))

        tokens_buckets = build_1_2_5_buckets(max_model_len)
        self.iteration_tokens = hist("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                                     ITERATION_TOKENS_BUCKETS)
        self.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                         TTFT_BUCKETS)
        self.itl: list[Any] = []
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
        self.req_prompt = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens_buckets)
        self.req_gen = hist("vllm:request_generation_tokens", "Number of generation tokens processed.",
                            tokens_buckets)
        self.req_max_gen = hist("vllm:request_max_num_generation_tokens",
                                "Histogram of maximum number of requested generation tokens.", tokens_buckets)
        self.params_n = hist("vllm:request_params_n", "Histogram of the n request parameter.", PARAMS_N_BUCKETS)
        self.params_max_tokens = hist("vllm:request_params_max_tokens",
                                      "Histogram of the max_tokens request parameter.", tokens_buckets)

        # not vLLM's: says on the page itself (and in Grafana) that this server is simulated
        Gauge("lynxtop_simulated_info", "This vLLM server is SIMULATED by lynxtop: no model, no GPU.",
              ("imitated_version",), registry=reg).labels(".".join(map(str, version))).set(1)

        # what prometheus-fastapi-instrumentator adds to vLLM's page
        self.http_requests = Counter("http_requests", "Total number of requests by method, status and handler.",
                                     ("handler", "method", "status"), registry=reg)
        self.http_duration = Histogram("http_request_duration_seconds",
                                       "Latency with only few buckets by handler. Made to be only used if "
                                       "aggregation by handler is important.", ("handler", "method"),
                                       buckets=HTTP_DURATION_BUCKETS, registry=reg)

    # ------------------------------------------------------------------ updates

    def set_gauges(self, running: int, waiting: int, kv: float) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        if self.waiting_by_reason is not None:
            self.waiting_by_reason["capacity"].set(waiting)
            self.waiting_by_reason["deferred"].set(0)
        for g in self.kv_usage:
            g.set(kv)

    def set_sleeping(self, sleeping: bool) -> None:
        if self.sleep_state is not None:
            self.sleep_state["awake"].set(0 if sleeping else 1)

    def on_step(self, m: dict[str, Any]) -> None:
        """Fold one engine step message (see engine.send_step) into the families."""
        self.set_gauges(m.get("running", 0), m.get("waiting", 0), m.get("kv", 0.0))
        if m.get("it"):
            self.iteration_tokens.observe(m["it"])
        if m.get("prompt"):
            self.prompt_tokens.inc(m["prompt"])
        if m.get("gen"):
            self.generation_tokens.inc(m["gen"])
        if m.get("pre"):
            self.preemptions.inc(m["pre"])
        for c in self.prefix_queries:
            c.inc(m.get("pq", 0))
        for c in self.prefix_hits:
            c.inc(m.get("ph", 0))
        if self.spec is not None and m.get("sd"):
            self.spec[0].inc(m["sd"])
            self.spec[1].inc(m.get("sdt", 0))
            self.spec[2].inc(m.get("sa", 0))
        for _rid, ttft in m.get("first", ()):
            self.ttft.observe(ttft)
        for x in m.get("itl", ()):
            for h in self.itl:
                h.observe(x)
        for f in m.get("fin", ()):
            self.on_finished(f)

    def on_finished(self, f: dict[str, Any]) -> None:
        reason = f["reason"] if f["reason"] in self.success else "abort"
        self.success[reason].inc()
        if reason == "abort" and not f.get("generation_tokens"):
            return
        self.e2e.observe(f["e2e_s"])
        self.queue.observe(f["queue_s"])
        self.inference.observe(f["inference_s"])
        self.prefill.observe(f["prefill_s"])
        self.decode.observe(f["decode_s"])
        self.req_prompt.observe(f["prompt_tokens"])
        self.req_gen.observe(f["generation_tokens"])
        self.req_max_gen.observe(f["max_tokens"])
        self.params_n.observe(1)
        self.params_max_tokens.observe(f["max_tokens"])
        if self.tpot is not None and f["generation_tokens"] > 1:
            self.tpot.observe(f["tpot_s"])
        if self.prompt_tokens_cached is not None and f.get("cached_tokens"):
            self.prompt_tokens_cached.inc(f["cached_tokens"])
