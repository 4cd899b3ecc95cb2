"""A real small file system (a tmpfs mounted for one test) and filling it to the last byte: a full disk as the
kernel gives it (ENOSPC, SQLite's SQLITE_FULL), not a faked error. Needs root (CI runs as root); elsewhere the test
is skipped, or fails where real stages are required (support/real.py)."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from support.real import unavailable


@contextmanager
def mounted(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (mount's notation: "20m") at `where` (made), unmounted afterwards."""
    if os.geteuid() != 0:
        unavailable(f"mounts a {size} tmpfs: needs root (CI runs as root)")
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        unavailable(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(fs: Path) -> Path:
    """Fill `fs` to the last byte; returns the filler to delete when space should come back."""
    filler = fs / "filler"
    with open(filler, "wb", buffering=0) as f:
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    return filler
