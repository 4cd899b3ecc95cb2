"""The Compare view reads a run's latency percentiles as the node view does, and GPU power and energy with units.

A percentile inside vLLM's lowest histogram bucket is known only to be below that bucket's bound: the Serving
panel and `lynxtop status` say `<10.0 ms` (contract/quantile.py, s17); Compare showed `9.9 ms`, interpolated from
0, because the run summary (store/reader.py SERVING_SUMMARY) did not carry the bound. The rows come from
vLLM-shaped pages read by the agent's real scraper, written by the store's real writer (and rolled up by its real
rollups for the long-run path) and read back by the real reader.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from support.latency_pages import IDLE_FAST, QUEUEING, scraped_row
from support.tui import make_app, text_of, wait_for
from tui_fake_agent import T0

from lynxtop.store import reader as reader_mod
from lynxtop.store.reader import StoreReader
from lynxtop.store.writer import StoreWriter
from lynxtop.tui.screens.compare import CompareScreen, _as_dict, _fmt_value, compare_table

MINUTE = 60_000
STEP = 5_000
BOUNDS = {"ttft": 1.0, "tpot": 10.0, "itl": 10.0, "e2e": 300.0}  # vLLM's lowest buckets (sim/metrics.py)


def _history(db: Path, rows: list[dict[str, Any]], minutes: int = 9) -> list[int]:
    """One run per row, back to back, each `minutes` long with that serving row every STEP (the first tick of each
    run without percentiles: no request finished yet, NULL bounds). Written and rolled up by the real writer."""
    start = T0 - (len(rows) + 1) * (minutes + 1) * MINUTE
    start -= start % MINUTE - 17_300  # mid-minute: a partial first minute is read raw by the rollup path
    runs = []
    with StoreWriter(db, queue_max=50_000) as w:
        for k, row in enumerate(rows):
            s = start + k * (minutes + 1) * MINUTE
            run = w.create_run(profile=f"p{k}", argv=["vllm", "serve", "m"], model="m", host="h", started_ms=s,
                               pid=10 + k, log_path="", simulated=True, flags={})
            w.update_run(run, ready_ms=s + 1000, ended_ms=s + minutes * MINUTE)
            idle = {c: None for c in row if c.endswith("_ms")}
            for i, ts in enumerate(range(s + 2000, s + minutes * MINUTE, STEP)):
                w.submit_tick(ts, gpu_rows=[], serving_row={**row, **(idle if i == 0 else {}), "run_id": run})
            runs.append(run)
        assert w.flush(60)
    return runs


def _rows(table: Any, width: int = 200) -> dict[str, list[str]]:
    console = Console(width=width, record=True, color_system=None)
    console.print(table)
    out = {}
    for ln in console.export_text().splitlines():
        cells = [c.strip() for c in ln.strip().strip("│┃").replace("┃", "│").split("│")]
        if len(cells) == 3 and cells[0]:
            out[cells[0]] = cells[1:]
    return out


def test_the_run_summary_carries_each_series_lowest_bucket_bound(tmp_path):
    """The bound rides with the summary (ignoring the ticks without percentiles), so a reader can tell a figure
    from a bound: before, the summary had no `*_lowest_bucket_ms` at all."""
    db = tmp_path / "history.db"
    fast, queueing = scraped_row(IDLE_FAST), scraped_row(QUEUEING)
    runs = _history(db, [fast, queueing])
    with StoreReader(db) as r:
        summaries = [r.run(run).summary["serving"] for run in runs]
    for s in summaries:
        assert {k: s.get(f"{k}_lowest_bucket_ms") for k in BOUNDS} == BOUNDS, s
    assert summaries[0]["tpot_p99_ms"] <= BOUNDS["tpot"]  # the data is what the test means: inside the bucket
    assert summaries[1]["tpot_p99_ms"] > BOUNDS["tpot"]  # and above it


def test_compare_reads_a_lowest_bucket_percentile_as_its_bound_and_others_as_figures(tmp_path):
    db = tmp_path / "history.db"
    runs = _history(db, [scraped_row(IDLE_FAST), scraped_row(QUEUEING)])
    with StoreReader(db) as r:
        a, b = (_as_dict(r.run(run)) for run in runs)
    rows = _rows(compare_table(a, b, utc=True))
    # run a inside the lowest buckets: the bound, as the Serving panel; run b above them: measured figures
    assert rows["serving.tpot_p99_ms"][0] == "<10.0 ms" and rows["serving.tpot_p99_max_ms"][0] == "<10.0 ms"
    assert rows["serving.itl_p99_ms"][0] == "<10.0 ms" and rows["serving.e2e_p99_ms"][0] == "<300 ms"
    assert rows["serving.ttft_p50_ms"][0] == "<1.0 ms" and rows["serving.ttft_p99_ms"][0] == "<1.0 ms"
    for key in ("tpot_p99_ms", "itl_p99_ms", "e2e_p99_ms", "ttft_p50_ms"):
        assert re.fullmatch(r"\d+(\.\d+)? (ms|s)", rows[f"serving.{key}"][1]), (key, rows[f"serving.{key}"])
    # the bounds format the rows; they are not rows of their own
    assert not any("lowest_bucket" in k for k in rows), rows
    # the rows say what they are: a mean over the run of per-tick windowed percentiles
    heading = [k for k in rows if "per-tick windowed pNN" in k]
    assert heading, rows


def test_a_long_runs_summary_gives_the_same_bound_from_the_rollups(tmp_path, monkeypatch):
    """Past RAW_SUMMARY_MAX_MS the summary reads whole minutes from serving_1m (s21): it keeps each minute's
    largest bound there, so both paths give the same bound and Compare the same `<10.0 ms`."""
    db = tmp_path / "history.db"
    runs = _history(db, [scraped_row(IDLE_FAST), scraped_row(QUEUEING)], minutes=40)
    monkeypatch.setattr(reader_mod, "RAW_SUMMARY_MAX_MS", 10**13)
    with StoreReader(db) as r:
        raw = [_as_dict(r.run(run)) for run in runs]
    monkeypatch.setattr(reader_mod, "RAW_SUMMARY_MAX_MS", 10 * MINUTE)
    with StoreReader(db) as r:
        rolled = [_as_dict(r.run(run)) for run in runs]
        first, split = r._rolled_minutes("serving", rolled[0]["started_ms"], rolled[0]["ended_ms"])
    assert split - first >= 30 * MINUTE  # the rollup path was taken, over most of the run
    for x, y in zip(raw, rolled, strict=True):
        sx, sy = x["summary"]["serving"], y["summary"]["serving"]
        assert {k: sy[f"{k}_lowest_bucket_ms"] for k in BOUNDS} == BOUNDS
        assert {k: sx[f"{k}_lowest_bucket_ms"] for k in BOUNDS} == BOUNDS
        assert sy["tpot_p99_ms"] == pytest.approx(sx["tpot_p99_ms"], rel=1e-9)
    assert _rows(compare_table(*raw, utc=True)) == _rows(compare_table(*rolled, utc=True))
    assert _rows(compare_table(*rolled, utc=True))["serving.tpot_p99_ms"][0] == "<10.0 ms"


def test_a_bound_that_changes_within_a_run_reads_as_the_largest(tmp_path, monkeypatch):
    """Should the bound differ between ticks (it does not within one vLLM process), the summary takes the largest:
    every tick's figure in its own lowest bucket is at most its bound, so at most the largest."""
    db = tmp_path / "history.db"
    row = scraped_row(IDLE_FAST)
    runs = _history(db, [row], minutes=40)
    c = sqlite3.connect(db)  # a few ticks of the run stored with a smaller TPOT bound (raw rows only)
    changed = c.execute("UPDATE serving_samples SET tpot_lowest_bucket_ms = 5.0 WHERE ts_ms % 3 = 0").rowcount
    c.commit()
    c.close()
    assert changed > 0
    for limit in (10**13, 10 * MINUTE):
        monkeypatch.setattr(reader_mod, "RAW_SUMMARY_MAX_MS", limit)
        with StoreReader(db) as r:
            assert r.run(runs[0]).summary["serving"]["tpot_lowest_bucket_ms"] == 10.0, limit


