"""`lynxtop status` after a switch and under bursty prefill (UX audit, 3 a.m. operator): the rates are this run's
windowed means, the span used is said, and each GPU line leads with SM activity, not only the coarse util."""

from __future__ import annotations

import shutil
import tempfile
from argparse import Namespace
from pathlib import Path

from support.status import T0, gpu_row, make_status, serving_metrics

from lynxtop.cli import ctl

READY = T0 - 20_000  # the new run became READY 20 s ago


def _store_across_a_switch(path: Path) -> None:
    """The old run served 2 req/s until 3 min ago; nothing for 2m40s (the switch); the new run 0.5 req/s since
    READY, its prompt tokens in bursts (8000 in one tick of four, 0 in the others)."""
    from lynxtop.store.writer import StoreWriter

    w = StoreWriter(path, clock=lambda: T0 / 1000)
    w.start()
    old = w.create_run(profile="a", argv=["vllm"], model="m", host="h", started_ms=T0 - 900_000, pid=1,
                       log_path="", simulated=True, flags={})
    new = w.create_run(profile="b", argv=["vllm"], model="m", host="h", started_ms=T0 - 180_000, pid=2,
                       log_path="", simulated=True, flags={})
    for i in range(300):
        ts = T0 - 299_000 + i * 1000
        if ts <= T0 - 180_000:
            row = serving_metrics(run_id=old, requests_per_s=2.0, prompt_tokens_per_s=5000.0,
                                  generation_tokens_per_s=3000.0)
        elif ts <= READY:
            row = serving_metrics(run_id=new, requests_per_s=0.0, prompt_tokens_per_s=0.0,
                                  generation_tokens_per_s=0.0)
        else:
            row = serving_metrics(run_id=new, requests_per_s=0.5, prompt_tokens_per_s=8000.0 if i % 4 == 0 else 0.0,
                                  generation_tokens_per_s=1000.0)
        w.submit_tick(ts, gpu_rows=[], serving_row=row)
    w.close()


def test_rates_after_a_switch_are_this_runs_means_over_the_span_used():
    d = Path(tempfile.mkdtemp(prefix="lt-op-", dir="/tmp"))
    try:
        db = d / "history.db"
        _store_across_a_switch(db)
        st = make_status(started_ms=T0 - 180_000, ready_ms=READY,
                         metrics={"requests_per_s": 0.0, "prompt_tokens_per_s": 0.0})
        rates = ctl._stored_rates(Namespace(database=str(db), socket="/nonexistent.sock"), st)
        text = ctl.format_status(st, rates.get("requests_per_s"), rates)
        # 20 readings since READY: 0.5 req/s over 20 s, not the old run's 2 req/s diluted by the downtime
        assert "0.50 req/s (finished, mean of 20s)" in text, text
        # prompt tokens: 5 bursts of 8000 in 20 ticks, the same window; not the last tick's 0
        assert "gen 1000 tok/s  prompt 2000 tok/s (means of 20s)" in text, text
        assert ctl._stored_rate(Namespace(database=str(db), socket="/nonexistent.sock"), st) == (0.5, 20_000)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_without_a_database_the_token_figures_say_they_are_one_ticks():
    text = ctl.format_status(make_status(metrics={"prompt_tokens_per_s": 7200.0}))
    assert "prompt 7200 tok/s (last tick)" in text, text


def test_gpu_line_shows_sm_activity_before_util():
    st = make_status(gpu_rows=[gpu_row(0, sm_active_pct=40, util_gpu_pct=99),
                               gpu_row(1, sm_active_pct=None, gpm_supported=False, util_gpu_pct=99)])
    lines = [ln for ln in ctl.format_status(st).splitlines() if ln.startswith("GPU ")]
    assert "SM 40%  util 99%" in lines[0], lines
    assert "SM" not in lines[1] and "util 99%" in lines[1], lines  # no GPM: no SM figure to show
