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

When the writer's tick commits are themselves 5 s apart (the 1 Hz agent lingers 5 s: store/writer.py
`linger_for`), each commit's poke starts a round at once: the two threads wake together, once a round, and
the round takes the writer's look at the -wal/-shm made just before its commit instead of scanning again
(a round every 5 s on its own clock drifted against the commits: half its rounds waited twice, most scanned).
Events and other writes commit without a poke; the next round copies them. A poke within a second of the last
round (flushed or backlogged commits) waits for the next poke or the timer, an interval and a second after.
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
# Rounds that follow commits are at least this far apart: a burst of commits (flushes, a backlog) shares one.
ROUND_GAP_S = 1.0


class Checkpointer:
    def __init__(self, path: Path, interval_s: float = 5.0, commit_every_s: float = 0.0,
                 min_gap_s: float = ROUND_GAP_S):
        self.path = path
        self.interval_s = interval_s
        # The writer's linger: its tick commits come that far apart. At least an interval: each commit's poke is a
        # round, at once (see the module's docstring); else a round every interval, as commits come.
        self.aligned = commit_every_s >= interval_s
        self.min_gap_s = min_gap_s
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None
        self.runs = 0
        self._last_round = 0.0  # monotonic time the last checkpoint started (aligned rounds keep their spacing)
        self._pending = False  # aligned: a poke since the last round that did not wake the thread (see poke)
        # (monotonic time the last scan goes stale, what it found): one tuple, so the writer's note is atomic
        self._scan: tuple[float, bool] = (0.0, False)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="lynxtop-store-checkpoint", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """Called after a commit: a checkpoint soon, not a busy loop (the event coalesces pokes). Aligned, a poke
        within `min_gap_s` of the last round is left to the next poke or the timer (see the module's docstring)."""
        if self.aligned and time.monotonic() < self._last_round + self.min_gap_s:
            self._pending = True
            return
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
        # Aligned, the wait is for the next commit's poke; its timer (the idle look below, a deferred poke's round)
        # runs a gap past the next commit, so it does not fire a moment before that poke.
        idle_s = self.interval_s + self.min_gap_s if self.aligned else self.interval_s
        try:
            while not self._stop.is_set():
                poked = self._wake.wait(idle_s)
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
                if not (poked or self._pending) and self.runs:
                    continue  # nothing was committed since the last checkpoint
                self._pending = False  # before the round: a commit after this is copied now or by the next one
                self._wake.clear()
                self._last_round = time.monotonic()
                conn = self._checkpoint(conn)
                if not self.aligned:
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
