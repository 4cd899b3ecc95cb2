"""The database path is not the database: an `rm` or an `mv` of the live file, and a second agent by a symlink.

The writer keeps a descriptor on its file and compares it with what the path names on every check: a deleted
file gets a fresh one at the configured path, a replaced one (a backup restored with mv) is checked and written
into, and whatever was committed since the last check is carried over, so nothing written after the swap is lost.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lynxtop.cli.ctl import format_status
from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.contract.status import Status
from lynxtop.store import swap
from lynxtop.store.errors import StoreError
from lynxtop.store.writer import StoreWriter

from .helpers import T0, submit
from .test_wal_unlink import ticks_seen_by_another_process


def events_seen_by_another_process(db: Path) -> list[tuple[str, str, str]]:
    code = ("import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
            "[print(f'{k}\\t{s}\\t{m}') for k, s, m in c.execute('SELECT kind, severity, message FROM events')]; "
            "c.close()")
    out = subprocess.run([sys.executable, "-c", code, str(db)], capture_output=True, text=True, timeout=30,
                         check=True)
    return [tuple(line.split("\t", 2)) for line in out.stdout.splitlines()]  # type: ignore[misc]


def wait_checked(w: StoreWriter, top: int) -> None:
    """Until the writer's file check has seen the file with `top` written (what "since" is measured from)."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and w._marks.tick_ts != top:
        time.sleep(0.02)
    assert w._marks.tick_ts == top


def wait_swapped(w: StoreWriter, timeout_s: float = 15) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not w.stats()["db_swapped"]:
        time.sleep(0.05)
    return w.stats()


@pytest.mark.parametrize("removed", ["db", "db-wal-shm"])
def test_a_deleted_database_is_noticed_and_everything_after_is_kept(tmp_path, removed):
    db = tmp_path / "lynxtop.db"
    w = StoreWriter(db, wal_check_interval_s=0.1)
    w.start()
    try:
        before = submit(w, 10, gpus=2)
        assert w.flush()
        wait_checked(w, before[-1])
        os.unlink(db)  # `rm lynxtop.db` (and its -wal/-shm) on a live node
        if removed == "db-wal-shm":
            for side in ("-wal", "-shm"):
                Path(f"{db}{side}").unlink(missing_ok=True)
        after = submit(w, 10, start_i=10, gpus=2)  # some land in the deleted file before the check sees it
        assert w.flush()
        st = wait_swapped(w)
        assert st["db_swapped"] and "was deleted" in st["db_swapped"], st
        assert "history up to then is gone" in st["db_swapped"] and st["db_swapped_ms"] is not None
        text = format_status(Status.from_json({"agent": {"store": {"db_swapped": st["db_swapped"],
                                                                   "db_swapped_ms": st["db_swapped_ms"]}}}))
        assert "DATABASE FILE SWAPPED" in text and "was deleted" in text, text
        after += submit(w, 10, start_i=20, gpus=2)
        assert w.flush()
    finally:
        w.close()
    assert db.exists(), "no database at the configured path after the agent stopped"
    # everything written after the rm is in the file a restarted agent opens; what came before is gone
    assert ticks_seen_by_another_process(db) == after
    assert not set(before) & set(ticks_seen_by_another_process(db))
    kinds = [(k, s) for k, s, _ in events_seen_by_another_process(db)]
    assert ("store.db_unlinked", "critical") in kinds, kinds


def test_a_database_replaced_by_mv_is_checked_and_written_into(tmp_path):
    db, backup = tmp_path / "lynxtop.db", tmp_path / "backup.db"
    with StoreWriter(backup) as b:  # a backup taken earlier
        old = [T0 - 100_000 + i * 1000 for i in range(5)]
        for ts in old:
            b.submit_tick(ts, host_row={"cpu_pct": 1.0})
        assert b.flush()
    w = StoreWriter(db, wal_check_interval_s=0.1)
    w.start()
    try:
        wait_checked(w, submit(w, 10, gpus=2)[-1])
        os.rename(backup, db)  # restoring the backup on a live node: `mv backup.db lynxtop.db`
        after = submit(w, 10, start_i=10, gpus=2)
        assert w.flush()
        st = wait_swapped(w)
        assert st["db_swapped"] and "replaced by another file" in st["db_swapped"], st
        after += submit(w, 10, start_i=20, gpus=2)
        assert w.flush()
    finally:
        w.close()
    # never called malformed nor moved aside: the backup's rows and everything written after the mv
    assert not list(tmp_path.glob("*.corrupt-*")), list(tmp_path.iterdir())
    assert ticks_seen_by_another_process(db) == old + after
    kinds = [(k, s) for k, s, _ in events_seen_by_another_process(db)]
    assert ("store.db_replaced", "warning") in kinds, kinds
    assert not [k for k, _ in kinds if k == "store.moved_aside"], kinds


def test_the_ids_are_read_again_only_after_writes_that_can_change_them(tmp_path, monkeypatch):
    """A file check after ticks alone reuses the ids it read (no query); after an event it reads them again,
    and every event written since the check that read them is carried into the fresh file after an rm."""
    takes: list[int | None] = []
    real = swap.Marks.take.__func__

    def take(cls, conn, tick_ts):
        takes.append(tick_ts)
        return real(cls, conn, tick_ts)

    monkeypatch.setattr(swap.Marks, "take", classmethod(take))
    db = tmp_path / "lynxtop.db"
    w = StoreWriter(db)  # not started: the test drives the writes and the checks

    def note(message: str) -> None:
        w.record(Event(EventKind.AGENT_STARTED, Severity.INFO, message))

    try:
        w.submit_tick(T0, host_row={"cpu_pct": 1.0})
        w._drain_once()
        assert not w._watch_db()
        took = len(takes)
        for i in range(1, 4):  # ticks only: their mark moves, the ids are not read again
            w.submit_tick(T0 + i * 1000, host_row={"cpu_pct": 1.0})
            w._drain_once()
            assert not w._watch_db()
            assert w._marks.tick_ts == T0 + i * 1000
        assert len(takes) == took, takes
        note("before the check")
        w._drain_once()
        assert not w._watch_db()
        assert len(takes) == took + 1, takes
        assert w._marks.ids == real(swap.Marks, w.conn, None).ids
        note("after the check")
        w.submit_tick(T0 + 4000, host_row={"cpu_pct": 1.0})
        w._drain_once()
        os.unlink(db)
        note("into the deleted file")
        w._drain_once()
        assert w._watch_db()  # the rm noticed: the fresh file gets what was written since the check
    finally:
        w.close()
    messages = [m for k, _, m in events_seen_by_another_process(db) if k == "agent.started"]
    assert messages == ["after the check", "into the deleted file"], messages
    assert ticks_seen_by_another_process(db) == [T0 + 4000]


HOLD = """
import sys, time
from lynxtop.store.writer import StoreWriter
w = StoreWriter(sys.argv[1], lock=True)
w.start()
print("locked", flush=True)
time.sleep(60)
"""


def test_a_second_writer_by_a_symlink_in_another_directory_is_refused(tmp_path):
    live, other = tmp_path / "live", tmp_path / "other"
    live.mkdir()
    other.mkdir()
    db = live / "lynxtop.db"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        (other / "lynxtop.db").symlink_to(db)
        size = db.stat().st_size
        with pytest.raises(StoreError) as err:
            StoreWriter(other / "lynxtop.db", lock=True)
        msg = str(err.value)
        assert f"locked by pid {holder.pid}" in msg, msg
        assert str(db) in msg and f"reached through {other / 'lynxtop.db'}" in msg, msg
        assert db.stat().st_size == size
        # a hard link is the same file too
        os.link(db, other / "hard.db")
        with pytest.raises(StoreError, match=f"locked by pid {holder.pid}"):
            StoreWriter(other / "hard.db", lock=True)
    finally:
        holder.kill()
        holder.wait()
    with StoreWriter(other / "lynxtop.db", lock=True) as w:  # once the first one is gone, the path works
        assert w.stats()["alive"]
