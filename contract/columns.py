"""The metric columns of the history store: the one contract between samplers, writer, readers and export.

Samplers produce plain dicts keyed by these names (a missing reading is None -> NULL, never 0). Units are
in the names. Per-GPU metrics are INTEGER on purpose: SQLite stores small integers in 1-2 bytes and a
REAL in 8, and 1 % / 1 W / 1 MHz resolution is what an operator reads; the rollups keep REAL averages.
"""

from __future__ import annotations

# (name, SQL type, short description). Order is the column order on disk and in CSV.
GPU_METRICS: tuple[tuple[str, str, str], ...] = (
    ("lost", "INTEGER", "1 when NVML reported the GPU lost this tick"),
    ("util_gpu_pct", "INTEGER", "NVML utilization.gpu: share of time any kernel ran (coarse)"),
    ("util_mem_pct", "INTEGER", "NVML utilization.memory: share of time memory was read or written"),
    ("sm_active_pct", "INTEGER", "GPM SM activity (NULL where GPM is absent)"),
    ("sm_occupancy_pct", "INTEGER", "GPM SM occupancy"),
    ("tensor_active_pct", "INTEGER", "GPM any-tensor-core activity"),
    ("dram_bw_pct", "INTEGER", "GPM DRAM bandwidth utilization"),
    ("fp16_active_pct", "INTEGER", "GPM FP16 pipe activity"),
    ("fp32_active_pct", "INTEGER", "GPM FP32 pipe activity"),
    ("pcie_tx_bytes_per_s", "INTEGER", "PCIe TX (GPM)"),
    ("pcie_rx_bytes_per_s", "INTEGER", "PCIe RX (GPM)"),
    ("nvlink_tx_bytes_per_s", "INTEGER", "NVLink TX total (GPM, or field counters without GPM)"),
    ("nvlink_rx_bytes_per_s", "INTEGER", "NVLink RX total"),
    ("mem_used_bytes", "INTEGER", "device memory used"),
    ("mem_total_bytes", "INTEGER", "device memory total"),
    ("mem_reserved_bytes", "INTEGER", "device memory reserved by the driver"),
    ("power_w", "INTEGER", "power draw"),
    ("power_limit_w", "INTEGER", "enforced power limit"),
    ("energy_j", "INTEGER", "energy counter since driver load (slow cadence)"),
    ("temp_c", "INTEGER", "GPU temperature"),
    ("sm_clock_mhz", "INTEGER", "SM clock"),
    ("mem_clock_mhz", "INTEGER", "memory clock"),
    ("throttle_reasons", "INTEGER", "clock event reasons bitmask (NVML nvmlClocksEventReason*)"),
    ("ecc_corrected", "INTEGER", "volatile corrected ECC errors (slow cadence)"),
    ("ecc_uncorrected", "INTEGER", "volatile uncorrected ECC errors (slow cadence)"),
    ("remapped_rows_pending", "INTEGER", "1 when a row remap is pending (slow cadence)"),
    ("remapped_rows_failed", "INTEGER", "1 when a row remap failed (slow cadence)"),
)

NVLINK_MAX_LINKS = 18
# Per-link NVLink rates, one wide row per GPU and tick, written only for GPUs that have links.
NVLINK_METRICS: tuple[tuple[str, str, str], ...] = tuple(
    (f"l{i}_{d}_bytes_per_s", "INTEGER", f"NVLink link {i} {d.upper()}")
    for i in range(NVLINK_MAX_LINKS)
    for d in ("tx", "rx")
)

