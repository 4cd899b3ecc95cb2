"""The writer's WAL must never be unlinked under it, and if it is, nothing written is lost.

A plain open()+close() of the live database in the agent's process (the reader's old header check) dropped
every POSIX lock the process held on it, SQLite's included. An operator's `sqlite3 DB 'PRAGMA quick_check'`
then took the exclusive lock on close, believed itself the last user and unlinked the -wal and -shm: the
agent kept committing into a deleted WAL, other programs saw time frozen, and those rows were gone after the
next restart. These tests use the real sqlite3 CLI as the outside process.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from lynxtop.cli.ctl import format_status
from lynxtop.contract.status import Status
from lynxtop.store import inproc
from lynxtop.store.reader import StoreReader
from lynxtop.store.writer import StoreWriter

from .helpers import submit

SQLITE3 = shutil.which("sqlite3")


def outside_rw_open(db: Path, sql: str = "PRAGMA quick_check") -> str:
    """What an operator does on a live node: a read-write open of the database from another process."""
    if SQLITE3:
        cmd = [SQLITE3, str(db), sql]
    else:  # same library, same locking; the CLI is preferred because it is what operators run
        print("sqlite3 CLI not found: using a python -c sqlite3 subprocess as the outside process")
        cmd = [sys.executable, "-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
               "print('\\n'.join('|'.join(map(str, r)) for r in c.execute(sys.argv[2]))); c.close()", str(db), sql]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True)
    return out.stdout.strip()


def deleted_wal_fds(db: Path) -> list[str]:
    """This process's descriptors on a deleted -wal/-shm of `db` (what `ls -l /proc/PID/fd` shows)."""
    base = os.path.realpath(db)
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(base + "-") and target.endswith(" (deleted)"):
            out.append(target)
    return out


def ticks_seen_by_another_process(db: Path) -> list[int]:
    """The host_samples timestamps as a freshly started process (a restarted agent) sees them."""
    code = ("import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
            "print(' '.join(str(r[0]) for r in c.execute('SELECT ts_ms FROM host_samples ORDER BY ts_ms'))); "
            "c.close()")
    out = subprocess.run([sys.executable, "-c", code, str(db)], capture_output=True, text=True, timeout=30,
                         check=True)
    return [int(v) for v in out.stdout.split()]


def open_store(db: Path, wal_check_interval_s: float) -> tuple[StoreWriter, StoreReader]:
    """The agent's pair: its writer started first, then the in-process reader its API answers from."""
    w = StoreWriter(db, wal_check_interval_s=wal_check_interval_s)
    w.start()
    return w, StoreReader(db)


def unlink_wal(db: Path) -> None:
    """The unlink on purpose: the old bug's open()+close() in this process (its header check read 16 bytes)
    drops the process's locks, then the outside open believes itself the last user."""
    with open(db, "rb") as f:
        f.read(16)
    outside_rw_open(db)


