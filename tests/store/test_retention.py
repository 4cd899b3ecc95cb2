"""Retention per resolution, in small chunks; runs and bench results are never deleted; raw rows are kept
until rolled up."""

from __future__ import annotations

import sqlite3
import time

from lynxtop.contract.config import Retention
from lynxtop.contract.events import Event, EventKind
from lynxtop.store import retention
from lynxtop.store.writer import StoreWriter

from .helpers import T0, gpu_row

HOUR = 3_600_000


def _fill(w, hours: float, step: int = 10_000) -> None:
    for i in range(int(hours * HOUR / step)):
        w.submit_tick(T0 + i * step, [gpu_row(g, i) for g in range(2)], {"cpu_pct": 1.0})


def test_retention_per_resolution_keeps_runs(tmp_path):
    db = tmp_path / "h.db"
    policy = Retention(raw_days=1 / 24, minute_days=1.5 / 24, hour_days=2 / 24)
    w = StoreWriter(db, retention=policy, queue_max=10_000, clock=lambda: (T0 + 2 * HOUR) / 1000,
                    retention_chunk=100, maintenance_interval_s=0.1)
    rid = w.create_run(profile="old", started_ms=T0, ended_ms=T0 + 1000, exit_code=0)
    w.add_bench_result({"ts_ms": T0, "profile": "old"})
    w.record(Event(EventKind.SERVING_READY, "info", "old event", ts_ms=T0))
    w.record(Event(EventKind.SERVING_READY, "info", "recent event", ts_ms=T0 + 110 * 60_000))
    _fill(w, 2)
    w.submit_tick(T0 + 2 * HOUR, [gpu_row(g, 720) for g in range(2)], {"cpu_pct": 1.0})  # newest sample: now
    w.start()
    assert w.flush(20)
    c = sqlite3.connect(db)
    deadline = time.monotonic() + 20
    while c.execute("SELECT min(ts_ms) FROM gpu_samples").fetchone()[0] < T0 + HOUR:  # next maintenance pass
        assert time.monotonic() < deadline, "retention did not run"
        time.sleep(0.05)
    w.close()
    assert c.execute("SELECT min(ts_ms) FROM gpu_samples").fetchone()[0] == T0 + HOUR
    assert c.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == 361 * 2
    assert c.execute("SELECT min(ts_ms) FROM host_samples").fetchone()[0] == T0 + HOUR
    assert c.execute("SELECT min(ts_ms) FROM gpu_1m").fetchone()[0] == T0 + HOUR // 2
    assert c.execute("SELECT min(ts_ms) FROM gpu_1h").fetchone()[0] == T0
    assert [r[0] for r in c.execute("SELECT message FROM events WHERE kind = 'serving.ready'")] == ["recent event"]
    assert c.execute("SELECT id FROM runs").fetchall() == [(rid,)]
    assert c.execute("SELECT count(*) FROM bench_results").fetchone()[0] == 1


def test_delete_chunk_is_small_and_raw_waits_for_rollup(tmp_path):
    db = tmp_path / "h.db"
    w = StoreWriter(db, queue_max=10_000)
    _fill(w, 1)
    w.close()  # not started: close() writes inline, rollups run once
    c = sqlite3.connect(db, isolation_level=None)
    n, more = retention.delete_chunk(c, "gpu_samples", T0 + HOUR, chunk=50)
    assert 50 <= n <= 52 and more
    remaining = c.execute("SELECT count(*) FROM gpu_samples").fetchone()[0]
    assert remaining == 720 - n

    # A raw cut-off past the watermark is held back to the watermark: no unrolled data is lost.
    cut = retention.cutoffs(Retention(raw_days=0.0001), T0 + 10 * HOUR, {(k, r): T0 + 600_000 for k in
                                                                          ("gpu", "host", "serving")
                                                                          for r in ("1m", "1h")})
    assert cut["gpu_samples"] == T0 + 600_000 and cut["gpu_processes"] > T0 + 600_000
