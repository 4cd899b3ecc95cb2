"""Give a process vLLM's title (`VLLM::EngineCore`) the way setproctitle does, without the dependency.

Two places show a title: /proc/PID/comm (15 bytes, set with prctl(PR_SET_NAME)) and /proc/PID/cmdline (the
argv area of the stack). We overwrite the argv area in place: the title, a NUL, and a non-NUL last byte, which
makes the kernel report only the title (its "setproctitle" rule). psutil's name() then reads the full
16-character name from cmdline because comm is a truncated prefix of it. Linux only; elsewhere a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

PR_SET_NAME = 15
PR_SET_PDEATHSIG = 1


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


def _argv_area() -> tuple[int, int] | None:
    """(arg_start, arg_end) of this process from /proc/self/stat fields 48 and 49 (Linux >= 3.5)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except OSError:
        return None
    rest = raw[raw.rfind(")") + 2:].split()
    try:
        # rest[0] is field 3 (state): field N is rest[N - 3]
        return int(rest[45]), int(rest[46])
    except (IndexError, ValueError):
        return None


def set_title(title: str) -> bool:
    """Set comm and cmdline to `title`; True when cmdline was rewritten."""
    if not sys.platform.startswith("linux"):
        return False
    libc = _libc()
    if libc is not None:
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(title.encode()[:15]), 0, 0, 0)
    area = _argv_area()
    if area is None:
        return False
    start, end = area
    size = end - start
    data = title.encode()
    if size < len(data) + 2:
        return False
    buf = data + b"\0" * (size - len(data) - 1) + b" "  # non-NUL last byte: the kernel stops at our NUL
    ctypes.memmove(start, buf, size)
    return True


def die_with_parent(sig: int) -> None:
    """Receive `sig` when the parent exits (what vLLM's workers effectively do when EngineCore dies)."""
    libc = _libc()
    if libc is not None and sys.platform.startswith("linux"):
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
