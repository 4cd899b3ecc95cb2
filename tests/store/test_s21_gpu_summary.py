"""A long run's per-GPU summary from the 1-minute rollups equals the one read from its raw rows.

Past RAW_SUMMARY_MAX_MS `StoreReader.run(id)` reads the GPU part from gpu_1m. It counted the whole minutes from the
first one starting at or after the run's start, so the rows of the run's partial first minute were skipped, and a
rollup minute running past an unaligned end was counted whole (the next run's rows). GPU rows carry no run id:
the summary is every GPU row in [start, end), so these tests put another run's very different readings right
before and after the run (inside its first and last minutes) and compare every field of every GPU both ways, over
rows written and rolled up by the real writer, with NULL stretches, GPUs seen only part of the run, compacted
chunks and a watermark that lags mid-run.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from lynxtop.contract.columns import GPU_METRICS, names
from lynxtop.store import compact
from lynxtop.store import reader as reader_mod
from lynxtop.store.reader import StoreReader
from lynxtop.store.schema import connect_rw
from lynxtop.store.writer import StoreWriter

from .helpers import T0

MINUTE = 60_000
START = T0 + 20 * MINUTE + 37_400  # run 2 starts 37.4 s into a minute (run 1's rows fill the start of it)
END = START + 2 * 3_600_000 + 11_250  # and ends mid-minute too (run 3's rows fill the rest of that minute)
FIRST = START - START % MINUTE + MINUTE  # run 2's first whole minute
STEP = 1000
AVERAGES = ("util_gpu_pct", "sm_active_pct", "power_w")


def _gpu(gpu: int, i: int, ts: int) -> dict:
    """One GPU row. Runs 1 and 3 read far outside run 2's ranges (and their energy counter far below / above), so
    any of their rows counted in run 2's summary changes it; run 2 has NULL stretches and odd gaps."""
    row: dict = {n: None for n in names(GPU_METRICS)}
    row["gpu"] = gpu
    if not START <= ts < END:  # another run's rows
        row.update(util_gpu_pct=100, sm_active_pct=100, power_w=990, mem_used_bytes=190 * 10**9, temp_c=140,
                   energy_j=(10**6 if ts < START else 10**13) + i)
        return row
    h = (i * 7919 + gpu * 104_729) % 1000  # deterministic, varied
    row.update(util_gpu_pct=h % 61, sm_active_pct=(h * 3) % 53, power_w=100 + h % 300,
               mem_used_bytes=(20 + h % 40) * 10**9 + gpu, temp_c=30 + h % 50, energy_j=10**9 + 300 * i + gpu)
    if gpu == 1 and i % 600 < 200:  # whole minutes without GPM readings on GPU 1
        row["sm_active_pct"] = None
    if i % 13 == 0:
        row["temp_c"] = None  # an odd reading not taken
    if gpu == 0 and i % 11 == 0:
        row["power_w"] = None
    return row


def _gpus(ts: int) -> list[int]:
    """Which GPUs report at `ts`: 0 and 1 throughout; 2 for run 2's first 15 minutes and the other runs; 3 only in
    run 2's partial first minute (a GPU the whole-minute rollups never see inside the run)."""
    if not START <= ts < END:
        return [0, 1, 2]
    gpus = [0, 1]
    if ts < START + 15 * MINUTE:
        gpus.append(2)
    if ts < FIRST:
        gpus.append(3)
    return gpus


def _history(db: Path, *, ended: bool = True) -> None:
    """Runs 1, 2, 3 back to back at 1 Hz, written and rolled up by the real writer; run 2 is summarised."""
    with StoreWriter(db, queue_max=20_000) as w:
        w.create_run(1, profile="p", started_ms=T0, ended_ms=START - 1)
        w.create_run(2, profile="p", started_ms=START, ended_ms=END if ended else None)
        if ended:
            w.create_run(3, profile="p", started_ms=END + 1)
        ts, i = T0 + 400, 0  # on START's millisecond: a row exactly at the run's start
        last = END + 30 * MINUTE if ended else END
        while ts <= last:
            w.submit_tick(ts, [_gpu(g, i, ts) for g in _gpus(ts)])
            ts, i = ts + STEP, i + 1
        assert w.flush(60)


