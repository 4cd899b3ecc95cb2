"""`lynxtop status` text: a request rate that is not 0.0 under traffic, a run explained, per-GPU figures (28.1)."""

from __future__ import annotations

import shutil
import tempfile
from argparse import Namespace
from pathlib import Path

from support.status import T0, make_status, serving_metrics

from lynxtop.cli import ctl
from lynxtop.contract.format import fmt_clock


def _store_with_slow_requests(path: Path) -> None:
    """Five minutes of 1 s ticks where one long request finishes every 10 s: most ticks read 0 req/s."""
    from lynxtop.store.writer import StoreWriter

    w = StoreWriter(path, clock=lambda: T0 / 1000)
    w.start()
    run = w.create_run(profile="v4-tp8-h200", argv=["vllm", "serve", "m"], model="m", host="h", started_ms=T0,
                       pid=1, log_path="", simulated=True, flags={})
    for i in range(300):
        w.submit_tick(T0 - 299_000 + i * 1000, gpu_rows=[],
                      serving_row=serving_metrics(run_id=run, requests_per_s=1.0 if i % 10 == 0 else 0.0))
    w.close()


def test_request_rate_under_traffic_is_the_stored_mean_not_the_last_tick():
    d = Path(tempfile.mkdtemp(prefix="lt-st-", dir="/tmp"))
    try:
        db = d / "history.db"
        _store_with_slow_requests(db)
        st = make_status(metrics={"requests_per_s": 0.0, "requests_running": 16})
        rate = ctl._stored_rate(Namespace(database=str(db), socket="/nonexistent.sock"), st)
        assert rate is not None and abs(rate[0] - 0.1) < 1e-9
        text = ctl.format_status(st, rate)
        assert "0.10 req/s (finished, mean of 5m00s)" in text, text
        # without a database the tick figure is labelled as one tick's, not shown as the rate
        assert "0.0 req/s finished in the last tick" in ctl.format_status(st)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_run_is_explained_where_it_is_named():
    st = make_status(run_id=12, profile="v4-tp8-h200", started_ms=T0 - 3_600_000)
    text = ctl.format_status(st)
    assert f"run 12 (started {fmt_clock(T0 - 3_600_000, False)}, profile v4-tp8-h200)" in text, text


def test_memory_and_power_are_per_gpu_lines():
    text = ctl.format_status(make_status(gpus=8))
    assert len([ln for ln in text.splitlines() if ln.startswith("GPU ")]) == 8
