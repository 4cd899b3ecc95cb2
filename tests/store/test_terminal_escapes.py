"""Issue 25.3: the database's words (a run's profile, model and end reason, an event message) reach a terminal
escaped through `lynxtop runs` and `lynxtop export` to stdout; a file or a pipe still gets the exact text."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from lynxtop.__main__ import main
from lynxtop.contract.events import Event, EventKind
from lynxtop.store.writer import StoreWriter

from .helpers import T0

EVIL = "\x1b[2J\x1b]0;owned\x07\x9b31m\u202e"
SHOWN = "\\x1b[2J\\x1b]0;owned\\x07\\x9b31m\\u202e"
CONTROLS = re.compile("[\x00-\x09\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "h.db"
    with StoreWriter(path) as w:
        rid = w.create_run(profile="tp8" + EVIL, model="m" + EVIL + "\nforged row", started_ms=T0)
        w.update_run(rid, ready_ms=T0 + 10_000, ended_ms=T0 + 20_000, exit_code=1, end_reason="crash" + EVIL)
        w.create_run(profile="tp8-ep", model="deepseek-ai/DeepSeek-V4.1", started_ms=T0 + 30_000)
        w.record(Event(EventKind.SERVING_CRASH, "error", "vLLM said" + EVIL, run_id=rid, ts_ms=T0 + 15_000))
    return path


def test_runs_table_shows_the_database_words_escaped_and_aligned(db, capsys):
    assert main(["runs", "--database", str(db)]) == 0
    out = capsys.readouterr().out
    assert not CONTROLS.search(out), repr(out)
    lines = out.splitlines()
    assert len(lines) == 3  # the header and two runs: the model's line break forged no row
    assert f"tp8{SHOWN}" in lines[2] and f"m{SHOWN}\\nforged row" in lines[2] and f"crash{SHOWN}" in lines[2]
    starts = [re.search(r"  \d{4}-\d\d-\d\d ", line).start() + 2 for line in lines[1:]]  # STARTED lines up
    assert starts[0] == starts[1] == lines[0].index("STARTED")


def _export_events(db, stdout) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "lynxtop", "export", "--database", str(db), "--table", "events",
                             "--from", str(T0), "--to", str(T0 + 60_000)], stdout=stdout, stderr=subprocess.PIPE)


def test_export_to_a_terminal_is_escaped(db):
    master, slave = os.openpty()
    proc = _export_events(db, slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the writer closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert proc.wait(60) == 0, proc.stderr.read()
    shown = b"".join(chunks).decode()
    assert f"vLLM said{SHOWN}" in shown
    assert not CONTROLS.search(shown.replace("\r\n", "\n")), repr(shown)  # the pty's own CR LF aside


def test_export_to_a_pipe_keeps_the_exact_text(db):
    proc = _export_events(db, subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"vLLM said{EVIL}".encode() in out  # data is not changed on its way to a file or a program
