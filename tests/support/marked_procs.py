"""Processes marked by an environment variable: a test puts it in what it starts (the demo, say) and finds every
process of that tree by it, whatever re-parented or re-grouped them."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path

MARK = "LT_DEMO_LIFE_MARK"


def live(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes().decode("ascii", "replace")
    except OSError:
        return False
    return raw[raw.rfind(")") + 2:][:1] not in ("Z", "X")


def marked(mark: str) -> list[int]:
    """Live processes whose environment carries `mark`: the demo and everything it (or its children) started."""
    entry = f"{MARK}={mark}".encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{name}/environ").read_bytes()
        except OSError:
            continue
        if entry in env.split(b"\0") and live(int(name)):
            out.append(int(name))
    return out


@contextlib.contextmanager
def marked_tree() -> Iterator[str]:
    """A fresh marker for what a test starts (put it in its environment under MARK); whatever carries it at the
    end is SIGKILLed, so a failing assertion leaves nothing of the tree running."""
    value = secrets.token_hex(8)
    try:
        yield value
    finally:
        for pid in marked(value):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
