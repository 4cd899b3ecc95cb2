"""A long run's serving summary comes from the 1-minute rollups, not from decoding every chunk it spans.

`StoreReader.run(id)` (compare, `GET /v1/history?read=run`) read the serving part raw over the whole run: every
ten-minute chunk decoded (86,400 rows a day at 1 Hz, ~6 s a day, the decoded rows kept in the process). Past
RAW_SUMMARY_MAX_MS it now reads the whole minutes up to the serving watermark from serving_1m and only the
partial first minute and the rows past the watermark raw. These tests check that the result is the raw one (the
same rows, written by the real writer and rolled up by the real rollups) for runs that start and end mid-minute
beside other runs' rows, with NULL stretches, compacted chunks and a lagging watermark, and that a day-long run's
summary decodes nothing.
"""

from __future__ import annotations

import random
import sqlite3
import time
from pathlib import Path

import pytest

from lynxtop.contract.columns import SERVING_METRICS, names
from lynxtop.store import codec, compact
from lynxtop.store import reader as reader_mod
from lynxtop.store.reader import StoreReader
from lynxtop.store.schema import chunk_table, connect_rw, rollup_columns, rollup_table
from lynxtop.store.writer import StoreWriter

from .helpers import T0

MINUTE = 60_000
START = T0 + 3_600_000 + 37_400  # run 2 starts 37.4 s into a minute (run 1's rows fill the start of it)
END = START + 2 * 3_600_000 + 11_250  # and ends mid-minute too (run 3's rows fill the rest of that minute)
STEP = 1000


def _row(i: int, run_id: int, rng: random.Random) -> dict:
    """One serving row: varied readings, NULL stretches (scrape failures, a metric absent for minutes)."""
    row: dict = {n: None for n in names(SERVING_METRICS)}
    row.update(run_id=run_id, scrape_ok=1)
    if 1200 <= i % 3600 < 1500 or i % 97 == 0:  # a 5-minute outage each hour, and odd failed scrapes
        row["scrape_ok"] = 0
        return row
    row.update(requests_per_s=rng.uniform(0, 40), prompt_tokens_per_s=rng.uniform(0, 9000),
               generation_tokens_per_s=rng.uniform(0, 3000), requests_finished=rng.randint(0, 40),
               prompt_tokens=rng.randint(0, 90_000), generation_tokens=rng.randint(0, 3000),
               requests_running=rng.randint(0, 64), kv_cache_usage_pct=rng.uniform(0, 100),
               ttft_p50_ms=rng.uniform(5, 200), ttft_p99_ms=rng.uniform(50, 4000) * (9 if run_id != 2 else 1),
               tpot_p50_ms=rng.uniform(5, 40), tpot_p99_ms=rng.uniform(10, 90), e2e_p99_ms=rng.uniform(100, 9000))
    if i % 600 < 200:  # a third of each 10 minutes without TPOT (no decode reported)
        row["tpot_p50_ms"] = row["tpot_p99_ms"] = None
    if i % 7 == 0:
        row["preemptions"] = rng.randint(0, 3)  # sparse: NULL otherwise
    # itl_p99_ms stays NULL throughout: its summary is NULL both ways
    return row


def _history(db: Path, *, ended: bool = True) -> None:
    """Runs 1, 2, 3 back to back at 1 Hz, written and rolled up by the real writer; run 2 is summarised."""
    rng = random.Random(21)
    with StoreWriter(db, queue_max=20_000) as w:
        w.create_run(1, profile="p", started_ms=T0, ended_ms=START - 1)
        w.create_run(2, profile="p", started_ms=START, ended_ms=END if ended else None)
        if ended:
            w.create_run(3, profile="p", started_ms=END + 1)
        ts, i = T0 + 400, 0
        last = END + 30 * MINUTE if ended else END
        while ts <= last:
            run_id = 1 if ts < START else 2 if ts <= END else 3
            w.submit_tick(ts, (), None, _row(i, run_id, rng))
            ts, i = ts + STEP, i + 1
        assert w.flush(60)


def _compact_around_start(db: Path) -> None:
    """Move the rows around run 2's start (and so its partial first minute) into chunks, as after 3 hours."""
    c = connect_rw(db)
    try:
        first = START - START % compact.CHUNK_MS - compact.CHUNK_MS
        for k in range(4):
            assert compact.compact_interval(c, "serving_samples", first + k * compact.CHUNK_MS) > 0
    finally:
        c.close()


