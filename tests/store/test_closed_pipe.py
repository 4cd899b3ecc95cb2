"""`lynxtop export | head` and `lynxtop runs | head`: a reader that closes the pipe early is normal use. Every command
then exits quietly with 0 (no traceback, no "Exception ignored" from the interpreter's exit), whether the pipe closes
mid-output or before buffered output is flushed; a broken pipe that is not stdout stays an error."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lynxtop.__main__ import main
from lynxtop.cli import store_cli
from lynxtop.store.writer import StoreWriter

from .helpers import T0, submit


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("pipe") / "h.db"
    with StoreWriter(path, queue_max=50000) as w:
        for i in range(400):
            w.create_run(profile="p", model="m" * 400, started_ms=T0 + i, simulated=True)
        submit(w, 2000, gpus=2)  # ~4000 gpu rows: far more than a pipe buffer
    return path


def _piped(args, lines=1):
    """Run lynxtop with stdout into a pipe that is closed after `lines` lines (what `| head -n 1` does)."""
    p = subprocess.Popen([sys.executable, "-m", "lynxtop", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for _ in range(lines):
        p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    return p.wait(timeout=60), err


def _closed_from_the_start(args, buffered):
    """Run lynxtop with stdout into a pipe whose reader is already gone (`| true`), stdout buffered or not."""
    r, w = os.pipe()
    os.close(r)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    try:
        p = subprocess.run([sys.executable, "-m", "lynxtop", *args], stdout=w, stderr=subprocess.PIPE, env=env,
                           timeout=60)
    finally:
        os.close(w)
    return p.returncode, p.stderr.decode()


def test_export_into_a_closed_pipe_exits_quietly(db):
    rc, err = _piped(["export", "--database", str(db), "--from", str(T0), "--to", str(T0 + 2_000_000)])
    assert err == "" and rc == 0, (rc, err)


@pytest.mark.parametrize("args", [[], ["--json"]])
def test_runs_into_a_closed_pipe_exits_quietly(db, args):
    rc, err = _piped(["runs", "--database", str(db), "--limit", "400", *args])
    assert err == "" and rc == 0, (rc, err[-600:])


@pytest.mark.parametrize("buffered", [True, False])
@pytest.mark.parametrize("cmd", [["runs", "--limit", "3"], ["runs", "--limit", "3", "--json"],
                                 ["export", "--from", str(T0), "--to", str(T0 + 3000)]])
def test_short_output_into_a_closed_pipe_exits_quietly(db, cmd, buffered):
    rc, err = _closed_from_the_start([*cmd, "--database", str(db)], buffered)
    assert err == "" and rc == 0, (rc, err[-600:])


def test_a_broken_pipe_that_is_not_stdout_is_not_hidden(db, monkeypatch):
    def runs(args):
        raise BrokenPipeError(32, "Broken pipe")  # say, the agent's socket closing mid-request

    monkeypatch.setattr(store_cli, "runs", runs)
    with pytest.raises(BrokenPipeError):
        main(["runs", "--database", str(db)])