def _compact_around_start(db: Path) -> None:
    """Move the GPU rows around run 2's start (and so its partial first minute) into chunks, as after 3 hours."""
    c = connect_rw(db)
    try:
        first = START - START % compact.CHUNK_MS - compact.CHUNK_MS
        for k in range(4):
            assert compact.compact_interval(c, "gpu_samples", first + k * compact.CHUNK_MS) > 0
    finally:
        c.close()


def _lag_watermark(db: Path, wm: int) -> None:
    """The GPU rollups as they are while the writer is behind: rolled up to `wm` only."""
    c = sqlite3.connect(db)
    c.execute("DELETE FROM gpu_1m WHERE ts_ms >= ?", (wm,))
    c.execute("UPDATE meta SET value = ? WHERE key = 'rollup_wm_gpu_1m'", (str(wm),))
    assert c.total_changes > 0
    c.commit()
    c.close()


def _both_ways(db: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[dict], list[dict], int]:
    """Run 2's GPU summary read raw (the bound set past the run) and by the rollup path; and how many GPU rows the
    rollup path decoded from chunks."""
    monkeypatch.setattr(reader_mod, "RAW_SUMMARY_MAX_MS", 10**13)
    with StoreReader(db) as r:
        raw = r.run(2).summary["gpus"]
    monkeypatch.setattr(reader_mod, "RAW_SUMMARY_MAX_MS", 10 * MINUTE)
    with StoreReader(db) as r:
        rolled = r.run(2).summary["gpus"]
        decoded = (r.conn.execute("SELECT count(*) FROM temp._dec_gpu_samples").fetchone()[0]
                   if "gpu_samples" in r._decoded else 0)
    return raw, rolled, decoded


def _same(raw: list[dict], rolled: list[dict]) -> None:
    assert [g["gpu"] for g in rolled] == [g["gpu"] for g in raw]
    for a, b in zip(raw, rolled, strict=True):
        assert list(b) == list(a), a["gpu"]  # the same fields, in the same order
        for k, v in a.items():
            if k in AVERAGES:  # float rounding only
                assert b[k] == (None if v is None else pytest.approx(v, rel=1e-9)), (a["gpu"], k)
            else:  # counts, maxima, the energy counter's span: exact
                assert b[k] == v and type(b[k]) is type(v), (a["gpu"], k, v, b[k])


def _check_raw(raw: list[dict]) -> None:
    """The raw summary (the reference) is run 2's rows only, and the data covers what the test means to."""
    by = {g["gpu"]: g for g in raw}
    assert sorted(by) == [0, 1, 2, 3]
    assert by[0]["samples"] == by[1]["samples"] == (END - START) // STEP + 1
    assert by[3]["samples"] == (FIRST - START) // STEP + 1
    assert by[2]["samples"] == 15 * MINUTE // STEP
    for g in raw:
        assert g["util_gpu_pct"] < 61 and g["temp_max_c"] < 80 and g["mem_used_max_bytes"] < 60 * 10**9
        assert 0 < g["energy_j"] < 10**8  # neither run 1's counter nor run 3's


def test_gpu_rollup_summary_equals_the_raw_one(tmp_path, monkeypatch):
    db = tmp_path / "h.db"
    _history(db)
    raw, rolled, _ = _both_ways(db, monkeypatch)
    _check_raw(raw)
    _same(raw, rolled)


def test_gpu_rollup_summary_equals_the_raw_one_over_chunks_and_a_lagging_watermark(tmp_path, monkeypatch):
    db = tmp_path / "h.db"
    _history(db)
    _compact_around_start(db)
    _lag_watermark(db, START + 3_600_000 + 17 * MINUTE + 25_000)  # not even on a minute: still whole minutes
    raw, rolled, decoded = _both_ways(db, monkeypatch)
    _check_raw(raw)
    _same(raw, rolled)
    # the rollups were read: only the chunks of the partial first minute were decoded (4 GPUs), not the 40 minutes
    assert decoded <= 4 * compact.CHUNK_MS // STEP


def test_an_ongoing_runs_gpu_rollup_summary_equals_the_raw_one(tmp_path, monkeypatch):
    db = tmp_path / "h.db"
    _history(db, ended=False)  # no end: summarised up to now, the newest minute not rolled up yet
    raw, rolled, _ = _both_ways(db, monkeypatch)
    assert {g["gpu"]: g["samples"] for g in raw}[0] == (END - START) // STEP + 1
    _same(raw, rolled)
