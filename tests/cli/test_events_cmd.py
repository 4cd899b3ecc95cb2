"""`lynxtop events`: the agent's events on a terminal without the dashboard (over SSH at 3 a.m.).

Against a real SQLite database written by the store (as `lynxtop runs` is tested), and through a real unix socket
answering `GET /v1/events` with that database's events: newest last, --since/--severity/--kind/--run/--limit/--json
filters, local times, foreign text escaped, bad arguments exit 2 in one line, "no events match" exit 0.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from lynxtop.__main__ import main
from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.contract.format import fmt_datetime
from lynxtop.store.reader import StoreReader
from lynxtop.store.writer import StoreWriter

NOW = int(time.time() * 1000)
EVIL = "\x1b[2J\x1b]0;owned\x07\u202e"
SHOWN = "\\x1b[2J\\x1b]0;owned\\x07\\u202e"
CONTROLS = re.compile("[\x00-\x09\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@pytest.fixture
def db(tmp_path) -> Path:
    path = tmp_path / "h.db"
    with StoreWriter(path) as w:
        r1 = w.create_run(profile="tp8", model="m", started_ms=NOW - 3 * 3_600_000)
        r2 = w.create_run(profile="tp8-ep", model="m", started_ms=NOW - 30 * 60_000)
        for ev in (
            Event(EventKind.SERVING_READY, Severity.INFO, "old ready", run_id=r1, ts_ms=NOW - 2 * 3_600_000),
            Event(EventKind.SERVING_CRASH, Severity.ERROR, "vLLM said" + EVIL + "\nforged line", run_id=r1,
                  ts_ms=NOW - 2 * 3_600_000 + 1000),
            Event(EventKind.SLA_BREACH, Severity.WARNING, "SLA breach: p99 TTFT 39.63 s > 2.00 s", run_id=r2,
                  ts_ms=NOW - 20 * 60_000),
            Event(EventKind.SERVING_READY, Severity.INFO, "new ready", run_id=r2, ts_ms=NOW - 10 * 60_000),
            Event(EventKind.GPU_XID, Severity.CRITICAL, "XID 79 on GPU 3", ts_ms=NOW - 5 * 60_000),
        ):
            w.record(ev)
    return path


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _messages(out: str) -> list[str]:
    return [line.split("  ")[-1].strip() for line in out.splitlines()[1:]]


def test_events_from_the_database_newest_last_in_local_time_with_foreign_text_escaped(db, capsys):
    rc, out, err = _run(["events", "--database", str(db)], capsys)
    assert rc == 0, err
    assert not CONTROLS.search(out), repr(out)
    lines = out.splitlines()
    assert lines[0].split()[:5] == ["TIME", "SEVERITY", "KIND", "RUN", "MESSAGE"]
    assert len(lines) == 6  # the header and five events: the message's line break forged no line
    assert "old ready" in lines[1] and "XID 79 on GPU 3" in lines[5]  # newest last
    assert f"vLLM said{SHOWN}\\nforged line" in lines[2] and "serving.crash" in lines[2] and "run 1" in lines[2]
    assert lines[5].startswith(fmt_datetime(NOW - 5 * 60_000, seconds=True))  # local time, as `lynxtop status`
    rc, out, _ = _run(["events", "--database", str(db), "--utc", "--limit", "1"], capsys)
    assert out.splitlines()[1].startswith(fmt_datetime(NOW - 5 * 60_000, utc=True, seconds=True))


def test_filters_since_severity_kind_run_and_limit(db, capsys):
    base = ["events", "--database", str(db)]
    assert _messages(_run([*base, "--since", "-1h"], capsys)[1]) == [
        "SLA breach: p99 TTFT 39.63 s > 2.00 s", "new ready", "XID 79 on GPU 3"]
    out = _run([*base, "--severity", "warning"], capsys)[1]
    assert [m[:9] for m in _messages(out)] == ["vLLM said", "SLA breac", "XID 79 on"]
    assert _messages(_run([*base, "--severity", "critical"], capsys)[1]) == ["XID 79 on GPU 3"]
    assert _messages(_run([*base, "--kind", "serving.ready"], capsys)[1]) == ["old ready", "new ready"]
    assert len(_messages(_run([*base, "--kind", "serving."], capsys)[1])) == 3
    assert _messages(_run([*base, "--run", "2"], capsys)[1]) == ["SLA breach: p99 TTFT 39.63 s > 2.00 s",
                                                                 "new ready"]
    assert _messages(_run([*base, "--limit", "2"], capsys)[1]) == ["new ready", "XID 79 on GPU 3"]  # the newest
    # the newest N of those since T, not the first N after T
    assert _messages(_run([*base, "--since", "-3h", "--limit", "1", "--kind", "serving."], capsys)[1]) == [
        "new ready"]


def test_json_is_one_object_per_line(db, capsys):
    rc, out, _ = _run(["events", "--database", str(db), "--json", "--kind", "serving."], capsys)
    assert rc == 0 and not CONTROLS.search(out)
    objs = [json.loads(line) for line in out.splitlines()]
    assert [o["kind"] for o in objs] == ["serving.ready", "serving.crash", "serving.ready"]
    assert objs[1]["message"] == "vLLM said" + EVIL + "\nforged line"  # exact text, JSON-escaped
    assert objs[1]["run_id"] == 1 and isinstance(objs[1]["ts_ms"], int)


def test_no_match_is_exit_0_with_a_line_saying_so(db, tmp_path, capsys):
    rc, out, _ = _run(["events", "--database", str(db), "--kind", "ray.", "--since", "-1m"], capsys)
    assert rc == 0 and out.strip() == "no events match"
    empty = tmp_path / "empty.db"
    with StoreWriter(empty):
        pass
    assert _run(["events", "--database", str(empty)], capsys)[:2] == (0, "no events match\n")


@pytest.mark.parametrize(("args", "says"), [
    (["--since", "yesterday"], "--since: 'yesterday' is not a time"),
    (["--since", "-1x"], "--since"),
    (["--kind", "nope."], "--kind 'nope.': no event kind starts with it"),
    (["--severity", "loud"], "invalid choice: 'loud'"),
    (["--limit", "0"], "--limit"),
    (["--run", "x"], "--run"),
])
def test_bad_arguments_exit_2_with_one_clear_line(db, args, says):
    r = subprocess.run([sys.executable, "-m", "lynxtop", "events", "--database", str(db), *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert says in r.stderr and "Traceback" not in r.stderr, r.stderr


class _Events(BaseHTTPRequestHandler):
    """`GET /v1/events` answered from the real database, as the agent's route does (reader.events(since, limit))."""

    db: Path
    asked: list[dict]

    def address_string(self) -> str:  # a unix socket has no client address
        return "unix"

    def log_message(self, *_args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        url = urlparse(self.path)
        q = {k: int(v[0]) for k, v in parse_qs(url.query).items()}
        self.asked.append(q)
        reader = StoreReader(self.db)
        try:
            evs = reader.events(since_ms=q.get("since"), limit=q.get("limit", 500))
        finally:
            reader.close()
        body = json.dumps({"events": [e.to_json() for e in evs]}).encode()
        self.send_response(200 if url.path == "/v1/events" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _UnixHTTP(HTTPServer):
    address_family = socket.AF_UNIX

    def server_bind(self) -> None:
        self.socket.bind(self.server_address)


@pytest.fixture
def agent_socket(db, tmp_path):
    path = tmp_path / "agent.sock"
    handler = type("H", (_Events,), {"db": db, "asked": []})
    server = _UnixHTTP(str(path), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield path, handler.asked
    server.shutdown()
    server.server_close()


def _config(tmp_path: Path, sock: Path, db: Path) -> Path:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[agent]\ndatabase = "{db}"\nsocket = "{sock}"\n')
    return cfg


def test_through_the_agents_socket_with_the_filters_applied(agent_socket, db, tmp_path, capsys):
    sock, asked = agent_socket
    rc, out, err = _run(["events", "--socket", str(sock), "--severity", "warning", "--since", "-1h"], capsys)
    assert rc == 0, err
    assert _messages(out) == ["SLA breach: p99 TTFT 39.63 s > 2.00 s", "XID 79 on GPU 3"]
    assert asked and "since" not in asked[-1]  # the newest events, filtered here
    # the config's socket, with no --socket: the same
    rc, out, _ = _run(["events", "--config", str(_config(tmp_path, sock, tmp_path / "other.db")), "--kind",
                       "serving.crash"], capsys)
    assert rc == 0 and SHOWN in out and not CONTROLS.search(out)


def test_agent_down_falls_back_to_the_database_read_only(db, tmp_path, capsys):
    cfg = _config(tmp_path, tmp_path / "gone.sock", db)
    before = db.stat().st_mtime_ns
    rc, out, err = _run(["events", "--config", str(cfg), "--limit", "1"], capsys)
    assert rc == 0, err
    assert _messages(out) == ["XID 79 on GPU 3"]
    assert "reading the history database" in err
    assert db.stat().st_mtime_ns == before
    # an agent named with --socket that does not answer: exit 3, no other source stands in
    rc, out, err = _run(["events", "--socket", str(tmp_path / "gone.sock")], capsys)
    assert rc == 3 and out == "" and "Traceback" not in err
