"""A background WAL checkpointer, so the writer thread never pays for copying pages and fsyncing the file.

SQLite's automatic checkpoint runs inside the committing connection: with a backlog it cost the writer
about a fifth of its throughput (measured on an 8-GPU synthetic load). Here a second connection, kept open,
runs PASSIVE checkpoints (they never block the writer or readers) every `interval_s` while commits come, in
parallel because SQLite releases the GIL. If this thread cannot keep up or fails, the writer's own autocheckpoint comes
back at a larger WAL size as a safety net, so the WAL cannot grow without bound.

Every 5 s, not after every commit: a 1 Hz tick rewrites the same few pages (each table's last leaf and its
indexes), and one checkpoint copies a page once however often it changed (the checkpoint cost half a
millisecond a tick at 8 GPUs). The WAL holds 5 s of ticks (~100 frames); with `synchronous = NORMAL` a power
loss may cost the commits since the last checkpoint: up to 5 s of history, not 1 s.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from lynxtop.store import inproc
from lynxtop.store.schema import BUSY_TIMEOUT_MS

log = logging.getLogger(__name__)

# The writer's fallback autocheckpoint (pages): far above what one interval writes at 1 Hz, so it only
# triggers when this thread is stuck.
FALLBACK_AUTOCHECKPOINT_PAGES = 16384
SCAN_S = 2.0  # how long a look for an unlinked -wal/-shm holds (the writer looks as often: WAL_CHECK_S)


class Checkpointer:
    def __init__(self, path: Path, interval_s: float = 5.0):
        self.path = path
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None
        self.runs = 0
        # (monotonic time the last scan goes stale, what it found): one tuple, so the writer's note is atomic
        self._scan: tuple[float, bool] = (0.0, False)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="lynxtop-store-checkpoint", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """Called after a commit: a checkpoint soon, not a busy loop (the event coalesces pokes)."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def note_scan(self, unlinked: bool, at: float) -> None:
        """The writer's own scan of the same files (inproc.unlinked_files at monotonic `at`): this thread takes it
        for 2 s as it takes its own, instead of scanning again (~0.13 ms a scan at 1 Hz, issue 29.3)."""
        self._scan = (at + SCAN_S, unlinked)

    def _wal_unlinked(self) -> bool:
        """inproc.unlinked_files, at most every 2 s (a full scan of /proc/self/fd is ~3 ms at 500 descriptors;
        between full scans only the -wal/-shm descriptors are read); a scan of the writer's counts as one."""
        now = time.monotonic()
        stale, unlinked = self._scan
        if now >= stale:
            unlinked = bool(inproc.unlinked_files(self.path))
            self._scan = (now + SCAN_S, unlinked)
        return unlinked

    def _run(self) -> None:
        conn: _Kept | None = None
        try:
            while not self._stop.is_set():
                poked = self._wake.wait(self.interval_s)
                self._wake.clear()
                if self._stop.is_set():
                    return
                if self._wal_unlinked():
                    # The -wal/-shm were unlinked under this process: this connection must not checkpoint the
                    # old (deleted) files into the main one. The writer copies its frames, stops this thread
                    # (the connection closes with it) and starts a new one on the new files.
                    conn = _Kept.close(conn)
                    self._stop.wait(self.interval_s)
                    continue
                if not poked and self.runs:
                    continue  # nothing was committed since the last checkpoint
                conn = self._checkpoint(conn)
                self._stop.wait(self.interval_s)  # the commits of the next interval share one checkpoint
        finally:
            _Kept.close(conn)

    def _checkpoint(self, conn: _Kept | None) -> _Kept | None:
        """One PASSIVE checkpoint on the kept connection (a new one when the file was replaced); the
        connection to keep, None after an error (the next round connects again)."""
        try:
            conn = _Kept.current(conn, self.path)
            conn.conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            self.runs += 1
            self.last_error = None
            return conn
        except (sqlite3.Error, OSError) as exc:  # full disk, busy, file gone: the next round tries again
            if self.last_error != str(exc):
                log.warning("%s: background checkpoint failed: %s", self.path, exc)
            self.last_error = str(exc)
            return _Kept.close(conn)


@dataclass
class _Kept:
    """The checkpointer's connection and the file it was opened on. Kept between rounds (a connection a second
    cost more than the checkpoint); os.stat, which never opens the file, tells when the writer replaced it."""

    conn: sqlite3.Connection
    ident: tuple[int, int]

    @staticmethod
    def current(kept: _Kept | None, path: Path) -> _Kept:
        st = os.stat(path)
        ident = (st.st_dev, st.st_ino)
        if kept is not None and kept.ident == ident:
            return kept
        _Kept.close(kept)
        conn = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=rw", uri=True, isolation_level=None,
                               timeout=BUSY_TIMEOUT_MS / 1000)
        return _Kept(conn, ident)

    @staticmethod
    def close(kept: _Kept | None) -> None:
        if kept is not None:
            with contextlib.suppress(sqlite3.Error):
                kept.conn.close()