HOST_METRICS: tuple[tuple[str, str, str], ...] = (
    ("cpu_pct", "REAL", "all cores, 0-100"),
    ("cpu_per_core_pct", "TEXT", "JSON array of per-core percentages"),
    ("load1", "REAL", "1-minute load average"),
    ("load5", "REAL", "5-minute load average"),
    ("load15", "REAL", "15-minute load average"),
    ("mem_used_bytes", "INTEGER", "host memory used"),
    ("mem_available_bytes", "INTEGER", "host memory available"),
    ("mem_total_bytes", "INTEGER", "host memory total"),
    ("swap_used_bytes", "INTEGER", "swap used"),
    ("swap_total_bytes", "INTEGER", "swap total"),
    ("disk_free_bytes", "INTEGER", "free space on the database's volume"),
    ("disk_total_bytes", "INTEGER", "size of the database's volume"),
    ("net_rx_bytes_per_s", "INTEGER", "all interfaces but loopback"),
    ("net_tx_bytes_per_s", "INTEGER", "all interfaces but loopback"),
    ("vllm_procs", "INTEGER", "processes in the supervised vLLM tree"),
    ("vllm_cpu_pct", "REAL", "CPU of the vLLM tree (100 = one core)"),
    ("vllm_rss_bytes", "INTEGER", "RSS of the vLLM tree"),
    ("vllm_api_cpu_pct", "REAL", "API server processes"),
    ("vllm_api_rss_bytes", "INTEGER", "API server processes"),
    ("vllm_engine_cpu_pct", "REAL", "VLLM::EngineCore processes"),
    ("vllm_engine_rss_bytes", "INTEGER", "VLLM::EngineCore processes"),
    ("vllm_workers_cpu_pct", "REAL", "VLLM::Worker processes"),
    ("vllm_workers_rss_bytes", "INTEGER", "VLLM::Worker processes"),
)

# prefill and decode: vLLM's request_prefill/decode_time histograms; a page without them gets
# their means derived (TTFT - queue, e2e - TTFT) and no percentiles, and `phase_times_derived` says so
LATENCY_SERIES = ("ttft", "itl", "tpot", "e2e", "queue", "prefill", "decode")
LATENCY_STATS = ("p50", "p90", "p99", "mean")


def lowest_bucket_column(series: str) -> str:
    """The column holding the upper bound, in ms, of the lowest bucket of a latency series' histogram."""
    return f"{series}_lowest_bucket_ms"


SERVING_METRICS: tuple[tuple[str, str, str], ...] = (
    ("run_id", "INTEGER", "run this sample belongs to"),
    ("scrape_ok", "INTEGER", "1 when /metrics was read and parsed"),
    ("scrape_errors", "INTEGER", "failed scrapes since the agent started"),
    ("requests_per_s", "REAL", "finished requests per second"),
    ("prompt_tokens_per_s", "REAL", "prefill tokens per second"),
    ("generation_tokens_per_s", "REAL", "generated tokens per second"),
    ("requests_finished", "INTEGER", "requests finished during this tick"),
    ("prompt_tokens", "INTEGER", "prompt tokens during this tick"),
    ("generation_tokens", "INTEGER", "generated tokens during this tick"),
    ("requests_running", "INTEGER", "requests running"),
    ("requests_waiting", "INTEGER", "requests waiting"),
    ("kv_cache_usage_pct", "REAL", "KV cache usage 0-100"),
    ("preemptions", "INTEGER", "preemptions during this tick"),
    ("prefix_cache_hit_pct", "REAL", "prefix cache hits / queries over the window"),
    ("spec_decode_acceptance_pct", "REAL", "accepted / draft tokens over the window"),
    ("phase_times_derived", "INTEGER", "prefill/decode times: 0 read from vLLM's request_prefill/decode_time "
     "histograms, 1 derived as means (TTFT - queue, e2e - TTFT) from a page without them"),
) + tuple(
    (f"{series}_{stat}_ms", "REAL", f"{series.upper()} {stat} over the sliding window")
    for series in LATENCY_SERIES
    for stat in LATENCY_STATS
) + tuple(
    # a percentile at or below it lies in that bucket and is only known to be at most it (contract/quantile.py)
    (lowest_bucket_column(series), "REAL", f"upper bound of the lowest bucket of vLLM's {series.upper()} histogram "
     "(NULL without percentiles): a percentile at or below it is known only to be at most this bound")
    for series in LATENCY_SERIES
)


def names(metrics: tuple[tuple[str, str, str], ...]) -> tuple[str, ...]:
    return tuple(m[0] for m in metrics)
