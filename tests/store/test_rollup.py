"""Rollups: min/avg/max/n per bucket equal a direct computation from raw samples (1-hour rows too, though
they are computed from 1-minute rows, with missing readings inside minutes), resume from the watermark
after a restart, and late samples re-roll their bucket."""

from __future__ import annotations

import sqlite3
from collections import defaultdict

import pytest

from lynxtop.store.reader import StoreReader
from lynxtop.store.writer import StoreWriter

from .helpers import T0, gpu_row

STEP = 10_000  # one tick per 10 s: 3 hours in 1080 ticks
COLS = ("power_w", "sm_active_pct", "temp_c", "mem_used_bytes")


def _ticks(start: int, stop: int) -> list[tuple[int, list[dict]]]:
    return [(T0 + i * STEP, [gpu_row(g, i, null_every=7) for g in range(2)]) for i in range(start, stop)]


def _expected(ticks, bucket_ms: int, until_ms: int) -> dict:
    vals: dict = defaultdict(lambda: defaultdict(list))
    counts: dict = defaultdict(int)
    for ts, rows in ticks:
        b = ts - ts % bucket_ms
        if b + bucket_ms > until_ms:
            continue
        for r in rows:
            counts[(b, r["gpu"])] += 1
            for c in COLS:
                v = r.get(c)
                if v is not None:
                    vals[(b, r["gpu"])][c].append(round(v))
    out = {}
    for key, n in counts.items():
        out[key] = {"samples": n}
        for c in COLS:
            xs = vals[key][c]
            out[key][c] = (min(xs), sum(xs) / len(xs), max(xs)) if xs else (None, None, None)
        out[key]["sm_n"] = len(vals[key]["sm_active_pct"])
    return out


def _actual(db, table: str) -> dict:
    c = sqlite3.connect(db)
    c.row_factory = sqlite3.Row
    out = {}
    for r in c.execute(f"SELECT * FROM {table}"):
        out[(r["ts_ms"], r["gpu"])] = {"samples": r["samples"], "sm_n": r["sm_active_pct_n"],
                                       **{col: (r[f"{col}_min"], r[f"{col}_avg"], r[f"{col}_max"]) for col in COLS}}
    return out


