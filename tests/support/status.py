"""The one status factory of the tests: a `Status` of a busy SIMULATED 8×H200 node serving DeepSeek-V4.1.

Every fake (the API's FakeController, the dashboard's FakeAgent) builds its status here, so the shape of a
status lives in `contract/status.py` and the sample values in this file only. The defaults are the dashboard's
fixed-clock node (its snapshot tests depend on them); a fake describes its own node through overrides, which
are JSON-shaped and go through `Status.from_json`, the same path as an answer on the wire.
"""

from __future__ import annotations

from typing import Any

from lynxtop.contract.columns import GPU_METRICS, HOST_METRICS, SERVING_METRICS, names
from lynxtop.contract.status import Status

T0 = 1_796_220_000_000  # 2026-12-02 14:00:00 UTC: a fixed clock for deterministic screens
GIB = 1024**3


def gpu_row(i: int, **over: Any) -> dict[str, Any]:
    """One GPU of the status, as JSON (identity and every GPU_METRICS column)."""
    row: dict[str, Any] = dict.fromkeys(names(GPU_METRICS))
    row.update(
        index=i, name="NVIDIA H200", uuid=f"GPU-fake-{i:04d}", pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
        arch="Hopper", gpm_supported=True, nvlink_count=18, lost=0, util_gpu_pct=100, util_mem_pct=40,
        sm_active_pct=60 + i, sm_occupancy_pct=30, tensor_active_pct=40 + i, dram_bw_pct=55, fp16_active_pct=0,
        fp32_active_pct=1, pcie_tx_bytes_per_s=1_000_000, pcie_rx_bytes_per_s=2_000_000,
        nvlink_tx_bytes_per_s=120 * 10**9, nvlink_rx_bytes_per_s=118 * 10**9, mem_used_bytes=130 * GIB,
        mem_total_bytes=141 * GIB, mem_reserved_bytes=GIB, power_w=550 + i, power_limit_w=700, energy_j=10**9,
        temp_c=60 + i, sm_clock_mhz=1980, mem_clock_mhz=3201, throttle_reasons=0, ecc_corrected=0,
        ecc_uncorrected=0, remapped_rows_pending=0, remapped_rows_failed=0,
    )
    row.update(over)
    return row


def serving_metrics(**over: Any) -> dict[str, Any]:
    """The serving metrics of a busy server, as JSON (every SERVING_METRICS column)."""
    m: dict[str, Any] = dict.fromkeys(names(SERVING_METRICS))
    m.update(run_id=3, scrape_ok=1, scrape_errors=0, requests_per_s=4.2, prompt_tokens_per_s=9100.0,
             generation_tokens_per_s=1234.5, requests_running=12, requests_waiting=2, kv_cache_usage_pct=37.5,
             preemptions=0, prefix_cache_hit_pct=61.0, spec_decode_acceptance_pct=None)
    for series, base in (("ttft", 300.0), ("itl", 40.0), ("tpot", 45.0), ("e2e", 9000.0), ("queue", 20.0)):
        m.update({f"{series}_p50_ms": base, f"{series}_p90_ms": base * 1.8, f"{series}_p99_ms": base * 2.5,
                  f"{series}_mean_ms": base * 1.1})
    m.update(over)
    return m


def status_json(state: str = "ready", gpus: int = 8, simulated: bool = True, ts_ms: int = T0, *,
                agent: dict[str, Any] | None = None, sla: dict[str, Any] | None = None,
                host: dict[str, Any] | None = None, metrics: dict[str, Any] | None = None,
                gpu_rows: list[dict[str, Any]] | None = None, engines: list[dict[str, Any]] | None = None,
                **serving_over: Any) -> dict[str, Any]:
    """The JSON of `make_status` (same arguments): what a fake agent answers on the wire."""
    serving = {
        "state": state, "state_since_ms": ts_ms - 3_723_000, "reason": "", "phase": None,
        "phase_since_ms": None, "phases": [], "profile": "dsv41-tp8", "run_id": 3, "pid": 4242,
        "model": "deepseek-ai/DeepSeek-V4.1", "vllm_version": "0.11.0", "started_ms": ts_ms - 4_800_000,
        "ready_ms": ts_ms - 3_723_000, "next_retry_ms": None, "failures_in_window": 0, "adopted": False,
        "url": "http://127.0.0.1:8000", **serving_over,
    }
    host_json = dict.fromkeys(names(HOST_METRICS))
    host_json.update({"cpu_pct": 12.0, "load1": 3.0, "mem_used_bytes": 200 * GIB, "mem_total_bytes": 2000 * GIB,
                      **(host or {})})
    busy = state in ("ready", "degraded")
    return {
        "ts_ms": ts_ms,
        "agent": {"version": "0.1.0", "pid": 100, "host": "h200-node-07", "started_ms": ts_ms - 86_400_000,
                  "uptime_s": 86_400, "simulated": simulated, "healthy": True, "missed_ticks": 0,
                  "sample_interval_s": 1.0,
                  "nvml": {"state": "ok", "message": "", "driver_version": "570.86", "nvml_version": "12.570"},
                  "store": {"path": "/tmp/x.db", "queued": 0, "dropped": 0, "last_error": None},
                  "action": None, **(agent or {})},
        "serving": serving,
        "sla": {"state": "ok", "since_ms": ts_ms - 600_000, "ttft_p99_ms": 750.0, "tpot_p99_ms": 112.5,
                "ttft_threshold_ms": 2000, "tpot_threshold_ms": 150, "window_s": 60, "tpot_source": "tpot",
                **(sla or {})},
        "gpus": gpu_rows if gpu_rows is not None else [gpu_row(i) for i in range(gpus)],
        "host": host_json,
        "serving_metrics": serving_metrics(**(metrics or {})) if busy or metrics else {},
        "engines": list(engines or []),
    }


def engine_loads(waiting: dict[int, int] | None = None, kv: dict[int, float] | None = None,
                 running: dict[int, int] | None = None, n: int = 8) -> list[dict[str, Any]]:
    """`n` data-parallel engines as JSON, even (12 running, 0 waiting, KV 37.5 %) except where overridden."""
    waiting, kv, running = waiting or {}, kv or {}, running or {}
    return [{"engine": str(i), "running": running.get(i, 12), "waiting": waiting.get(i, 0),
             "kv_cache_usage_pct": kv.get(i, 37.5)} for i in range(n)]


def make_status(state: str = "ready", gpus: int = 8, simulated: bool = True, ts_ms: int = T0, **over: Any) -> Status:
    """A `Status`; `agent`, `sla`, `host`, `metrics` (serving metrics) merge into their sections, `gpu_rows`
    replaces the GPUs, `engines` (JSON, see `engine_loads`) gives the per-engine load (default none), and any
    other keyword is a field of the serving section (state, phase, run_id, ...)."""
    return Status.from_json(status_json(state, gpus, simulated, ts_ms, **over))
