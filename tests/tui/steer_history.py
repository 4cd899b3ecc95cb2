"""A small real history for the sort/filter, event detail, steerable history and compare tests (issue 28.4):
two runs of known times, a sample a minute, events of several kinds and severities with details, and benchmark
sweeps with request counts below and above the comparison's minimum."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tui_fake_agent import T0, gpu_row, serving_metrics

from lynxtop.contract.events import Event

HOUR = 3600_000


def build_steer_history(path: Path) -> dict[str, Any]:
    """Run 1 from T0-6h to T0-3h (ended), run 2 from T0-3h on (running); samples every minute until T0."""
    from lynxtop.store.writer import StoreWriter

    w = StoreWriter(path, clock=lambda: T0 / 1000)
    w.start()
    r1_start, r2_start = T0 - 6 * HOUR, T0 - 3 * HOUR
    run1 = w.create_run(profile="dsv41-tp8", argv=["vllm", "serve", "m"], model="deepseek-ai/DeepSeek-V4.1",
                        host="h200-node-07", started_ms=r1_start, pid=11, log_path="", simulated=True,
                        flags={"--max-model-len": "131072"})
    w.update_run(run1, ready_ms=r1_start + 60_000, ended_ms=r2_start - 1000, exit_code=0, end_reason="switch")
    run2 = w.create_run(profile="dsv41-tp8-ep", argv=["vllm", "serve", "m"], model="deepseek-ai/DeepSeek-V4.1",
                        host="h200-node-07", started_ms=r2_start, pid=12, log_path="", simulated=True,
                        flags={"--max-model-len": "262144"})
    w.update_run(run2, ready_ms=r2_start + 90_000)
    ts, i = r1_start, 0
    while ts <= T0:
        run = run1 if ts < r2_start else run2
        w.submit_tick(ts, gpu_rows=[{"gpu": g, **{k: v for k, v in gpu_row(g, sm_active_pct=50 + i % 30).items()
                                                   if k not in ("index", "name", "uuid", "pci_bus_id", "arch",
                                                                "gpm_supported", "nvlink_count")}}
                                    for g in range(2)],
                      serving_row=serving_metrics(run_id=run, ttft_p99_ms=400.0 + i % 10))
        ts += 60_000
        i += 1
    events = [
        Event("serving.starting", "info", "starting dsv41-tp8", run_id=run1, ts_ms=r1_start),
        Event("action.switch", "warning", "switch to dsv41-tp8-ep by uid 1000 (alice)", run_id=run1,
              ts_ms=r2_start - 2000, details={"from": "dsv41-tp8", "to": "dsv41-tp8-ep", "uid": 1000}),
        Event("serving.ready", "info", "ready after 90 s", run_id=run2, ts_ms=r2_start + 90_000),
        Event("gpu.xid", "error", "GPU 1 XID 79: fell off the bus \x1b[2J[bold]x[/]", run_id=run2,
              ts_ms=T0 - 120_000, details={"gpu": 1, "xid": 79, "note": "[red]not markup[/] \x1b[31m"}),
        Event("sla.breach", "critical", "TTFT p99 3.0 s above 2.0 s " + "long words " * 30, run_id=run2,
              ts_ms=T0 - 60_000, details={"series": "ttft", "p99_ms": 3000.0, "limit_ms": 2000.0}),
    ]
    for e in events:
        w.record(e)
    for run, tok2, tok16 in ((run1, 10.0, 1000.0), (run2, 294.8, 1100.0)):
        for conc, tok, n in ((2, tok2, 4), (16, tok16, 40)):
            w.add_bench_result({"run_id": run, "bench_id": f"sweep-{run}", "concurrency": conc, "ts_ms": T0,
                                "num_prompts": n, "errors": 0, "output_tokens_per_s": tok,
                                "details": {"summary": {"completed": n}}})
    w.close()
    return {"run1": run1, "run2": run2, "r1_start": r1_start, "r2_start": r2_start, "events": len(events)}
