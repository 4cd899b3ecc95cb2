"""One event path (issue 27.3): an event is written once, published once and logged once, in that order.

Before: events reached the store by four routes (the supervisor's own write-and-log, the node's write without a
log line, the Ray roles through the node, `StoreWriter.add_event`), so some events were logged and some not, and
nothing could subscribe to them.
"""

from __future__ import annotations

import logging
import os

import pytest
from support.node import close_node, open_node
from support.waits import wait_for

from lynxtop.agent.events import EventSink
from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.store.reader import StoreReader
from lynxtop.store.writer import StoreWriter

pytestmark = pytest.mark.timeout(60)


class _Steps:
    """Records, in one list, what the writer, a subscriber and the logger saw."""

    def __init__(self, fail_write: bool = False) -> None:
        self.steps: list[tuple[str, str]] = []
        self.fail_write = fail_write

    def record(self, ev: Event) -> None:  # the writer
        self.steps.append(("write", ev.message))
        if self.fail_write:
            raise OSError(28, "No space left on device")

    def subscriber(self, ev: Event) -> None:
        self.steps.append(("publish", ev.message))


class _LogSteps(logging.Handler):
    def __init__(self, steps: _Steps) -> None:
        super().__init__()
        self.target = steps

    def emit(self, record: logging.LogRecord) -> None:
        self.target.steps.append(("log", record.getMessage()))


