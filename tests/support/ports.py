"""Free TCP ports and short directories for AF_UNIX sockets."""

from __future__ import annotations

import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the kernel's pick; a race with another binder is possible but rare)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextmanager
def short_dir(prefix: str = "lxt") -> Iterator[Path]:
    """A directory with a short path, removed afterwards: AF_UNIX paths are limited to 107 bytes and pytest's
    tmp_path can be longer."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
