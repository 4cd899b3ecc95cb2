"""`StoreWriter.pending_events()`: the events the writer holds while the database refuses writes (a read-only
remount: `PRAGMA query_only` gives SQLite's real SQLITE_READONLY), as copies marked pending, oldest first, and
never missing while the thread retries them. A real SQLite file, the real writer thread."""

from __future__ import annotations

import sqlite3
import time

from support.writer_faults import read_only

from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.store.writer import StoreWriter


def _kinds(events: list[Event]) -> list[str]:
    return [str(e.kind) for e in events]


def test_pending_events_lists_held_events_until_they_are_written(tmp_path):
    db = tmp_path / "h.db"
    w = StoreWriter(db, retry_interval_s=0.01)
    w.start()
    try:
        w.record(Event(EventKind.SCRAPE_OUTAGE, Severity.WARNING, "written before"))
        assert w.flush(10)
        assert w.pending_events() == []  # nothing held while writes succeed
        read_only(w, True)  # SQLITE_READONLY on every write from now on
        w.record(Event(EventKind.SCRAPE_OUTAGE, Severity.WARNING, "held one", {"n": 1}, run_id=7))
        w.record(Event(EventKind.SLA_BREACH, Severity.ERROR, "held two", ts_ms=1234))
        assert not w.flush(0.3)
        held = w.pending_events()
        # the writer's own store.write_failed is held too (it came through record, here without a sink)
        assert [e.message for e in held if e.kind != EventKind.STORE_WRITE_FAILED] == ["held one", "held two"]
        assert EventKind.STORE_WRITE_FAILED in _kinds(held)
        one = next(e for e in held if e.message == "held one")
        assert one.pending and one.id is None and one.run_id == 7 and one.details == {"n": 1}
        assert one.ts_ms is not None and abs(one.ts_ms - time.time() * 1000) < 60_000  # stamped as it will be stored
        assert next(e for e in held if e.message == "held two").ts_ms == 1234
        assert one.to_json()["pending"] is True
        one.details["n"] = 2  # a copy: the caller cannot change what will be written (checked in the file below)
        # while the thread retries every 10 ms (taking the ops out of its queue each time), none ever goes missing
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            assert {"held one", "held two"} <= {e.message for e in w.pending_events()}
        read_only(w, False)  # writes resume
        assert w.flush(10)
        assert w.flush(10)  # the resumed event the thread recorded
        assert w.pending_events() == []
    finally:
        w.close()
    c = sqlite3.connect(db)
    rows = c.execute("SELECT message, details FROM events WHERE message LIKE 'held%' ORDER BY id").fetchall()
    assert rows == [("held one", '{"n": 1}'), ("held two", None)]


def test_a_stored_event_json_has_no_pending_key():
    """Backward compatible: an event read from the database serialises as before; `pending` is read when present."""
    ev = Event(EventKind.SLA_BREACH, Severity.ERROR, "m", ts_ms=5)
    assert "pending" not in ev.to_json()
    assert Event.from_json({**ev.to_json(), "pending": True}).pending
    assert not Event.from_json(ev.to_json()).pending