def _sink(steps: _Steps, **kw) -> EventSink:
    logger = logging.getLogger(f"test.events.{id(steps)}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(_LogSteps(steps))
    sink = EventSink(steps, logger, **kw)
    sink.subscribe(steps.subscriber)
    return sink


def test_an_event_is_written_then_published_then_logged_once_each():
    steps = _Steps()
    ev = _sink(steps).emit(EventKind.SERVING_READY, Severity.INFO, "run 3: ready", {"load_s": 1.0}, run_id=3)
    assert steps.steps == [("write", "run 3: ready"), ("publish", "run 3: ready"),
                           ("log", "serving.ready: run 3: ready")]
    assert (ev.kind, ev.run_id, ev.details) == (EventKind.SERVING_READY, 3, {"load_s": 1.0})


def test_a_store_that_refuses_an_event_still_lets_it_be_published_and_logged():
    steps = _Steps(fail_write=True)
    failures: list[str] = []
    sink = _sink(steps, on_write_error=lambda ev, exc: failures.append(f"{ev.kind}: {exc}"))
    sink.put(Event(EventKind.GPU_LOST, Severity.CRITICAL, "GPU 2 lost"))
    assert [s for s, _ in steps.steps] == ["write", "publish", "log"]
    assert failures == ["gpu.lost: [Errno 28] No space left on device"]


def test_an_unsubscribed_or_broken_subscriber_gets_nothing_and_stops_nothing():
    steps = _Steps()
    sink = _sink(steps)
    seen: list[str] = []
    stop = sink.subscribe(seen.append)
    sink.subscribe(lambda ev: 1 / 0)  # a broken subscriber: the event still reaches the log
    sink.emit(EventKind.SLA_BREACH, Severity.WARNING, "first")
    stop()
    sink.emit(EventKind.SLA_RECOVERED, Severity.INFO, "second")
    assert [e.message for e in seen] == ["first"]
    assert [m for s, m in steps.steps if s == "log" and m.startswith("sla.")] == ["sla.breach: first",
                                                                              "sla.recovered: second"]


def test_the_real_node_writes_publishes_and_logs_its_event_once(tmp_path, h, caplog):
    """A node with its real store: the agent's start event is one row, one published event, one log line."""
    node = open_node(h.write_config(tmp_path, 'sample_interval_s = 0.1\nfake_nvml = "h200x8"'))
    published: list[Event] = []
    try:
        node.event_sink.subscribe(published.append)
        with caplog.at_level(logging.INFO, logger="lynxtop.agent"):
            node._record([Event(EventKind.AGENT_CLOCK_STEP, Severity.WARNING, "the wall clock was stepped (test)")])
            # the supervisor's events take the same path
            node.supervisor._event(EventKind.PREFLIGHT_WARNING, Severity.WARNING, "profile alpha: a test warning")
    finally:
        close_node(node)
    rows = h.db_rows(tmp_path / "state" / "lynxtop.db", "SELECT kind, message FROM events WHERE kind IN (?, ?)",
                     (EventKind.AGENT_CLOCK_STEP, EventKind.PREFLIGHT_WARNING))
    assert sorted((r["kind"], r["message"]) for r in rows) == [
        ("agent.clock_step", "the wall clock was stepped (test)"),
        ("preflight.warning", "profile alpha: a test warning")]
    assert [e.kind for e in published] == [EventKind.AGENT_CLOCK_STEP, EventKind.PREFLIGHT_WARNING]
    lines = [r.getMessage() for r in caplog.records]
    assert lines.count("agent.clock_step: the wall clock was stepped (test)") == 1
    assert lines.count("preflight.warning: profile alpha: a test warning") == 1


def test_a_store_event_reaches_subscribers_once_and_is_stored_and_logged_once(tmp_path, h, caplog):
    """The store's own events take the one path (issue 27.3): the writer is handed the sink (`on_event`), since
    store/ may not import the agent. Before, a `store.*` event was written and logged by the writer alone and no
    subscriber ever saw it."""
    db = tmp_path / "state" / "lynxtop.db"
    node = open_node(h.write_config(tmp_path, 'sample_interval_s = 0.1\nfake_nvml = "h200x8"'))
    published: list[Event] = []
    try:
        node.event_sink.subscribe(published.append)
        with caplog.at_level(logging.INFO):
            os.unlink(db)  # `rm lynxtop.db` on a live node: the writer's file check makes a store.db_unlinked event
            wait_for(lambda: [e for e in published if e.kind == EventKind.STORE_DB_UNLINKED], timeout=30,
                     what="the store's db_unlinked event published to the subscriber")
            assert node.writer.flush()
    finally:
        close_node(node)
    store_events = [e for e in published if str(e.kind).startswith("store.")]
    assert [e.kind for e in store_events] == [EventKind.STORE_DB_UNLINKED]
    msg = store_events[0].message
    rows = h.db_rows(db, "SELECT kind, message FROM events WHERE kind LIKE 'store.%'")
    assert [(r["kind"], r["message"]) for r in rows] == [("store.db_unlinked", msg)]
    assert [r.getMessage() for r in caplog.records if msg in r.getMessage()] == [f"store.db_unlinked: {msg}"]


def test_a_store_event_made_while_opening_is_stored_and_logged_once(tmp_path, h, caplog):
    """A damaged file moved aside as the node opens: the event waits for the sink (which needs the open store),
    then is one row and one log line. Before, the writer and the node each logged it and the sink never saw it."""
    db = tmp_path / "state" / "lynxtop.db"
    db.parent.mkdir(parents=True)
    db.write_text("# not a database\n" * 50)
    with caplog.at_level(logging.INFO):
        node = open_node(h.write_config(tmp_path, 'sample_interval_s = 0.1\nfake_nvml = "h200x8"'))
        close_node(node)
    rows = h.db_rows(db, "SELECT kind, message FROM events WHERE kind LIKE 'store.%'")
    assert [r["kind"] for r in rows] == ["store.moved_aside"]
    aside = str(node.writer.moved_aside)
    assert [r.getMessage() for r in caplog.records if aside in r.getMessage()] == [
        f"store.moved_aside: {rows[0]['message']}"]


def test_the_writers_opening_event_waits_for_start_then_takes_the_sink_once(tmp_path, caplog):
    """The real writer and the real sink, no node: a damaged file moved aside while the writer opens makes a
    `store.moved_aside` event that the writer neither writes nor logs itself; it is handed to `on_event` at start(),
    when the sink (which needs the open writer) exists, and is then one row, one published event, one log line."""
    db = tmp_path / "lynxtop.db"
    db.write_text("# not a database\n" * 50)
    sink: EventSink | None = None
    handed: list[Event] = []

    def on_event(ev: Event) -> None:
        handed.append(ev)
        sink.put(ev)

    with caplog.at_level(logging.INFO):
        writer = StoreWriter(db, on_event=on_event)
        try:
            assert handed == [] and not caplog.records  # held: nobody to take it yet, nothing logged here
            sink = EventSink(writer, logging.getLogger("lynxtop.agent.test_events"))
            published: list[Event] = []
            sink.subscribe(published.append)
            writer.start()
            assert writer.flush()
        finally:
            writer.close()
    assert [e.kind for e in handed] == [e.kind for e in published] == [EventKind.STORE_MOVED_ASIDE]
    rows = StoreReader(db).events(kinds=["store.moved_aside"])
    assert [e.message for e in rows] == [handed[0].message]
    assert [r.getMessage() for r in caplog.records if str(writer.moved_aside) in r.getMessage()] == [
        f"store.moved_aside: {handed[0].message}"]
