"""A wall clock stepped under a running writer (+8 d, then -1 d) deletes no raw row: ages are measured from the
newest stored sample, never from the wall clock alone (issue 24.1)."""

from __future__ import annotations

import sqlite3
import time

from lynxtop.contract.config import Retention
from lynxtop.store import retention
from lynxtop.store.writer import StoreWriter

from .helpers import T0, gpu_row

HOUR, DAY = 3_600_000, 86_400_000


def _tick(w: StoreWriter, ts: int, i: int) -> None:
    w.submit_tick(ts, [gpu_row(g, i) for g in range(2)], {"cpu_pct": 1.0})


def _wait(cond, what: str, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s  # a liveness bound, not a speed check
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_clock_steps_under_a_running_writer_delete_no_raw_row(tmp_path, monkeypatch):
    passes: list[int] = []  # the `now` of every retention pass, after it ran
    real_step = retention.step

    def spy(conn, policy, now_ms, *args, **kwargs):
        out = real_step(conn, policy, now_ms, *args, **kwargs)
        passes.append(now_ms)
        return out

    monkeypatch.setattr(retention, "step", spy)
    offset_ms = [0]
    db = tmp_path / "h.db"
    w = StoreWriter(db, retention=Retention(raw_days=7), queue_max=10_000, maintenance_interval_s=0.05,
                    clock=lambda: time.time() + offset_ms[0] / 1000)
    canary = T0 - 7 * DAY - 12 * HOUR  # older than (newest sample - 7 d): the one row retention must delete
    _tick(w, canary, 0)
    kept = [T0 + i * 10_000 for i in range(2 * 360 + 30)]  # 2 h 5 min: rolled up past the hour mark
    for i, ts in enumerate(kept):
        _tick(w, ts, i)
    w.start()
    c = sqlite3.connect(db)

    def raw_ts() -> list[int]:
        return [r[0] for r in c.execute("SELECT DISTINCT ts_ms FROM gpu_samples ORDER BY ts_ms")]

    try:
        _wait(lambda: raw_ts() and raw_ts()[0] > canary, "retention never deleted the expired row")
        assert raw_ts() == kept
        for step_ms in (8 * DAY, -DAY):  # NTP after a bad RTC, then a clock set back a day
            offset_ms[0] = step_ms
            nxt = kept[-1] + 10_000
            _tick(w, nxt, len(kept))  # the data's own timeline goes on
            kept.append(nxt)
            n0 = len(passes)  # a pass may be under way: wait for three more, the last two surely stepped
            _wait(lambda n0=n0: len(passes) >= n0 + 3, "no retention pass after the step")
            assert abs(passes[-1] - (time.time() * 1000 + step_ms)) < HOUR
            assert w.flush(10)
            assert raw_ts() == kept, f"raw rows lost after a {step_ms / DAY:+g} d step"
            assert c.execute("SELECT count(*) FROM host_samples").fetchone()[0] == len(kept)
    finally:
        w.close()
    assert raw_ts() == kept