def _lag_watermark(db: Path, wm: int) -> None:
    """The serving rollups as they are while the writer is behind: rolled up to `wm` only."""
    c = sqlite3.connect(db)
    c.execute("DELETE FROM serving_1m WHERE ts_ms >= ?", (wm,))
    c.execute("UPDATE meta SET value = ? WHERE key = 'rollup_wm_serving_1m'", (str(wm),))
    c.commit()
    c.close()


def _both_ways(db: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict, dict, int]:
    """Run 2's serving summary read raw (the bound set past the run) and by the rollup path; and how many serving
    rows the rollup path decoded."""
    monkeypatch.setattr(reader_mod, "RAW_SUMMARY_MAX_MS", 10**13)
    with StoreReader(db) as r:
        raw = r.run(2).summary["serving"]
    monkeypatch.setattr(reader_mod, "RAW_SUMMARY_MAX_MS", 10 * MINUTE)
    with StoreReader(db) as r:
        rolled = r.run(2).summary["serving"]
        decoded = (r.conn.execute("SELECT count(*) FROM temp._dec_serving_samples").fetchone()[0]
                   if "serving_samples" in r._decoded else 0)
    return raw, rolled, decoded


def _same(raw: dict, rolled: dict) -> None:
    assert list(rolled) == list(raw)  # the same fields, in the same order
    for k, v in raw.items():
        if k.endswith("_per_s") or (k.endswith("_ms") and "_max_" not in k):  # averages: float rounding only
            assert rolled[k] == (None if v is None else pytest.approx(v, rel=1e-9)), k
        else:  # counts, sums and maxima: exact
            assert rolled[k] == v and type(rolled[k]) is type(v), k


def test_rollup_summary_equals_the_raw_one(tmp_path, monkeypatch):
    db = tmp_path / "h.db"
    _history(db)
    raw, rolled, _ = _both_ways(db, monkeypatch)
    # the data has what the test means to cover: a NULL-only metric, sparse and partly NULL ones, every sample
    assert raw["itl_p99_ms"] is None and raw["preemptions"] > 0 and raw["tpot_p99_ms"] is not None
    assert raw["samples"] == (END - START) // STEP + 1
    assert raw["ttft_p99_max_ms"] <= 4000  # not run 1's or run 3's (9x larger) in the minutes it shares
    _same(raw, rolled)


def test_rollup_summary_equals_the_raw_one_over_chunks_and_a_lagging_watermark(tmp_path, monkeypatch):
    db = tmp_path / "h.db"
    _history(db)
    _compact_around_start(db)
    _lag_watermark(db, START + 3_600_000 + 17 * MINUTE + 25_000)  # not even on a minute: still whole minutes
    raw, rolled, decoded = _both_ways(db, monkeypatch)
    _same(raw, rolled)
    assert decoded <= compact.CHUNK_MS // STEP  # the chunk of the partial first minute only


def test_an_ongoing_runs_rollup_summary_equals_the_raw_one(tmp_path, monkeypatch):
    db = tmp_path / "h.db"
    _history(db, ended=False)  # no end: summarised up to now, the newest minute not rolled up yet
    raw, rolled, _ = _both_ways(db, monkeypatch)
    assert raw["samples"] == (END - START) // STEP + 1
    _same(raw, rolled)