@pytest.mark.parametrize(("key", "value", "shown"), [
    ("gpus.power_w (mean)", 553.5, "554 W"),  # was "553.5", no unit
    ("gpus.energy_j (sum)", 2_520_000, "2.52 MJ"),  # was "2,520,000"
    ("gpus.energy_j (sum)", 45_300, "45.3 kJ"),
    ("gpus.energy_j (sum)", 950, "950 J"),
    ("gpus.temp_max_c (max)", 67.0, "67°C"),
])
def test_gpu_power_and_energy_have_units(key, value, shown):
    assert _fmt_value(key, value) == shown


async def test_compare_at_80x24_shows_the_bound(sock_dir, tmp_path):
    """The dialog at the smallest supported terminal: the table stays inside 80 columns and shows the bound."""
    db = tmp_path / "history.db"
    runs = _history(db, [scraped_row(IDLE_FAST), scraped_row(QUEUEING)])
    app = make_app(sock_dir / "absent.sock", db, utc=True)
    async with app.run_test(size=(80, 24)) as pilot:
        app.push_screen(CompareScreen(*runs))
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.query("#compare-body"))
        body = app.screen.query_one("#compare-body")
        await wait_for(pilot, lambda: "serving.tpot_p99_ms" in text_of(body), timeout_s=60)
        width = body.content_region.width  # the table as the dialog draws it, every row (most are scrolled off)
        console = Console(width=width, record=True, color_system=None)
        console.print(body.content)
        lines = console.export_text().splitlines()
    assert 40 < width <= 80
    tpot = next(ln for ln in lines if "serving.tpot_p99_ms" in ln)
    cells = [c.strip() for c in tpot.strip().strip("│").split("│")]
    assert cells[1] == "<10.0 ms" and re.fullmatch(r"\d+\.\d ms", cells[2]), tpot  # b: a figure (25-50 ms bucket)
    # the heading wraps in the label column: the values keep the room they had (model names, times)
    started = next(ln for ln in lines if "started at" in ln)
    assert "2026-12-" in started, started


def test_a_file_older_than_the_bounds_still_summarises(tmp_path):
    """A history file written before s17 has no `*_lowest_bucket_ms` columns until a writer opens it (a reader never
    adds them): its summary has no bounds and Compare shows the figures, as before, instead of failing."""
    db = tmp_path / "history.db"
    runs = _history(db, [scraped_row(IDLE_FAST), scraped_row(QUEUEING)])
    c = sqlite3.connect(db)
    for series in BOUNDS:
        c.execute(f"ALTER TABLE serving_samples DROP COLUMN {series}_lowest_bucket_ms")
    c.commit()
    c.close()
    with StoreReader(db) as r:
        a, b = (_as_dict(r.run(run)) for run in runs)
    assert a["summary"]["serving"]["tpot_lowest_bucket_ms"] is None
    assert re.fullmatch(r"\d\.\d ms", _rows(compare_table(a, b, utc=True))["serving.tpot_p99_ms"][0])
