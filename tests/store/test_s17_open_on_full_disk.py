"""A history database that cannot be opened because its disk is full (session 17).

The previous agent closed cleanly, so SQLite removed the -wal/-shm; on a full file system the next open cannot
create a new -shm ("disk I/O error", SQLITE_IOERR_SHMSIZE) and the agent exited 1 at every start until systemd
gave up, leaving vLLM unsupervised. The writer now starts unopened, says why, retries the open in its own thread
and writes what it kept once space returns. Real small tmpfs (root only), filled to the last byte.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from support.small_fs import fill, mounted

from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.store.errors import StoreError
from lynxtop.store.writer import StoreWriter

from .helpers import submit


@pytest.fixture
def small_fs(tmp_path):
    """A 4m tmpfs (support/small_fs.py)."""
    with mounted(tmp_path / "small", "4m") as mnt:
        yield mnt


def _cleanly_closed(db: Path) -> int:
    """A database with one run, closed as a stopping agent closes it (-wal/-shm removed); its run id."""
    w = StoreWriter(db)
    w.start()
    rid = w.create_run(profile="before")
    assert w.flush(10)
    w.close()
    assert not Path(f"{db}-shm").exists() and not Path(f"{db}-wal").exists()
    return rid


def _wait(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.timeout(60)
def test_writer_on_a_full_disk_starts_unopened_and_writes_once_space_returns(small_fs):
    db = small_fs / "h.db"
    old_run = _cleanly_closed(db)
    filler = fill(small_fs)
    w = StoreWriter(db, queue_max=50, lock=True)  # raised StoreError "disk I/O error" before
    try:
        w.start()
        st = w.stats()
        assert st["retrying"] and st["alive"], st
        err = st["last_error"]
        assert "history unavailable" in err and "no space left" in err and str(db) in err, err
        assert "bytes free" in err, err
        assert st["unavailable"] == err
        rid = w.create_run(profile="while-full")  # a run that starts is always recorded, its id above the old
        assert rid == old_run + 1
        w.record(Event(EventKind.SERVING_CRASH, Severity.ERROR, "while full", {}))
        submit(w, 80, gpus=2)  # 30 beyond the queue's bound: the oldest dropped, counted
        time.sleep(1.5)  # a few retries while still full
        assert w.stats()["unavailable"] and w.stats()["dropped"] == 30, w.stats()
        filler.unlink()
        assert w.flush(20), w.stats()  # reopened at once when space is back, not after the 5-30 s backoff
        st = w.stats()
        assert st["last_error"] is None and st["unavailable"] is None and not st["retrying"], st
    finally:
        w.close()
    c = sqlite3.connect(db)
    assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert c.execute("SELECT count(DISTINCT ts_ms) FROM gpu_samples").fetchone()[0] == 50
    assert c.execute("SELECT id, profile FROM runs ORDER BY id").fetchall() == [(old_run, "before"),
                                                                                 (rid, "while-full")]
    kinds = [r[0] for r in c.execute("SELECT kind FROM events ORDER BY id")]
    assert "store.write_failed" in kinds and "serving.crash" in kinds and "store.writes_resumed" in kinds, kinds
    resumed = c.execute("SELECT details FROM events WHERE kind = 'store.writes_resumed'").fetchone()[0]
    assert '"dropped_ticks": 30' in resumed, resumed


@pytest.mark.timeout(60)
def test_writer_keeps_retrying_while_the_disk_stays_full(small_fs):
    """Nothing written, nothing raised, the thread alive; close() ends it without waiting for space."""
    db = small_fs / "h.db"
    _cleanly_closed(db)
    fill(small_fs)
    w = StoreWriter(db)
    w.start()
    submit(w, 3, gpus=1)
    time.sleep(1.2)
    st = w.stats()
    assert st["alive"] and st["unavailable"] and st["written_ticks"] == 0, st
    w.close(timeout=0.5)
    assert not w.alive()


@pytest.mark.timeout(60)
def test_a_locked_database_on_a_full_disk_is_still_refused(small_fs):
    """Only a full disk is waited out: another agent's lock (an operator error) still stops this one."""
    db = small_fs / "h.db"
    _cleanly_closed(db)
    first = StoreWriter(db, lock=True)
    try:
        fill(small_fs)
        with pytest.raises(StoreError, match="locked by"):
            StoreWriter(db, lock=True)
    finally:
        first.close()
