"""The background checkpointer keeps one connection, checkpoints only after commits, and follows a replaced file."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from support.waits import holds

from lynxtop.store.checkpoint import Checkpointer


def _fds_on(path: Path) -> int:
    """Descriptors of this process open on `path` (the main database file)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                n += 1
        except OSError:
            pass
    return n


def _wal_db(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE IF NOT EXISTS t (x BLOB)")
    return conn


def _commit(conn: sqlite3.Connection, rows: int = 50) -> None:
    conn.executemany("INSERT INTO t VALUES (?)", [(os.urandom(1000),) for _ in range(rows)])


def _wait(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_one_connection_for_many_checkpoints_and_none_without_commits(tmp_path):
    db = tmp_path / "h.db"
    w = _wal_db(db)
    cp = Checkpointer(db, interval_s=0.05)
    cp.start()
    try:
        base = _fds_on(db)
        for _ in range(5):
            _commit(w)
            cp.poke()
            runs = cp.runs
            _wait(lambda r=runs: cp.runs > r)
        assert _fds_on(db) == base + 1  # the same kept connection, not one per round
        assert db.stat().st_size > 200_000  # the frames reached the main file
        idle = cp.runs
        holds(lambda: cp.runs == idle, 0.5, what="no checkpoint in ten intervals without a commit")
        assert cp.last_error is None
    finally:
        cp.stop()
        w.close()
    assert _fds_on(db) == 0  # stopping closes it


def test_a_replaced_file_gets_a_new_connection(tmp_path):
    db = tmp_path / "h.db"
    w = _wal_db(db)
    cp = Checkpointer(db, interval_s=0.05)
    cp.start()
    try:
        _commit(w)
        cp.poke()
        _wait(lambda: cp.runs >= 1)
        w.close()
        old = tmp_path / "old.db"
        db.rename(old)  # the writer quarantined the file and started a new one at the same path
        for suffix in ("-wal", "-shm"):
            if (tmp_path / f"h.db{suffix}").exists():
                (tmp_path / f"h.db{suffix}").rename(tmp_path / f"old.db{suffix}")
        w = _wal_db(db)
        _commit(w, rows=300)
        cp.poke()
        _wait(lambda: db.stat().st_size > 250_000)  # checkpointed into the new file, not the renamed one
        assert _fds_on(old) == 0
    finally:
        cp.stop()
        w.close()
