"""The WAL watch between two listings of /proc/self/fd reads only the descriptors that named the -wal/-shm."""

from __future__ import annotations

import os
import sqlite3
import sys

import pytest

from lynxtop.store import inproc

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")


@pytest.fixture
def listings(monkeypatch):
    """How many times the descriptor table was listed."""
    count = {"n": 0}
    real = os.listdir

    def listdir(path="."):
        if str(path) == "/proc/self/fd":
            count["n"] += 1
        return real(path)

    monkeypatch.setattr(inproc.os, "listdir", listdir)
    return count


def _wal_db(path):
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (x)")
    conn.execute("INSERT INTO t VALUES (1)")
    conn.commit()
    return conn


def test_an_unlink_is_found_through_the_remembered_descriptors(tmp_path, listings):
    db = tmp_path / "h.db"
    conn = _wal_db(db)
    try:
        assert inproc.unlinked_files(db) == [] and listings["n"] == 1
        assert inproc.unlinked_files(db) == [] and listings["n"] == 1  # no second listing
        wal, shm = f"{inproc.key(db)}-wal", f"{inproc.key(db)}-shm"
        os.unlink(wal)
        os.unlink(shm)
        assert inproc.unlinked_files(db) == [shm, wal] and listings["n"] == 1
        assert inproc.unlinked_files(db, full=True) == [shm, wal] and listings["n"] == 2
    finally:
        conn.close()
    # the remembered descriptors are closed (or name other files now): the table is listed again
    assert inproc.unlinked_files(db) == [] and listings["n"] == 3


def test_a_new_connection_is_seen_at_the_next_full_listing(tmp_path, listings, monkeypatch):
    db = tmp_path / "h.db"
    first = _wal_db(db)
    try:
        assert inproc.unlinked_files(db) == [] and listings["n"] == 1
        monkeypatch.setattr(inproc, "FULL_SCAN_S", 0.0)
        second = sqlite3.connect(db)
        second.execute("SELECT * FROM t").fetchall()
        assert inproc.unlinked_files(db) == [] and listings["n"] == 2
        first.close()  # the second connection's descriptors are known now
        os.unlink(f"{inproc.key(db)}-wal")
        monkeypatch.setattr(inproc, "FULL_SCAN_S", 3600.0)
        assert inproc.unlinked_files(db) == [f"{inproc.key(db)}-wal"]
        second.close()
    finally:
        first.close()