def _one_day_run(path: Path) -> None:
    """A day-long run of compacted serving rows and their 1-minute rollups (as 3 hours after the samples)."""
    day = 86_400_000
    c = connect_rw(path)
    c.execute("INSERT INTO runs (id, profile, started_ms, ended_ms) VALUES (1, 'p', ?, ?)", (T0, T0 + day))
    cols = compact.columns(c, "serving_samples")
    base = {"run_id": 1, "scrape_ok": 1, "requests_per_s": 2.0, "requests_finished": 2}
    rows = []
    for k in range(day // compact.CHUNK_MS):
        start = T0 + k * compact.CHUNK_MS
        chunk = [tuple({**base, "ts_ms": start + i * 1000}.get(col) for col in cols) for i in range(600)]
        rows.append((start, 0, start + compact.CHUNK_MS, 600, codec.encode(cols, chunk)))
    rcols = [n for n, _ in rollup_columns("serving")]
    vals = {"samples": 60, "requests_per_s_min": 2.0, "requests_per_s_avg": 2.0, "requests_per_s_max": 2.0,
            "requests_per_s_n": 60, "requests_finished_min": 2, "requests_finished_avg": 2.0,
            "requests_finished_max": 2, "requests_finished_n": 60}
    c.execute("BEGIN")
    c.executemany(f"INSERT INTO {chunk_table('serving_samples')} (start_ms, gpu, end_ms, rows, data) "
                  "VALUES (?, ?, ?, ?, ?)", rows)
    c.executemany(f"INSERT INTO {rollup_table('serving', '1m')} (ts_ms, {', '.join(rcols)}) "
                  f"VALUES (?{', ?' * len(rcols)})",
                  [(T0 + m * MINUTE, *(vals.get(n) for n in rcols)) for m in range(day // MINUTE)])
    c.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('rollup_wm_serving_1m', ?)", (str(T0 + day),))
    c.execute("COMMIT")
    c.close()


def test_a_day_long_runs_summary_decodes_no_serving_chunk(tmp_path):
    """Before: 86,400 rows decoded (11 s on the loaded dev machine) and kept in the reader's temp table."""
    db = tmp_path / "h.db"
    _one_day_run(db)
    with StoreReader(db) as r:
        t = time.perf_counter()
        serving = r.run(1).summary["serving"]
        took = time.perf_counter() - t
        decoded = (r.conn.execute("SELECT count(*) FROM temp._dec_serving_samples").fetchone()[0]
                   if "serving_samples" in r._decoded else 0)
    assert serving["samples"] == 86_400 and serving["requests_finished"] == 2 * 86_400
    assert serving["requests_per_s"] == 2.0
    assert decoded == 0, f"the summary decoded {decoded} serving rows in {took:.1f} s"
    assert took < 5.0  # 1,440 rollup rows; generous for a loaded machine (it was 11 s)


def _compacted_run(path: Path, hours: int) -> None:
    """Run 1 of `hours` of compacted 1 Hz serving rows (no rollups: a summary of it is read raw)."""
    c = connect_rw(path)
    c.execute("INSERT INTO runs (id, profile, started_ms, ended_ms) VALUES (1, 'p', ?, ?)",
              (T0, T0 + hours * 3_600_000))
    cols = compact.columns(c, "serving_samples")
    rows = []
    for k in range(hours * 6):
        start = T0 + k * compact.CHUNK_MS
        chunk = [tuple({"ts_ms": start + i * 1000, "run_id": 1, "scrape_ok": 1, "requests_finished": 1}.get(col)
                       for col in cols) for i in range(600)]
        rows.append((start, 0, start + compact.CHUNK_MS, 600, codec.encode(cols, chunk)))
    c.execute("BEGIN")
    c.executemany(f"INSERT INTO {chunk_table('serving_samples')} (start_ms, gpu, end_ms, rows, data) "
                  "VALUES (?, ?, ?, ?, ?)", rows)
    c.execute("COMMIT")
    c.close()


def test_a_large_one_shot_read_keeps_no_decoded_rows(tmp_path):
    """A 6-hour summary read raw decodes 21,600 serving rows; the reader (in the agent: for the life of the
    process) keeps neither them nor the memory they took, while a small read's rows are kept for the next one."""
    db = tmp_path / "h.db"
    _compacted_run(db, 6)
    with StoreReader(db) as r:
        _, small = r.series("serving", ["requests_finished"], T0, T0 + 15 * MINUTE, resolution="raw")
        assert len(small) == 900
        kept = r.conn.execute("SELECT count(*) FROM temp._dec_serving_samples").fetchone()[0]
        assert kept == 1200  # two ten-minute chunks, kept for a chart's next refresh
        pages_small = r.conn.execute("PRAGMA temp.page_count").fetchone()[0]
        serving = r.run(1).summary["serving"]
        assert serving["samples"] == 21_600 and serving["requests_finished"] == 21_600
        left = r.conn.execute("SELECT count(*) FROM temp._dec_serving_samples").fetchone()[0]
        pages = r.conn.execute("PRAGMA temp.page_count").fetchone()[0]
        assert left == 0, f"the reader keeps {left} decoded rows after a summary"
        assert pages <= pages_small, f"the reader's temp tables keep {pages} pages after a summary"
        # and the next read still works (the table is reloaded)
        _, again = r.series("serving", ["requests_finished"], T0, T0 + 15 * MINUTE, resolution="raw")
        assert again == small
