"""Dashboard test set-up: a FAKE agent on a real unix socket, a real SQLite history built by the store's
writer, and an app with a frozen clock and compressed poll intervals."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tui_fake_agent import T0, FakeAgent, gpu_row, serving_metrics

from lynxtop.contract.events import Event, EventKind


@pytest.fixture
def agent(sock_dir: Path) -> Iterator[FakeAgent]:
    fake = FakeAgent(sock_dir / "agent.sock").start()
    yield fake
    fake.stop()


def build_history(path: Path, minutes: int = 30, step_s: int = 10) -> dict[str, Any]:
    """Two runs (an ended one and a running one) with GPU and serving samples and events, ending at T0."""
    from lynxtop.store.writer import StoreWriter

    w = StoreWriter(path, clock=lambda: T0 / 1000)
    w.start()
    start_old = T0 - 2 * minutes * 60_000
    mid = T0 - minutes * 60_000
    run1 = w.create_run(profile="dsv41-tp8", argv=["vllm", "serve", "m", "--max-model-len", "131072"],
                        model="deepseek-ai/DeepSeek-V4.1", host="h200-node-07", started_ms=start_old,
                        pid=11, log_path="", simulated=True,
                        flags={"--max-model-len": "131072", "--kv-cache-dtype": "fp8"})
    w.update_run(run1, ready_ms=start_old + 60_000, ended_ms=mid - 1000, exit_code=0, end_reason="switch")
    run2 = w.create_run(profile="dsv41-tp8-ep", argv=["vllm", "serve", "m", "--max-model-len", "262144"],
                        model="deepseek-ai/DeepSeek-V4.1", host="h200-node-07", started_ms=mid, pid=12,
                        log_path="", simulated=True,
                        flags={"--max-model-len": "262144", "--kv-cache-dtype": "fp8",
                               "--enable-expert-parallel": "on"})
    w.update_run(run2, ready_ms=mid + 90_000)
    ts = start_old
    i = 0
    while ts <= T0:
        run = run1 if ts < mid else run2
        ttft = 3000.0 if i % 37 == 0 else 400.0 + (i % 10) * 20  # a breach now and then
        w.submit_tick(ts, gpu_rows=[{"gpu": g, **{k: v for k, v in gpu_row(g, sm_active_pct=50 + (i % 30)).items()
                                                   if k not in ("index", "name", "uuid", "pci_bus_id", "arch",
                                                                "gpm_supported", "nvlink_count")}}
                                    for g in range(8)],
                      serving_row=serving_metrics(run_id=run, ttft_p99_ms=ttft,
                                                  generation_tokens_per_s=1000.0 + i % 50))
        ts += step_s * 1000
        i += 1
    w.record(Event(EventKind.SERVING_STARTING, "info", "starting dsv41-tp8", run_id=run1, ts_ms=start_old))
    w.record(Event(EventKind.ACTION_SWITCH, "warning", "switch to dsv41-tp8-ep by uid 1000 (alice)", run_id=run1,
                   ts_ms=mid - 2000))
    w.record(Event(EventKind.GPU_XID, "error", "GPU 5 XID 79: fell off the bus", run_id=run2, ts_ms=T0 - 120_000))
    w.record(Event(EventKind.SLA_BREACH, "critical", "TTFT p99 3.0 s above 2.0 s", run_id=run2, ts_ms=T0 - 60_000))
    for run, scale in ((run1, 1.0), (run2, 1.3)):
        for conc in (1, 8, 32):
            w.add_bench_result({"run_id": run, "name": "sharegpt", "concurrency": conc, "ts_ms": mid,
                                "output_tokens_per_s": 100.0 * conc * scale, "ttft_p99_ms": 200.0 * conc})
    w.close()
    return {"run1": run1, "run2": run2, "start": start_old, "mid": mid}


@pytest.fixture(scope="session")
def history_db() -> Iterator[tuple[Path, dict[str, Any]]]:
    d = Path(tempfile.mkdtemp(prefix="lt-db-", dir="/tmp"))
    path = d / "history.db"
    info = build_history(path)
    yield path, info
    shutil.rmtree(d, ignore_errors=True)