def _same(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for key, exp in expected.items():
        got = actual[key]
        assert got["samples"] == exp["samples"] and got["sm_n"] == exp["sm_n"], key
        for c in COLS:
            if exp[c][0] is None:
                assert got[c] == (None, None, None), (key, c)
            else:
                assert got[c][0] == exp[c][0] and got[c][2] == exp[c][2], (key, c)
                assert got[c][1] == pytest.approx(exp[c][1]), (key, c)


def test_rollups_match_direct_computation_across_a_restart(tmp_path):
    db = tmp_path / "h.db"
    ticks = _ticks(0, 1080)
    w = StoreWriter(db, queue_max=5000)
    for ts, rows in ticks[:500]:
        w.submit_tick(ts, rows)
    w.start()
    w.close()
    c = sqlite3.connect(db)
    wm_1m = int(c.execute("SELECT value FROM meta WHERE key='rollup_wm_gpu_1m'").fetchone()[0])
    last = ticks[499][0]
    assert wm_1m == last - last % 60_000  # every complete minute, not the one still filling
    c.close()

    w = StoreWriter(db, queue_max=5000)  # a restart: continues from the stored watermark
    for ts, rows in ticks[500:]:
        w.submit_tick(ts, rows)
    w.start()
    w.close()
    end = ticks[-1][0]
    _same(_actual(db, "gpu_1m"), _expected(ticks, 60_000, end - end % 60_000))
    _same(_actual(db, "gpu_1h"), _expected(ticks, 3_600_000, end - end % 3_600_000))
    assert len(_actual(db, "gpu_1h")) == 2 * 2  # hours 0 and 1 complete, hour 2 still open


def test_late_sample_rerolls_its_bucket(tmp_path):
    db = tmp_path / "h.db"
    with StoreWriter(db, queue_max=5000) as w:
        for ts, rows in _ticks(0, 20):
            w.submit_tick(ts, rows)
        assert w.flush(10)
        late = gpu_row(0, 3)
        late["power_w"] = 9999
        w.submit_tick(T0 + 5_000, [late])  # between two earlier ticks, minute 0 already rolled up
    c = sqlite3.connect(db)
    got = c.execute("SELECT power_w_max, samples FROM gpu_1m WHERE ts_ms = ? AND gpu = 0", (T0,)).fetchone()
    assert got == (9999, 7)


def test_reader_tail_and_long_run_summary_use_rollups(tmp_path):
    db = tmp_path / "h.db"
    ticks = _ticks(0, 1080)
    with StoreWriter(db, queue_max=5000) as w:
        rid = w.create_run(profile="p", started_ms=T0, ended_ms=ticks[-1][0] + 1)
        for ts, rows in ticks:
            w.submit_tick(ts, rows)
    r = StoreReader(db, sample_interval_s=10)
    res, rows = r.series("gpu", ["power_w"], T0, ticks[-1][0] + 1, gpu=1, max_points=100)
    assert res == "1h"
    assert [row["ts_ms"] for row in rows] == [T0, T0 + 3_600_000, T0 + 7_200_000]  # last hour from raw
    assert sum(row["samples"] for row in rows) == 1080
    # the last hour is merged from 1-minute rows and the raw minute after them: still exact
    last = [round(t[1][1]["power_w"]) for t in ticks if t[0] >= T0 + 7_200_000]
    assert rows[-1]["samples"] == len(last) and rows[-1]["power_w_avg"] == pytest.approx(sum(last) / len(last))
    assert rows[-1]["power_w_max"] == max(last) and rows[-1]["power_w_min"] == min(last)
    raw_avg = sum(round(t[1][1]["power_w"]) for t in ticks) / len(ticks)
    gpu1 = r.run(rid).summary["gpus"][1]
    assert gpu1["samples"] == 1080
    assert gpu1["power_w"] == pytest.approx(raw_avg)


def test_a_fresh_database_runs_no_rollup_step_until_a_bucket_can_close(tmp_path):
    """A fresh database (every new agent, and every benchmark run) has no watermark yet: the writer asked for a
    rollup step whenever the newest sample moved, i.e. an empty write transaction after every 1 Hz tick for
    the first minute (and one a minute for the first hour). Now a step runs once the newest sample enters a
    new bucket: one transaction a tick in the first minute, then the minute is rolled as before."""
    db = tmp_path / "r.db"
    start = T0 - T0 % 60_000 + 5_000  # 5 s into a minute
    w = StoreWriter(db, queue_max=1000, clock=lambda: (start + 200_000) / 1000)
    begins: list[str] = []
    w.conn.set_trace_callback(lambda sql: begins.append(sql) if sql.startswith("BEGIN") else None)
    ticks = []
    for i in range(50):  # 1 Hz, all in the first minute: each tick its own batch, as the agent at 1 Hz
        ticks.append((start + i * 1000, [gpu_row(g, i, null_every=7) for g in range(2)]))
        w.submit_tick(*ticks[-1])
        w._drain_once()
        if i == 0:
            begins.clear()  # the first batch's maintenance (retention's first pass, the first look)
    first_minute = len(begins)
    for i in range(50, 130):  # past the second minute: the first two roll up
        ticks.append((start + i * 1000, [gpu_row(g, i, null_every=7) for g in range(2)]))
        w.submit_tick(*ticks[-1])
        w._drain_once()
    w.conn.set_trace_callback(None)
    w.close()
    assert first_minute == 49  # the ticks' own transactions only; it was two a tick (98)
    until = start + 129_000 - (start + 129_000) % 60_000
    _same(_actual(db, "gpu_1m"), _expected(ticks, 60_000, until))
    assert len(_actual(db, "gpu_1m")) == 4  # two minutes of two GPUs
