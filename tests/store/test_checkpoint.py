"""The background checkpointer keeps one connection, checkpoints only after commits, and follows a replaced file."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path

from support.waits import holds

from lynxtop.store import inproc
from lynxtop.store.checkpoint import Checkpointer
from lynxtop.store.writer import StoreWriter

from .helpers import T0


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


def test_the_writers_look_at_the_wal_spares_the_checkpointers_own(tmp_path, monkeypatch):
    """While the writer looks for an unlinked -wal/-shm every check, the checkpointer takes its finding and
    scans /proc/self/fd no more itself (one scan for both threads)."""
    callers: list[str] = []
    real = inproc.unlinked_files

    def unlinked_files(path, full=False):
        callers.append(threading.current_thread().name)
        return real(path, full)

    monkeypatch.setattr(inproc, "unlinked_files", unlinked_files)
    w = StoreWriter(tmp_path / "h.db", wal_check_interval_s=0.1)
    w.start()
    try:
        cp = w._checkpointer
        for i in range(5):
            w.submit_tick(T0 + i * 1000, host_row={"cpu_pct": 1.0})
            assert w.flush()
        _wait(lambda: cp.runs >= 1)
        _wait(lambda: callers.count("lynxtop-store-writer") >= 3)
    finally:
        w.close()
    assert "lynxtop-store-checkpoint" not in callers, callers


def test_a_stale_look_by_the_writer_means_a_scan_of_its_own(tmp_path, monkeypatch):
    """The writer's finding holds 2 s, as the checkpointer's own did: an unlinked WAL it saw keeps this thread
    off the file; once stale (a writer that stopped looking) the checkpointer scans again itself."""
    found: list[list[str]] = []
    monkeypatch.setattr(inproc, "unlinked_files", lambda path, full=False: found.append([]) or [])
    cp = Checkpointer(tmp_path / "h.db")
    cp.note_scan(True, time.monotonic())
    assert cp._wal_unlinked() is True and not found
    cp.note_scan(True, time.monotonic() - 2.5)
    assert cp._wal_unlinked() is False and len(found) == 1
    assert cp._wal_unlinked() is False and len(found) == 1  # its own look holds 2 s too