def wait_recovered(w: StoreWriter, timeout_s: float) -> dict:
    """The writer's stats once it has renewed the WAL, or at the timeout (the caller asserts on them)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not w.stats()["wal_recovered"]:
        time.sleep(0.05)
    return w.stats()


def test_outside_sqlite3_after_in_process_reader_loses_no_tick(tmp_path):
    db = tmp_path / "lynxtop.db"
    w = StoreWriter(db)
    w.start()
    expected = submit(w, 20, gpus=2)
    assert w.flush()
    reader = StoreReader(db)  # as the agent does for /v1/runs, after its writer is open
    assert reader.runs() == []
    assert outside_rw_open(db) == "ok"
    assert deleted_wal_fds(db) == [], "the outside open unlinked the WAL the writer is using"
    expected += submit(w, 20, start_i=20, gpus=2)
    assert w.flush()
    time.sleep(1.2)  # let the background checkpointer run a round or two, as in the agent
    w.close()  # the agent stops; its reader is still open, as it is until the process exits
    assert ticks_seen_by_another_process(db) == expected
    reader.close()
    w2 = StoreWriter(db)  # the restarted agent
    try:
        got = [r[0] for r in w2.conn.execute("SELECT ts_ms FROM host_samples ORDER BY ts_ms")]
        assert got == expected
    finally:
        w2.close()
    assert deleted_wal_fds(db) == []


def test_unlinked_wal_is_detected_reported_and_recovered(tmp_path):
    db = tmp_path / "lynxtop.db"
    w, reader = open_store(db, wal_check_interval_s=0.1)
    try:
        expected = submit(w, 10, gpus=2)
        assert w.flush()
        assert len(reader.latest("host", n=100)) == 10
        unlink_wal(db)
        assert inproc.unlinked_files(db), "the reproduction did not unlink the WAL"
        expected += submit(w, 10, start_i=10, gpus=2)  # written into the deleted WAL before detection
        assert w.flush()
        st = wait_recovered(w, 15)
        assert st["wal_recovered"] is True, st
        assert "unlinked" in st["wal_unlinked"] and "recovered" in st["wal_unlinked"], st["wal_unlinked"]
        assert st["wal_unlinked_ms"] is not None
        assert deleted_wal_fds(db) == [] and inproc.unlinked_files(db) == []
        expected += submit(w, 10, start_i=20, gpus=2)  # after detection
        assert w.flush()
        events = reader.events(kinds=["store.wal_unlinked"])  # the reader reconnected by itself
        assert len(events) == 1 and events[0].severity == "critical", events
        assert "unlinked" in events[0].message
        assert [r["ts_ms"] for r in reader.latest("host", n=100)][::-1] == expected
        assert ticks_seen_by_another_process(db) == expected  # visible to other programs again
        # the status the agent shows carries it
        text = format_status(Status.from_json({"agent": {"store": {"wal_unlinked": st["wal_unlinked"],
                                                                   "wal_unlinked_ms": st["wal_unlinked_ms"],
                                                                   "wal_recovered": True}},
                                               "serving": {}, "gpus": []}))
        assert "WAL UNLINKED" in text and "recovered" in text
    finally:
        reader.close()
        w.close()
    assert ticks_seen_by_another_process(db) == expected
    c = sqlite3.connect(db)
    try:
        assert c.execute("PRAGMA quick_check").fetchall() == [("ok",)]
        assert c.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == 2 * len(expected)
    finally:
        c.close()


def test_close_saves_an_unlinked_wal_not_yet_noticed(tmp_path):
    """An unlink between two checks: close() copies the deleted WAL's frames into the file first."""
    db = tmp_path / "lynxtop.db"
    w, reader = open_store(db, wal_check_interval_s=3600)
    expected = submit(w, 5, gpus=1)
    assert w.flush()
    reader.runs()
    unlink_wal(db)
    expected += submit(w, 5, start_i=5, gpus=1)
    assert w.flush()
    assert w.stats()["wal_unlinked"] is None  # not noticed yet
    w.close()
    assert ticks_seen_by_another_process(db) == expected
    reader.close()


def unlink_wal_despite(db: Path, w: StoreWriter, tries: int = 50) -> None:
    """`unlink_wal` while a reader of this process is busy: its next read transaction takes a lock again, and an
    outside open that sees it leaves the WAL in place (a slow CI run saw that). Try until the WAL is really gone
    under the process (or the writer already noticed it)."""
    for _ in range(tries):
        unlink_wal(db)
        if inproc.unlinked_files(db) or w.stats()["wal_unlinked"]:
            return
        time.sleep(0.02)
    raise AssertionError(f"the WAL could not be unlinked in {tries} tries: the busy reader always held a lock")


def test_recovery_while_an_in_process_reader_is_busy(tmp_path):
    """The agent's reader answering API calls in a loop: the renewal waits for it, the reader never fails."""
    import threading

    db = tmp_path / "lynxtop.db"
    w, reader = open_store(db, wal_check_interval_s=0.1)
    errors: list[BaseException] = []
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            try:
                reader.latest("host", n=5)
                reader.events(limit=5)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)
                return

    t = threading.Thread(target=hammer)
    t.start()
    try:
        expected = submit(w, 10, gpus=1)
        assert w.flush()
        unlink_wal_despite(db, w)
        for i in range(10, 40):  # ticks keep coming while it is noticed and renewed
            expected += submit(w, 1, start_i=i, gpus=1)
            time.sleep(0.05)
        assert w.flush()
        wait_recovered(w, 20)
        assert w.stats()["wal_recovered"] is True, w.stats()["wal_unlinked"]
    finally:
        stop.set()
        t.join(10)
    assert not errors, errors
    assert inproc.unlinked_files(db) == []
    w.close()
    reader.close()
    assert ticks_seen_by_another_process(db) == expected
