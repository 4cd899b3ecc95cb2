"""Retention prunes the runs table too (session 18).

One row per server start was kept forever: a node whose vLLM crash-loops, or whose operators switch profiles
all day, grew it without bound while every sample of those runs had long expired. A run row now goes once it
ended longer ago than the longest retention (hour_days) and before the oldest row still stored, and nothing
refers to it any more (an event, a serving sample, a benchmark result); the open run and the newest run are
never deleted. Real SQLite file, written by the real writer; retention passes run on it as the writer runs them.
"""

from __future__ import annotations

import sqlite3
import time

import pytest

from lynxtop.contract.config import Retention
from lynxtop.contract.events import Event, EventKind
from lynxtop.store import retention
from lynxtop.store.writer import StoreWriter

from .helpers import gpu_row, host_row, serving_row

HOUR, DAY = 3_600_000, 86_400_000
NOW = (int(time.time() * 1000) // HOUR) * HOUR
POLICY = Retention(raw_days=1, minute_days=2, hour_days=3)
ROLLED = {(k, r): NOW for k in ("gpu", "host", "serving") for r in ("1m", "1h")}  # everything rolled up


def _tick(w: StoreWriter, ts: int, run_id: int | None = None) -> None:
    w.submit_tick(ts, [gpu_row(0, 0)], host_row(0), serving_row(0, run_id))


def _ended(w: StoreWriter, profile: str, ended_ms: int | None, started_ms: int | None = None) -> int:
    start = started_ms if started_ms is not None else (ended_ms or NOW) - HOUR
    return w.create_run(profile=profile, started_ms=start, ended_ms=ended_ms, exit_code=1, end_reason="crashed")


def _passes(c: sqlite3.Connection, watermarks=ROLLED, chunk: int = retention.CHUNK_ROWS) -> int:
    """Retention passes until nothing more to do (as the writer repeats them); how many it took."""
    for n in range(1, 1000):
        _, more = retention.step(c, POLICY, NOW, watermarks, chunk)
        if not more:
            return n
    raise AssertionError("retention never finished")


def _ids(c: sqlite3.Connection) -> dict[str, int]:
    return {p: i for i, p in c.execute("SELECT id, profile FROM runs")}


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "h.db"
    with StoreWriter(path, queue_max=10_000) as w:
        ids = {}
        for i in range(30):  # a crash loop four days ago: nothing of it is left but its run rows
            ids[f"loop{i}"] = _ended(w, f"loop{i}", NOW - 4 * DAY + i * 60_000)
        for profile in ("evented", "benched", "sampled"):
            ids[profile] = _ended(w, profile, NOW - 4 * DAY)
        _ended(w, "recent", NOW - 2 * DAY)  # within the 3 days of hourly history: its charts still exist
        _ended(w, "open", None, started_ms=NOW - 10 * DAY)  # the server still running (or adopted)
        _ended(w, "newest", NOW - 4 * DAY)  # the highest id: kept, so ids are never given out twice
        w.record(Event(EventKind.SERVING_CRASH, "error", "run still talked about", run_id=ids["evented"],
                       ts_ms=NOW - DAY))
        w.add_bench_result({"ts_ms": NOW - 4 * DAY, "run_id": ids["benched"], "profile": "benched"})
        _tick(w, NOW - HOUR, run_id=ids["sampled"])  # a late sample naming it (e.g. held back from retention)
        _tick(w, NOW)
    return path


def test_old_unreferenced_ended_runs_are_deleted_the_rest_kept(db):
    c = sqlite3.connect(db, isolation_level=None)
    assert len(_ids(c)) == 36
    _passes(c)
    assert sorted(_ids(c)) == ["benched", "evented", "newest", "open", "recent", "sampled"]
    # once what referred to a run is gone, the run goes at the next pass
    c.execute("DELETE FROM events WHERE run_id = (SELECT id FROM runs WHERE profile = 'evented')")
    c.execute("DELETE FROM serving_samples WHERE run_id = (SELECT id FROM runs WHERE profile = 'sampled')")
    _passes(c)
    assert sorted(_ids(c)) == ["benched", "newest", "open", "recent"]
    assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_runs_are_deleted_a_bounded_number_per_pass(db):
    c = sqlite3.connect(db, isolation_level=None)
    _, more = retention.step(c, POLICY, NOW, ROLLED, chunk=10)
    assert more and len(_ids(c)) == 36 - 10  # the oldest ten, and more said to remain
    assert _passes(c, chunk=10) >= 2
    assert sorted(_ids(c)) == ["benched", "evented", "newest", "open", "recent", "sampled"]


def test_a_run_whose_time_is_still_stored_is_kept(tmp_path):
    """Raw rows not yet rolled up are never deleted (no watermark); a run within their time stays with them."""
    path = tmp_path / "h.db"
    with StoreWriter(path, queue_max=10_000) as w:
        _ended(w, "covered", NOW - 4 * DAY)
        _ended(w, "newest", None)
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("INSERT INTO host_samples (ts_ms, cpu_pct) VALUES (?, 1), (?, 1)", (NOW - 5 * DAY, NOW))
    _passes(c, watermarks={})  # nothing rolled up: the raw host rows of five days ago stay
    assert sorted(_ids(c)) == ["covered", "newest"]
    _passes(c, watermarks=ROLLED)  # rolled up: the raw row goes, and with it the last trace of the run's time
    assert c.execute("SELECT min(ts_ms) FROM host_samples").fetchone()[0] == NOW
    assert sorted(_ids(c)) == ["newest"]


def test_the_clock_ahead_of_the_data_deletes_no_run(db):
    """Ages are measured from the newest stored sample: a wall clock ten days ahead expires nothing more."""
    c = sqlite3.connect(db, isolation_level=None)
    retention.step(c, POLICY, NOW, ROLLED)
    before = sorted(_ids(c))
    for _ in range(3):
        retention.step(c, POLICY, NOW + 10 * DAY, ROLLED)
    assert sorted(_ids(c)) == before


@pytest.mark.timeout(60)
def test_the_writer_prunes_runs_as_it_runs(tmp_path):
    """End to end: the agent's writer, its maintenance passes on their own schedule."""
    path = tmp_path / "h.db"
    w = StoreWriter(path, retention=POLICY, queue_max=10_000, clock=lambda: NOW / 1000, maintenance_interval_s=0.05)
    for i in range(5):
        _ended(w, f"old{i}", NOW - 4 * DAY + i)
    live = _ended(w, "live", None, started_ms=NOW - HOUR)
    for i in range(3):
        _tick(w, NOW - 120_000 + i * 60_000, run_id=live)
    w.start()
    try:
        assert w.flush(20)
        c = sqlite3.connect(path)
        deadline = time.monotonic() + 30
        while c.execute("SELECT count(*) FROM runs").fetchone()[0] > 1:
            assert time.monotonic() < deadline, _ids(c)
            time.sleep(0.05)
        assert _ids(c) == {"live": live}
    finally:
        w.close()
