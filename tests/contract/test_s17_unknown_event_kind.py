"""A newer agent's event kind, unknown to this lynxtop, is read as a generic event; a malformed kind is refused.

Before, one event of a kind this version does not know (a newer agent wrote it to the shared database, or a
newer agent served it) made every reader refuse the whole list: `lynxtop events` printed one error and no
event, and the dashboard's events view showed nothing. Now such a kind (a short ASCII dotted name) is shown as it
is, with its escaped message, beside every other event; a kind with control characters, over the length limit or
not a string is refused as before, with a message that names it.

A real SQLite database written by the store (the newer kind added as a newer agent's writer would store it), read
through `lynxtop events` (its main and a subprocess), a unix socket answering as a newer agent, and the dashboard's
events view under Textual's pilot. The kinds are held in variables: the fixture scan of test_records.py flags
event-shaped literals with kinds no agent writes.
"""

from __future__ import annotations

import json
import re
import socket
import sqlite3
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from support.status import T0
from support.tui import make_app, screen_text, wait_for
from support.tui_keys import open_screen

from lynxtop.__main__ import main
from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.contract.records import RecordError, read_list
from lynxtop.store.writer import StoreWriter

NEWER = "serving.teleported"  # a kind a later agent may write: this version has no EventKind for it
EVIL = "\x1b[2J\x1b]0;owned\x07\u202e"
SHOWN = "\\x1b[2J\\x1b]0;owned\\x07\\u202e"
CONTROLS = re.compile("[\x00-\x09\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
MALFORMED = ["gpu.x\x1b[2J", "a." + "b" * 80, "no dots", "nodot", "serving..ready", ".serving"]


def _insert(db: Path, kind: object, message: str, ts_ms: int, severity: str = "warning") -> None:
    """A row as a newer agent's writer stores it (this version's writer only takes an EventKind)."""
    c = sqlite3.connect(db)
    c.execute("INSERT INTO events (ts_ms, kind, severity, message, details) VALUES (?, ?, ?, ?, ?)",
              (ts_ms, kind, severity, message, json.dumps({"node": "n2"})))
    c.commit()
    c.close()


@pytest.fixture
def db(tmp_path) -> Path:
    """Three known events with one of a newer kind between them (its message holds a screen clear)."""
    path = tmp_path / "h.db"
    with StoreWriter(path, clock=lambda: T0 / 1000) as w:
        w.record(Event(EventKind.SERVING_READY, Severity.INFO, "first ready", ts_ms=T0 - 30_000))
    _insert(path, NEWER, "teleported" + EVIL + " to rack 9", T0 - 20_000)
    with StoreWriter(path, clock=lambda: T0 / 1000) as w:
        w.record(Event(EventKind.SLA_BREACH, Severity.WARNING, "SLA breach after", ts_ms=T0 - 10_000))
        w.record(Event(EventKind.GPU_XID, Severity.CRITICAL, "XID 79 on GPU 3", ts_ms=T0 - 5_000))
    return path


# ------------------------------------------------------------------------------------------ the record


def test_a_well_formed_unknown_kind_reads_as_a_generic_event_and_round_trips():
    wire = {"id": 9, "ts_ms": T0, "run_id": None, "kind": NEWER, "severity": "warning", "message": "m",
            "details": None}
    ev = Event.from_json(wire)
    assert str(ev.kind) == NEWER and ev.kind == NEWER and not isinstance(ev.kind, EventKind)
    assert ev.to_json() == wire and json.loads(json.dumps(ev.to_json())) == wire
    assert Event.from_json(ev.to_json()) == ev  # the dashboard escapes records through their JSON (tui/foreign.py)
    known = {**wire, "kind": "serving.ready"}
    assert Event.from_json(known).kind is EventKind.SERVING_READY
    assert [str(e.kind) for e in read_list(Event, [known, wire, known], "events")] == [
        "serving.ready", NEWER, "serving.ready"]


def test_no_part_of_this_version_can_make_an_unknown_kind():
    """Readers take a newer agent's kind; the agent itself still writes only the kinds of EventKind."""
    with pytest.raises(RecordError, match=r"^Event\.kind: unknown kind 'serving\.teleported'"):
        Event(NEWER, Severity.INFO, "x")  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", MALFORMED)
def test_a_malformed_kind_is_refused_naming_it(kind):
    wire = {"kind": kind, "severity": "info", "message": "m"}
    with pytest.raises(RecordError, match=r"^Event\.kind: unknown kind .*not a well-formed one") as info:
        Event.from_json(wire)
    assert not CONTROLS.search(str(info.value)) and len(str(info.value)) < 400
    with pytest.raises(RecordError, match=r"^events\[1\]\.kind: unknown kind"):
        read_list(Event, [{**wire, "kind": "serving.ready"}, wire], "events")


@pytest.mark.parametrize("kind", [5, None, ["serving.ready"], {"k": 1}, True])
def test_a_kind_of_the_wrong_type_is_refused_naming_it(kind):
    with pytest.raises(RecordError, match=r"^Event\.kind: expected a string"):
        Event.from_json({"kind": kind, "severity": "info", "message": "m"})


# ------------------------------------------------------------------------------------------ `lynxtop events`


def test_lynxtop_events_shows_the_newer_kind_beside_every_other_event(db, capsys):
    rc = main(["events", "--database", str(db), "--utc"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert not CONTROLS.search(out), repr(out)
    lines = out.splitlines()
    assert len(lines) == 5, out  # the header and four events
    assert "first ready" in lines[1] and "XID 79 on GPU 3" in lines[4]
    assert NEWER in lines[2] and f"teleported{SHOWN} to rack 9" in lines[2] and "warning" in lines[2]
    assert "SLA breach after" in lines[3]
    rc = main(["events", "--database", str(db), "--json"])
    out, _ = capsys.readouterr()
    got = [json.loads(line) for line in out.splitlines()]
    assert rc == 0 and [e["kind"] for e in got] == ["serving.ready", NEWER, "sla.breach", "gpu.xid"]
    assert got[1]["details"] == {"node": "n2"}


def test_lynxtop_events_filters_on_a_newer_kind_named_whole(db, newer_agent, capsys):
    for source in (["--database", str(db)], ["--socket", str(newer_agent)]):
        rc = main(["events", *source, "--kind", NEWER])
        out, err = capsys.readouterr()
        assert rc == 0, err
        assert len(out.splitlines()) == 2 and NEWER in out.splitlines()[1], out
        assert "not a kind this lynxtop knows" in err


def test_lynxtop_events_in_a_subprocess_too(db):
    r = subprocess.run([sys.executable, "-m", "lynxtop", "events", "--database", str(db)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert NEWER in r.stdout and "first ready" in r.stdout and "XID 79 on GPU 3" in r.stdout


@pytest.mark.parametrize("kind", ["gpu.x\x1b[2J", "a." + "b" * 80, b"\x00serving.ready"])
def test_lynxtop_events_refuses_a_malformed_stored_kind_with_a_clear_message(db, kind):
    _insert(db, kind, "bad", T0 - 1_000)
    r = subprocess.run([sys.executable, "-m", "lynxtop", "events", "--database", str(db)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "events row 5 cannot be read" in r.stderr and "Event.kind" in r.stderr, r.stderr
    assert ("not a well-formed one" in r.stderr or "expected a string" in r.stderr), r.stderr
    assert "Traceback" not in r.stderr and not CONTROLS.search(r.stderr), r.stderr


class _NewerAgent(BaseHTTPRequestHandler):
    """`GET /v1/events` as a newer agent answers it: the stored rows, whatever their kind."""

    db: Path

    def address_string(self) -> str:
        return "unix"

    def log_message(self, *_args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        c = sqlite3.connect(self.db)
        c.row_factory = sqlite3.Row
        rows = [dict(r) for r in c.execute("SELECT id, ts_ms, run_id, kind, severity, message, details "
                                           "FROM events ORDER BY id")]
        c.close()
        for r in rows:
            r["details"] = json.loads(r["details"]) if r["details"] else None
        body = json.dumps({"events": rows}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _UnixHTTP(HTTPServer):
    address_family = socket.AF_UNIX

    def server_bind(self) -> None:
        self.socket.bind(self.server_address)


@pytest.fixture
def newer_agent(db, sock_dir):
    path = sock_dir / "agent.sock"
    server = _UnixHTTP(str(path), type("H", (_NewerAgent,), {"db": db}))
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield path
    server.shutdown()
    server.server_close()


def test_lynxtop_events_through_a_newer_agents_socket(newer_agent, capsys):
    rc = main(["events", "--socket", str(newer_agent)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert NEWER in out and f"teleported{SHOWN} to rack 9" in out and not CONTROLS.search(out)
    assert "first ready" in out and "SLA breach after" in out and "XID 79 on GPU 3" in out


def test_a_malformed_kind_from_a_socket_is_refused_naming_it(newer_agent, db, capsys):
    _insert(db, "gpu.x\x1b[2J", "bad", T0 - 1_000)
    rc = main(["events", "--socket", str(newer_agent)])
    out, err = capsys.readouterr()
    assert rc == 3 and out == "", (out, err)
    assert "events[4].kind: unknown kind" in err and "not a well-formed one" in err and not CONTROLS.search(err)


# ------------------------------------------------------------------------------------------ the dashboard


async def test_the_dashboards_events_view_shows_the_newer_kind_and_every_other_event(sock_dir, db):
    app = make_app(sock_dir / "absent.sock", db, utc=True)
    async with app.run_test(size=(200, 48)) as pilot:
        from lynxtop.tui.screens.events import EventsScreen

        screen = await open_screen(pilot, app, "5", EventsScreen, connected=False)
        await wait_for(pilot, lambda: len(screen.events) == 4)
        assert {str(e.kind) for e in screen.events} == {"serving.ready", NEWER, "sla.breach", "gpu.xid"}
        await wait_for(pilot, lambda: NEWER in screen_text(app))
        text = screen_text(app)
        assert "events 4/4" in text and f"teleported{SHOWN} to rack 9" in text
        assert "first ready" in text and "SLA breach after" in text and "XID 79 on GPU 3" in text


async def test_the_events_view_says_why_when_a_stored_kind_is_malformed(sock_dir, db):
    """A malformed kind in the database is a named error, not an empty view with no reason."""
    _insert(db, "gpu.x\x1b[2J", "bad", T0 - 1_000)
    app = make_app(sock_dir / "absent.sock", db, utc=True)
    async with app.run_test(size=(200, 48)) as pilot:
        from lynxtop.tui.screens.events import EventsScreen

        screen = await open_screen(pilot, app, "5", EventsScreen, connected=False)
        await wait_for(pilot, lambda: "cannot be read" in (screen.source or ""))
        assert "events row 5" in screen.source and "\x1b" not in screen_text(app)
