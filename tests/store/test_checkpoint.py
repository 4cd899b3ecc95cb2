"""The background checkpointer keeps one connection, checkpoints only after commits, and follows a replaced file."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path

import pytest
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


@pytest.mark.parametrize("linger_s", [0.0, 5.0])
def test_the_writers_look_at_the_wal_spares_the_checkpointers_own(tmp_path, monkeypatch, linger_s):
    """While the writer looks for an unlinked -wal/-shm every check, the checkpointer takes its finding and
    scans /proc/self/fd no more itself (one scan for both threads), rounds after commits (linger 5 s) too."""
    callers: list[str] = []
    real = inproc.unlinked_files

    def unlinked_files(path, full=False):
        callers.append(threading.current_thread().name)
        return real(path, full)

    monkeypatch.setattr(inproc, "unlinked_files", unlinked_files)
    w = StoreWriter(tmp_path / "h.db", wal_check_interval_s=0.1, linger_s=linger_s)
    w.start()
    try:
        cp = w._checkpointer
        for i in range(5):
            w.submit_tick(T0 + i * 1000, host_row={"cpu_pct": 1.0})
            if not linger_s or i == 4:  # lingering: the five ticks are one commit, as the agent's 5 s are
                assert w.flush()
        _wait(lambda: cp.runs >= 1)
        _wait(lambda: callers.count("lynxtop-store-writer") >= (1 if linger_s else 3))
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


class _CountingEvent(threading.Event):
    """An Event counting the waits of the checkpoint thread (its wake-ups, timed or poked)."""

    def __init__(self, waits: list[str]) -> None:
        super().__init__()
        self.waits = waits

    def wait(self, timeout: float | None = None) -> bool:
        if threading.current_thread().name == "lynxtop-store-checkpoint":
            self.waits.append("wait")
        return super().wait(timeout)


def test_commits_an_interval_apart_are_each_a_round_at_once_one_wait_a_round(tmp_path):
    """The 1 Hz agent's writer commits every 5 s (linger_for), the checkpoint interval: each commit's poke is a
    round at once, and the thread waits once a round (for the next poke). Before, a round was followed by a
    wait of the interval and then one for a poke: two wake-ups a round, out of step with the writer's."""
    db = tmp_path / "h.db"
    w = _wal_db(db)
    cp = Checkpointer(db, interval_s=0.6, commit_every_s=0.6, min_gap_s=0.1)
    waits: list[str] = []
    cp._wake, cp._stop = _CountingEvent(waits), _CountingEvent(waits)
    cp.start()
    try:
        for i in range(4):
            time.sleep(0.2)  # past the gap since the last round, as the writer's commits are (5 s, a 1 s gap)
            _commit(w)
            cp.poke()
            _wait(lambda i=i: cp.runs > i)
        _wait(lambda: len(waits) >= 5)  # waiting for the fifth poke
        assert cp.runs == 4 and len(waits) == 5, waits
        assert cp.last_error is None
    finally:
        cp.stop()
        w.close()


def test_commits_soon_after_a_round_share_the_next_one(tmp_path):
    """Rounds that follow commits keep a gap (1 s): commits within it (flushes, a backlog) do not wake the thread;
    their frames are copied by the next round, here the timer's, an interval and the gap after the last, as no
    later commit comes."""
    db = tmp_path / "h.db"
    w = _wal_db(db)
    cp = Checkpointer(db, interval_s=1.5, commit_every_s=1.5)
    waits: list[str] = []
    cp._wake, cp._stop = _CountingEvent(waits), _CountingEvent(waits)
    cp.start()
    try:
        _commit(w)
        cp.poke()
        _wait(lambda: cp.runs == 1)
        _wait(lambda: len(waits) >= 2)  # waiting again
        for _ in range(3):
            _commit(w)
            cp.poke()
        holds(lambda: cp.runs == 1 and len(waits) == 2, 0.5, what="the commits within the gap wake nobody")
        _wait(lambda: cp.runs == 2)
        holds(lambda: cp.runs == 2, 0.3, what="one round for the three commits")
        assert db.stat().st_size > 200_000  # the early commits' frames reached the main file
    finally:
        cp.stop()
        w.close()


def test_the_writer_s_checkpointer_follows_its_commits_when_it_lingers_an_interval(tmp_path):
    """The agent's 1 Hz writer (a 5 s linger) has its rounds follow its commits; 10 Hz (1 s) and no linger
    keep a round every interval."""
    for linger, aligned in ((5.0, True), (1.0, False), (0.0, False)):
        w = StoreWriter(tmp_path / f"h{linger}.db", linger_s=linger)
        w.start()
        try:
            assert w._checkpointer.aligned is aligned
        finally:
            w.close()
