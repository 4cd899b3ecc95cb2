"""The history database's connections inside this process, so the writer can renew them all at once.

SQLite shares one wal-index mapping (-shm) between every connection of a process to the same file. If the
-wal and -shm were unlinked under the agent (an outside process that could take the file's exclusive lock
and believed itself the last user), the writer cannot attach to the new files until every connection of
this process has let go of the old mapping. Readers register here; the writer detaches them (each under
its own lock, so never in the middle of a query) and they reconnect on their next question.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from pathlib import Path
from typing import Protocol


class Detachable(Protocol):
    def detach(self, timeout: float) -> bool: ...


_lock = threading.Lock()
_readers: dict[str, weakref.WeakSet] = {}
_renewing: dict[str, threading.Lock] = {}


def renewal_lock(path: Path) -> threading.Lock:
    """Held by the writer while it renews its connection, and by a reader while it reconnects, so a
    reader never attaches to the old (deleted) -shm mapping in the middle of a renewal."""
    with _lock:
        return _renewing.setdefault(key(path), threading.Lock())


def key(path: Path) -> str:
    return os.path.realpath(path)


def register(path: Path, reader: Detachable) -> None:
    with _lock:
        _readers.setdefault(key(path), weakref.WeakSet()).add(reader)


def unregister(path: Path, reader: Detachable) -> None:
    with _lock:
        readers = _readers.get(key(path))
        if readers is not None:
            readers.discard(reader)


def detach_readers(path: Path, timeout: float) -> tuple[int, int]:
    """Close every registered reader's connection to `path`; returns (detached, still attached)."""
    with _lock:
        readers = list(_readers.get(key(path), ()))
    deadline = time.monotonic() + timeout
    done = left = 0
    for r in readers:
        if r.detach(max(0.0, deadline - time.monotonic())):
            done += 1
        else:
            left += 1
    return done, left


# realpath of a database -> (when /proc/self/fd was last listed, the fd links that named its -wal/-shm then)
_wal_fds: dict[str, tuple[float, list[str]]] = {}
FULL_SCAN_S = 30.0  # the whole descriptor table is listed at least this often (new connections' descriptors)


def unlinked_files(path: Path, full: bool = False) -> list[str]:
    """The -wal/-shm of `path` that this process still has open although they were unlinked.

    Reads /proc/self/fd links and stats them (stat follows the link without opening the file: opening
    and closing it would itself drop SQLite's locks). Empty where /proc is not available. Between full
    listings only the descriptors that named those files are looked at: an unlinked file is one inode, and the
    writer's connection keeps its descriptors on it; any of them naming something else lists the table again.
    """
    base = key(path)
    wanted = {f"{base}-wal", f"{base}-shm"}
    now = time.monotonic()
    cached = None if full else _wal_fds.get(base)
    if cached is not None and now - cached[0] < FULL_SCAN_S:
        out = _unlinked_among(cached[1], wanted)
        if out is not None:
            return out
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return []
    links = []
    for fd in fds:
        link = f"/proc/self/fd/{fd}"
        try:
            target = os.readlink(link)
        except OSError:
            continue  # closed meanwhile (the listing's own fd, for one)
        if target.removesuffix(" (deleted)") in wanted:
            links.append(link)
    if links:
        _wal_fds[base] = (now, links)
    else:
        _wal_fds.pop(base, None)  # nothing open yet: list again next time
    return _unlinked_among(links, wanted) or []


def _unlinked_among(links: list[str], wanted: set[str]) -> list[str] | None:
    """The wanted files these descriptor links show unlinked; None when one of them names another file now."""
    out: list[str] = []
    for link in links:
        try:
            target = os.readlink(link)
        except OSError:
            return None
        name = target.removesuffix(" (deleted)")
        if name not in wanted:
            return None
        try:
            st = os.stat(link)
        except OSError:
            return None
        if st.st_nlink == 0 or target.endswith(" (deleted)"):
            out.append(name)
            continue
        try:
            cur = os.stat(name)
        except FileNotFoundError:
            out.append(name)
            continue
        except OSError:
            continue
        if (cur.st_dev, cur.st_ino) != (st.st_dev, st.st_ino):  # replaced by another file of the same name
            out.append(name)
    return sorted(set(out))


# ---------------------------------------------------------------------------------------------- the main file

def lock_holders(st: os.stat_result) -> list[int]:
    """Pids holding a lock on the file `st` describes, from /proc/locks (empty where it cannot be read)."""
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    pids = []
    for line in lines:
        parts = line.split()
        if len(parts) < 6 or parts[1] == "->":  # "->" marks a waiter, not a holder
            continue
        try:
            major, minor, ino = parts[5].split(":")
            if (int(major, 16), int(minor, 16), int(ino)) == want:
                pids.append(int(parts[4]))
        except ValueError:
            continue
    return sorted(set(pids))


def main_file_change(path: Path, fd: int) -> str | None:
    """How the file at `path` differs from the one open on `fd` (the writer's own descriptor on its database).

    None: the path still names it. "unlinked": it was deleted (no name left: nlink 0). "moved": it was renamed
    away and nothing took its place. "replaced": the path names another file now (a backup restored by mv).
    Only stat calls: opening the database again would drop SQLite's locks (see above).
    """
    mine = os.fstat(fd)
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return "unlinked" if mine.st_nlink == 0 else "moved"
    except OSError:
        return None  # unreadable directory, say: not a swap; the writes themselves will tell
    if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
        return None
    return "replaced"
