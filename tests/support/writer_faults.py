"""Faults put into a running StoreWriter's connection from the writer's own thread.

A statement run on `w.conn` from the test's thread races the writer's statements on that one connection: about
once in 2,000 flips of `PRAGMA query_only`, a batch's inserts ran outside their transaction (the COMMIT then
found none), the batch was written again one op at a time, and its events were stored twice (CI of session 22).
The agent never shares the connection; the tests must not either.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from lynxtop.store.writer import StoreWriter

FULL_PAGES = 1073741823  # SQLite's default max_page_count: space again


def on_writer_thread(w: StoreWriter, fn: Callable[[sqlite3.Connection], object]) -> None:
    """Run `fn(w.conn)` in the writer's thread at the start of its next drain, before anything that drain writes.

    The fault takes effect when there is work (as a disk that fills or a remount would for the next write); a
    writer retrying after a failure drains every `retry_interval_s`, so a fault lifted is seen without a flush.
    """
    todo: list[Callable[[sqlite3.Connection], object]] | None = w.__dict__.get("_test_faults")
    if todo is None:
        todo = w.__dict__["_test_faults"] = []
        drain = w._drain_once

        def drain_after_faults() -> None:
            while todo:
                todo.pop(0)(w.conn)
            drain()

        w._drain_once = drain_after_faults  # type: ignore[method-assign]
    todo.append(fn)
    with w._cv:
        w._cv.notify_all()


def read_only(w: StoreWriter, on: bool) -> None:
    """SQLite's real SQLITE_READONLY on every write (as a read-only remount gives), or writes allowed again."""
    on_writer_thread(w, lambda c: c.execute(f"PRAGMA query_only = {int(on)}"))


def disk_full(w: StoreWriter, full: bool) -> None:
    """SQLITE_FULL from the next page the file needs (the "disk" is full at its present size), or space again."""
    def apply(c: sqlite3.Connection) -> None:
        pages = c.execute("PRAGMA page_count").fetchone()[0] if full else FULL_PAGES
        c.execute(f"PRAGMA max_page_count = {pages}")

    on_writer_thread(w, apply)
