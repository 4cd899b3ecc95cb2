"""A healthy database the agent may not write is refused with "permission denied" and never touched.

Before, SQLite's SQLITE_READONLY/CANTOPEN on such a file was taken for damage and the writer tried to move
the file aside (it succeeded where the directory was writable). The tests run as root, where chmod stops
nothing, so they make the directory or the file immutable with `chattr +i` (root cannot write through it
either); they are skipped with the reason where the filesystem or the sandbox does not allow that.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from lynxtop.store.errors import NotOurDatabase, StoreAccessError
from lynxtop.store.writer import StoreWriter

from .helpers import submit


@contextmanager
def immutable(path: Path) -> Iterator[None]:
    chattr = shutil.which("chattr")
    if chattr is None:
        pytest.skip("chattr not installed: cannot make a path read-only for root")
    r = subprocess.run([chattr, "+i", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"chattr +i not possible here ({r.stderr.strip()}): cannot make a path read-only for root")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(path)], check=True)


def _snapshot(d: Path) -> dict[str, tuple]:
    out = {}
    for p in sorted(d.iterdir()):
        if p.is_dir():
            continue
        st = p.stat()
        out[p.name] = (st.st_ino, st.st_size, st.st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def _healthy_db(tmp_path: Path) -> Path:
    db = tmp_path / "state" / "lynxtop.db"
    with StoreWriter(db) as w:
        submit(w, 5, gpus=1)
    assert sorted(p.name for p in db.parent.iterdir()) == ["lynxtop.db"]  # a clean close leaves one file
    return db


@pytest.mark.parametrize("what", ["directory", "file"])
def test_healthy_database_it_may_not_write_is_refused_and_untouched(tmp_path, what):
    db = _healthy_db(tmp_path)
    before = _snapshot(db.parent)
    with immutable(db.parent if what == "directory" else db):
        with pytest.raises(StoreAccessError) as err:
            StoreWriter(db)
        after = _snapshot(db.parent)
    msg = str(err.value)
    assert not isinstance(err.value, NotOurDatabase)
    assert "permission denied" in msg and str(db) in msg, msg
    assert "damaged" not in msg, msg
    if what == "file":
        after = {k: v for k, v in after.items() if k == "lynxtop.db"}  # SQLite may create -wal/-shm beside it
    assert after == before, "the healthy file was touched"
    assert not list(db.parent.glob("*.corrupt-*"))
    with StoreWriter(db):  # and it is still the same, readable history
        # read on a connection of its own: the writer's is its thread's, busy with its first checks right now
        c = sqlite3.connect(db)
        try:
            assert c.execute("SELECT count(*) FROM host_samples").fetchone()[0] == 5
        finally:
            c.close()


def test_agent_refuses_to_start_on_a_read_only_state_directory(tmp_path):
    db = _healthy_db(tmp_path)
    (db.parent / "agent.lock").write_text("")  # the agent ran here before the directory became read-only
    (db.parent / "logs").mkdir()
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[agent]\ndatabase = "{db}"\nsocket = "{tmp_path / "run" / "agent.sock"}"\n'
                   'fake_nvml = "sim"\n')
    before = {k: v for k, v in _snapshot(db.parent).items() if k != "agent.lock"}  # it writes its pid there
    env = dict(os.environ, LYNXTOP_SIM_STATE_DIR=str(tmp_path / "sim-state"))
    env.pop("NOTIFY_SOCKET", None)
    with immutable(db.parent):
        r = subprocess.run([sys.executable, "-m", "lynxtop", "agent", "--config", str(cfg)], capture_output=True,
                           text=True, timeout=60, env=env)
        after = {k: v for k, v in _snapshot(db.parent).items() if k != "agent.lock"}
    assert r.returncode != 0, r.stdout + r.stderr
    assert "permission denied" in r.stderr and str(db) in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert after == before
