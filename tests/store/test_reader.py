"""The read-only reader: resolution choice, series shapes, latest, events paging, errors naming the path."""

from __future__ import annotations

import sqlite3

import pytest

from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.store.errors import NotOurDatabase, StoreError
from lynxtop.store.reader import StoreReader
from lynxtop.store.writer import StoreWriter

from .helpers import T0, submit

DAY = 86_400_000


def test_resolution_keeps_points_under_the_limit(tmp_path):
    db = tmp_path / "h.db"
    StoreWriter(db).close()
    r = StoreReader(db)
    assert r.choose_resolution(T0, T0 + 30 * 60_000) == "raw"  # 1800 points
    assert r.choose_resolution(T0, T0 + DAY) == "1m"  # 86400 raw -> 1440
    assert r.choose_resolution(T0, T0 + 30 * DAY) == "1h"  # 720
    assert r.choose_resolution(T0, T0 + 3 * 3_600_000, max_points=100) == "1h"


def test_series_raw_and_rollup_shapes(tmp_path):
    db = tmp_path / "h.db"
    with StoreWriter(db, queue_max=5000) as w:
        submit(w, 180, gpus=2, null_every=5)
    r = StoreReader(db)
    res, rows = r.series("gpu", ["power_w", "sm_active_pct"], T0, T0 + 180_000, gpu=1)
    assert res == "raw" and len(rows) == 180 and set(rows[0]) == {"ts_ms", "gpu", "power_w", "sm_active_pct"}
    assert rows[0]["sm_active_pct"] is None  # NULL stays None, never 0
    res, rows = r.series("gpu", ["power_w"], T0, T0 + 180_000, resolution="1m")
    assert res == "1m" and [(x["ts_ms"], x["gpu"]) for x in rows] == [
        (T0 + m * 60_000, g) for m in range(3) for g in range(2)]
    assert all(x["samples"] == 60 for x in rows)  # the third minute comes from raw (not rolled up yet)
    assert rows[0]["power_w_min"] <= rows[0]["power_w_avg"] <= rows[0]["power_w_max"]
    res, rows = r.series("host", ["cpu_pct"], T0, T0 + 10_000)
    assert res == "raw" and len(rows) == 10
    with pytest.raises(ValueError, match="unknown column"):
        r.series("gpu", ["bogus"], T0, T0 + 1)
    with pytest.raises(ValueError, match="unknown series table"):
        r.series("disk", None, T0, T0 + 1)


def test_latest_and_events_paging(tmp_path):
    db = tmp_path / "h.db"
    with StoreWriter(db) as w:
        submit(w, 5, gpus=3)
        w.submit_tick(T0 + 5000, [], None, None, [], [{"gpu": 0, "pid": 77, "used_mem_bytes": 5, "in_vllm_tree": 1}])
        for i in range(10):
            w.record(Event(EventKind.SERVING_PHASE, "info", f"e{i}", ts_ms=T0 + i))
    r = StoreReader(db)
    rows = r.latest("gpu", n=2)
    assert [(x["ts_ms"], x["gpu"]) for x in rows] == [(T0 + 4000, g) for g in range(3)] + [
        (T0 + 3000, g) for g in range(3)]
    assert [x["ts_ms"] for x in r.latest("gpu", n=2, gpu=1)] == [T0 + 4000, T0 + 3000]
    assert r.latest("host")[0]["ts_ms"] == T0 + 4000
    assert r.latest("processes")[0]["pid"] == 77
    assert [e.message for e in r.events(limit=3)] == ["e7", "e8", "e9"]  # newest 3, oldest first
    page = r.events(since_ms=T0, limit=4)
    assert [e.message for e in page] == ["e0", "e1", "e2", "e3"]
    assert [e.message for e in r.events(after_id=page[-1].id, limit=2)] == ["e4", "e5"]


def test_reader_is_read_only_and_errors_name_the_path(tmp_path):
    missing = tmp_path / "absent.db"
    with pytest.raises(StoreError, match=str(missing)):
        StoreReader(missing)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(NotOurDatabase, match=f"{junk}.*not an SQLite"):
        StoreReader(junk)
    db = tmp_path / "h.db"
    StoreWriter(db).close()
    r = StoreReader(db)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        r.conn.execute("DELETE FROM runs")


def test_events_of_older_agents_read_with_the_dotted_names(tmp_path):
    db = tmp_path / "h.db"
    with StoreWriter(db) as w:
        w.record(Event("gpu.xid", "error", "new xid", ts_ms=T0 + 2))
        w.record(Event("scrape_outage", "warning", "old name through the writer", ts_ms=T0 + 3))
    c = sqlite3.connect(db)  # rows as an agent before the dotted names stored them
    c.executemany("INSERT INTO events (ts_ms, kind, severity, message) VALUES (?, ?, ?, ?)",
                  [(T0, "xid", "error", "old xid"), (T0 + 1, "sla_breach", "warning", "old breach"),
                   (T0 + 4, "store", "warning", "old store trouble"),
                   (T0 + 5, "something_unknown", "info", "a kind no lynxtop writes")])
    c.commit()
    assert c.execute("SELECT kind FROM events WHERE ts_ms = ?", (T0 + 3,)).fetchone()[0] == "scrape.outage"
    c.close()
    r = StoreReader(db)
    assert [(e.kind, e.message) for e in r.events(since_ms=T0, until_ms=T0 + 5)] == [
        ("gpu.xid", "old xid"), ("sla.breach", "old breach"), ("gpu.xid", "new xid"),
        ("scrape.outage", "old name through the writer"), ("store", "old store trouble")]
    assert [e.message for e in r.events(kinds=["gpu.xid"])] == ["old xid", "new xid"]
    assert [e.message for e in r.events(kinds=["xid"])] == ["old xid", "new xid"]  # an old name still filters
    # a kind this lynxtop does not know (a newer agent's) is a clear error naming the row, never a silent default
    with pytest.raises(StoreError, match=r"events row 6 .*Event\.kind: unknown kind 'something_unknown'"):
        r.events(kinds=["sla.breach", "something_unknown"])


def test_record_takes_an_event(tmp_path):
    db = tmp_path / "h.db"
    with StoreWriter(db) as w:
        w.record(Event(EventKind.SLA_RECOVERED, Severity.INFO, "back", {"window_s": 60}, ts_ms=T0))
        with pytest.raises(ValueError, match="severity"):
            w.record(Event(EventKind.SLA_BREACH, "loud", "x"))  # type: ignore[arg-type]
    (e,) = StoreReader(db).events()
    assert (e.kind, e.severity, e.message, e.details, e.ts_ms) == (
        "sla.recovered", "info", "back", {"window_s": 60}, T0)
