"""The vLLM metric families lynxtop reads, by quantity, and the sample names derived from them.

Owns only names: each quantity's preferred (newest) name first, then older names vLLM used for the same thing
(0.10 prints old and new, later versions drop the old ones). The parser (agent/metrics/page.py) selects lines by
these exact names; nothing else on a page is read. A family read per label value (BY_LABEL) has one name per value
read, `family|value`.
"""

from __future__ import annotations

# Each entry: preferred (newest) name first, then older names vLLM used for the same thing.
COUNTERS: dict[str, tuple[str, ...]] = {
    "requests": ("vllm:request_success_total",),
    "prompt_tokens": ("vllm:prompt_tokens_total",),
    "generation_tokens": ("vllm:generation_tokens_total",),
    "preemptions": ("vllm:num_preemptions_total",),
    "prefix_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "spec_drafted": ("vllm:spec_decode_num_draft_tokens_total",),
    "spec_accepted": ("vllm:spec_decode_num_accepted_tokens_total",),
}
# A gauge family read per value of one label: its series add up under "family|value" for a value listed here,
# "family|" for any other (never read). `vllm:num_requests_waiting_by_reason` (0.12+) splits the waiting requests
# into `capacity` and `deferred` (KV from a prefill node, a grammar compiling, a LoRA budget): only the deferred
# ones are read, the hang rule leaves them out (agent/serving/health.py); summed whole it would be `waiting`.
BY_LABEL: dict[str, tuple[str, frozenset[str]]] = {
    "vllm:num_requests_waiting_by_reason": ("reason", frozenset({"deferred"})),
}
GAUGES_SUM: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "deferred": ("vllm:num_requests_waiting_by_reason|deferred",),
}
GAUGES_MAX: dict[str, tuple[str, ...]] = {
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}
HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "tpot": ("vllm:request_time_per_output_token_seconds",),
    "e2e": ("vllm:e2e_request_latency_seconds",),
    "queue": ("vllm:request_queue_time_seconds",),
    "prefill": ("vllm:request_prefill_time_seconds",),
    "decode": ("vllm:request_decode_time_seconds",),
}
# Where a page lacks a phase's histogram, its mean is derived from two others: (phase, whole, part before it)
DERIVED_MEANS = (("prefill", "ttft", "queue"), ("decode", "e2e", "ttft"))
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


def sample_name(name: str) -> str:
    """The sample name a page writes for one of the names above (a per-label name's part before `|`)."""
    return name.partition("|")[0]


def by_label_name(family: str, value: str | None) -> str:
    """What a series of a BY_LABEL family adds up under, given its label's value (None: the label is absent)."""
    return f"{family}|{value}" if value in BY_LABEL[family][1] else family + "|"


HIST_NAMES = frozenset(n for ns in HISTOGRAMS.values() for n in ns)
SUM_NAMES = frozenset(sample_name(n) for ns in (*COUNTERS.values(), *GAUGES_SUM.values()) for n in ns)
MAX_NAMES = frozenset(n for ns in GAUGES_MAX.values() for n in ns)
COUNTER_NAMES = frozenset(n for ns in COUNTERS.values() for n in ns)
SERIES_NAMES = COUNTER_NAMES | frozenset(h + s for h in HIST_NAMES for s in ("_bucket", "_sum", "_count"))
# The names TYPE lines give the families we read: histograms by their base name, counters with and without
# `_total` (prometheus_client's text format writes it, OpenMetrics does not), gauges as sampled.
TYPED_FAMILIES = HIST_NAMES | SUM_NAMES | MAX_NAMES | frozenset(n[:-6] for n in COUNTER_NAMES if n.endswith("_total"))
GAUGE_NAMES = frozenset(sample_name(n) for ns in (*GAUGES_SUM.values(), *GAUGES_MAX.values()) for n in ns)
