"""Atomic file replacement, the one way the project writes a file that a reader or a crash may catch mid-write;
and the one way it reads a small file it reads every tick (`read_all`).

A reader sees the old file or the new one, never half of one: the data goes to a hidden temporary file in the
same directory (a rename is only atomic within one file system), which is fsynced, renamed over the target,
and then the directory is fsynced so that the rename itself survives a power loss. A failure removes the
temporary file and leaves the target as it was.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TextIO, TypeVar

T = TypeVar("T")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(directory: Path) -> None:
    """Persist a rename; some file systems cannot open or fsync a directory, which only loses durability."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path | str, data: str | bytes | Callable[[TextIO], T], *, mode: int | None = None,
                 fsync: bool = True) -> T | None:
    """Replace `path` with `data` atomically; returns what a callable `data` returned (else None).

    `data`: bytes, a str (written as UTF-8), or a callable that streams into the text file it is given
    (UTF-8, no newline translation), for outputs too large to build in memory.
    `mode`: the permission bits; None honours the umask like a shell's `>` (mkstemp alone would give 0600).
    `fsync=False` keeps atomicity but not durability (for files that only matter while the machine is up).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    result: T | None = None
    try:
        with os.fdopen(fd, "wb") as fb:
            os.fchmod(fb.fileno(), (0o666 & ~_umask()) if mode is None else mode)
            if isinstance(data, bytes):
                fb.write(data)
            else:
                ft = io.TextIOWrapper(fb, encoding="utf-8", newline="")
                if isinstance(data, str):
                    ft.write(data)
                else:
                    result = data(ft)
                ft.flush()
                ft.detach()  # the binary file stays open for the fsync
            fb.flush()
            if fsync:
                os.fsync(fb.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if fsync:
        _fsync_dir(path.parent)
    return result


def read_all(path: str) -> bytes:
    """A small file (a /proc file, a state file) in one go, without Python's buffered file objects: for a file
    read every tick they cost more than the read. Raises OSError as os.open and os.read do."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        parts = []
        while chunk := os.read(fd, 65536):
            parts.append(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def close_fds(fds: dict) -> None:
    """Close every descriptor a dict holds (its values) and empty it: a kept-descriptor cache's finalizer, so
    none is left open when its owner goes without a close. A descriptor already closed is passed over."""
    for fd in fds.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    """Bytes that may still be written on the file system of `path` (of its nearest existing parent before it
    exists): what root may write (the reserved blocks too) for root, else what any user may; None when statvfs
    cannot tell. May block on a hung network file system: the agent's event loop calls it in a thread."""
    at = Path(os.path.abspath(path))
    while True:
        try:
            st = os.statvfs(at)
        except FileNotFoundError:
            if at.parent == at:
                return None
            at = at.parent
            continue
        except OSError:
            return None
        return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize
