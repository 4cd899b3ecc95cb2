"""Which metric columns the agent's /metrics page exports, under which names: derived from the column contract.

A column added to `columns.py` reaches the store, the CSV, the API and /metrics at once: its Prometheus name,
unit scale and kind follow from its name's unit suffix (`_pct` -> `_ratio` x0.01, `_mhz` -> `_hertz` x1e6, ...)
and its help is its description. Names that fleets already scrape are kept through `_RENAMED`; a column that is
not exported as a plain series says why in `NOT_EXPORTED` (a test fails on a column that is neither).
"""

from __future__ import annotations

from dataclasses import dataclass

from lynxtop.contract.columns import GPU_METRICS, HOST_METRICS, NVLINK_METRICS, SERVING_METRICS

TABLES: dict[str, tuple[tuple[str, str, str], ...]] = {
    "gpu": GPU_METRICS, "host": HOST_METRICS, "serving": SERVING_METRICS, "nvlink": NVLINK_METRICS,
}


@dataclass(frozen=True)
class Exported:
    """One column as one Prometheus family: `lynxtop_{table}_{suffix}` (a counter's name ends in `_total`)."""

    table: str
    column: str
    suffix: str
    help: str
    scale: float
    counter: bool = False

    @property
    def name(self) -> str:
        return f"lynxtop_{self.table}_{self.suffix}"


# (column unit suffix, metric unit suffix, scale to base units, counter?), first match wins
_UNITS: tuple[tuple[str, str, float, bool], ...] = (
    ("_bytes_per_s", "_bytes_per_second", 1.0, False),
    ("_per_s", "_per_second", 1.0, False),
    ("_pct", "_ratio", 0.01, False),
    ("_mhz", "_hertz", 1e6, False),
    ("_ms", "_seconds", 1e-3, False),
    ("_j", "_joules_total", 1.0, True),
    ("_w", "_watts", 1.0, False),
    ("_c", "_celsius", 1.0, False),
)

# Names that differ from the rule, kept because dashboards, rules and alerts already use them:
# (table, column) -> (metric suffix, scale, counter?)
_RENAMED: dict[tuple[str, str], tuple[str, float, bool]] = {
    ("gpu", "util_gpu_pct"): ("utilization_ratio", 0.01, False),
    ("gpu", "util_mem_pct"): ("memory_utilization_ratio", 0.01, False),
    ("gpu", "dram_bw_pct"): ("dram_bandwidth_ratio", 0.01, False),
    ("gpu", "temp_c"): ("temperature_celsius", 1.0, False),
    ("gpu", "ecc_corrected"): ("ecc_corrected_errors_total", 1.0, True),
    ("gpu", "ecc_uncorrected"): ("ecc_uncorrected_errors_total", 1.0, True),
    ("host", "cpu_pct"): ("cpu_utilization_ratio", 0.01, False),
    ("host", "net_rx_bytes_per_s"): ("network_receive_bytes_per_second", 1.0, False),
    ("host", "net_tx_bytes_per_s"): ("network_transmit_bytes_per_second", 1.0, False),
    ("host", "vllm_procs"): ("vllm_processes", 1.0, False),
    # the vLLM tree's CPU is "100 = one core": exported in cores, as process_cpu_seconds_total's rate reads
    ("host", "vllm_cpu_pct"): ("vllm_cpu_cores", 0.01, False),
    ("host", "vllm_api_cpu_pct"): ("vllm_api_cpu_cores", 0.01, False),
    ("host", "vllm_engine_cpu_pct"): ("vllm_engine_cpu_cores", 0.01, False),
    ("host", "vllm_workers_cpu_pct"): ("vllm_workers_cpu_cores", 0.01, False),
    ("host", "vllm_rss_bytes"): ("vllm_resident_memory_bytes", 1.0, False),
    ("host", "vllm_api_rss_bytes"): ("vllm_api_resident_memory_bytes", 1.0, False),
    ("host", "vllm_engine_rss_bytes"): ("vllm_engine_resident_memory_bytes", 1.0, False),
    ("host", "vllm_workers_rss_bytes"): ("vllm_workers_resident_memory_bytes", 1.0, False),
}

_LATENCY_NOTE = ("a percentile over the scraper's window: exported as lynxtop_serving_{series}_{stat}_seconds "
                 "beside the agent-lifetime histogram lynxtop_serving_{series}_seconds")
_TICK_NOTE = "a per-tick delta: exported as the agent-lifetime counter lynxtop_serving_{name}_total"

# (table, column) -> why the column is not one plain family (most are exported in another form)
NOT_EXPORTED: dict[tuple[str, str], str] = {
    ("gpu", "throttle_reasons"): "a bitmask: exported one series per reason, lynxtop_gpu_clock_throttle_reasons",
    ("host", "cpu_per_core_pct"): "TEXT (a JSON array per tick): per-core series belong to node_exporter",
    ("serving", "run_id"): "exported from the status as lynxtop_serving_run_id and lynxtop_serving_info",
    ("serving", "scrape_errors"): "exported as the counter lynxtop_serving_scrape_errors_total",
    ("serving", "requests_finished"): _TICK_NOTE.replace("{name}", "requests") + "{finished_reason}",
    ("serving", "prompt_tokens"): _TICK_NOTE.replace("{name}", "prompt_tokens"),
    ("serving", "generation_tokens"): _TICK_NOTE.replace("{name}", "generation_tokens"),
    ("serving", "preemptions"): _TICK_NOTE.replace("{name}", "preemptions"),
    # the `{series}_lowest_bucket_ms` bounds are plain gauges (lynxtop_serving_{series}_lowest_bucket_seconds): a
    # percentile gauge at or below its series' bound is only known to be at most it (contract/quantile.py)
    **{("serving", name): _LATENCY_NOTE for name, _, _ in SERVING_METRICS
       if name.endswith("_ms") and not name.endswith("_lowest_bucket_ms")},
    # per-link rates: the totals are lynxtop_gpu_nvlink_{tx,rx}_bytes_per_second; 36 series per GPU stay in the store
    **{("nvlink", name): "per-link detail stays in the store; /metrics has the per-GPU totals"
       for name, _, _ in NVLINK_METRICS},
}


def _derive(table: str, column: str) -> tuple[str, float, bool]:
    if (table, column) in _RENAMED:
        return _RENAMED[(table, column)]
    base = f"memory_{column[4:]}" if column.startswith("mem_") else column
    for unit, metric_unit, scale, counter in _UNITS:
        if base.endswith(unit):
            return base[: -len(unit)] + metric_unit, scale, counter
    return base, 1.0, False


def exported(table: str) -> tuple[Exported, ...]:
    """The plain families of one table's columns, in column order."""
    out = []
    for column, _sql, desc in TABLES[table]:
        if (table, column) in NOT_EXPORTED:
            continue
        suffix, scale, counter = _derive(table, column)
        out.append(Exported(table, column, suffix, desc[:1].upper() + desc[1:], scale, counter))
    return tuple(out)
