"""The queue of non-tick writes is bounded during a write outage: a read-only database (what a read-only remount
gives) and events coming steadily keep at most `ops_max` writes in memory; beyond, the OLDEST events are dropped
and counted, never a run's row or its updates; `store.writes_resumed` tells how many events were lost. A real
SQLite file, the real writer thread."""

from __future__ import annotations

import json
import sqlite3

from support.writer_faults import read_only

from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.store.writer import StoreWriter

from .helpers import submit


def test_events_held_during_an_outage_are_capped_oldest_dropped_and_counted(tmp_path):
    db = tmp_path / "h.db"
    w = StoreWriter(db, retry_interval_s=0.05)
    w.ops_max = 50
    w.start()
    try:
        submit(w, 3, gpus=2)
        assert w.flush(10)
        read_only(w, True)  # SQLITE_READONLY on every write from now on
        rid = w.create_run(profile="before")  # a run's row first in the queue: older than every event
        for i in range(200):
            w.record(Event(EventKind.SCRAPE_OUTAGE, Severity.WARNING, f"event {i}"))
            if i == 100:
                w.update_run(rid, vllm_version="0.32.0")  # a run's update amid the events: kept too
        assert not w.flush(0.5)  # the outage holds them
        assert w.stats()["queued"] <= 50 + 1, w.stats()  # bounded (ticks apart): not 202 writes
        read_only(w, False)  # writes resume
        assert w.flush(10)
        assert w.flush(10)  # the store's own resumed event, recorded by the thread
    finally:
        w.close()
    c = sqlite3.connect(db)
    assert c.execute("SELECT profile, vllm_version FROM runs WHERE id = ?", (rid,)).fetchall() == [
        ("before", "0.32.0")]
    kept = [m for (m,) in c.execute("SELECT message FROM events WHERE kind = 'scrape.outage' ORDER BY id")]
    n = len(kept)
    assert kept == [f"event {i}" for i in range(200 - n, 200)], kept[:3]  # the newest kept, in order
    # 50 held: the run's two writes and 48 events (the store's own write_failed among them if it came late)
    failed = c.execute("SELECT count(*) FROM events WHERE kind = 'store.write_failed'").fetchone()[0]
    assert n + failed == 48, (n, failed)
    resumed = c.execute("SELECT severity, message, details FROM events WHERE kind = 'store.writes_resumed'")
    (severity, message, details), = resumed.fetchall()
    assert json.loads(details) == {"dropped_ticks": 0, "dropped_events": 153}, details  # 200 + write_failed - 48
    assert severity == "warning" and "the oldest 153 events" in message, message


def test_a_healthy_writer_drops_nothing(tmp_path):
    w = StoreWriter(tmp_path / "h.db")
    w.ops_max = 50
    w.start()
    try:
        for i in range(300):
            w.record(Event(EventKind.SCRAPE_OUTAGE, Severity.WARNING, f"event {i}"))
            if i % 40 == 0:
                assert w.flush(10)
        assert w.flush(10)
    finally:
        w.close()
    c = sqlite3.connect(tmp_path / "h.db")
    assert c.execute("SELECT count(*) FROM events WHERE kind = 'scrape.outage'").fetchone()[0] == 300
