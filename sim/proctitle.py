"""Give a process vLLM's title (`VLLM::EngineCore`) the way setproctitle does, without the dependency.

Two places show a title: /proc/PID/comm (15 bytes, set with prctl(PR_SET_NAME)) and /proc/PID/cmdline (the
argv area of the stack). setproctitle (py-setproctitle 1.3, spt_status.c, Linux) makes room for long titles:
the first time, it takes the argv strings and the environment strings that follow them on the stack as one
buffer, copies the C environment to the heap (`environ` points there from then on), and writes the title
followed by NULs over the whole buffer. So, as measured with setproctitle 1.3.8:

- /proc/PID/environ keeps its length but reads all NULs: the run token the agent put there is gone (psutil's
  environ() is empty), while getenv() and os.environ inside the process still have every variable;
- /proc/PID/cmdline is the title and NULs up to the argv area's end (psutil's cmdline() is the title followed by
  empty strings); a title longer than argv runs into the environment area and the kernel reads it to its NUL.

That is what `set_title` does (SPT_NOENV set in the environment keeps the environment, as setproctitle's does).
psutil's name() reads the full 16-character name from cmdline because comm is a truncated prefix of it.
Linux only; elsewhere a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

PR_SET_NAME = 15
PR_SET_PDEATHSIG = 1

# (start, size) of the title's buffer, found at the first call and kept, as setproctitle keeps it: by then the
# environment has moved, and a forked child (a worker) has the same stack at the same addresses
_buffer: tuple[int, int] | None = None


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


def _areas() -> tuple[int, int, int, int] | None:
    """(arg_start, arg_end, env_start, env_end) of this process from /proc/self/stat fields 48-51 (Linux >= 3.5)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except OSError:
        return None
    rest = raw[raw.rfind(")") + 2:].split()
    try:
        # rest[0] is field 3 (state): field N is rest[N - 3]
        return int(rest[45]), int(rest[46]), int(rest[47]), int(rest[48])
    except (IndexError, ValueError):
        return None


def _environ_strings(libc: ctypes.CDLL) -> list[int]:
    """The addresses of C's environment strings, in order (what `environ` points to now)."""
    env = ctypes.POINTER(ctypes.c_void_p).in_dll(libc, "environ")
    out: list[int] = []
    if not env:
        return out
    i = 0
    while env[i]:
        out.append(env[i])
        i += 1
    return out


def _move_environ(libc: ctypes.CDLL) -> int | None:
    """Copy C's environment to the heap (clearenv, then setenv of each entry); the end of the environment strings
    that followed argv contiguously before (their last NUL), or None when `environ` cannot be read."""
    try:
        addrs = _environ_strings(libc)
    except (ValueError, OSError):
        return None
    entries = [ctypes.string_at(a) for a in addrs]
    end = None
    areas = _areas()
    if areas is not None:
        end = areas[1] - 1  # argv's last NUL
        for addr, entry in zip(addrs, entries, strict=True):  # spt_status.c: contiguous ones only
            if addr == end + 1:
                end = addr + len(entry)
    libc.clearenv()
    for entry in entries:
        name, eq, value = entry.partition(b"=")
        if eq and name:
            libc.setenv(name, value, 1)
    return end


def _title_buffer(libc: ctypes.CDLL) -> tuple[int, int] | None:
    """(start, size) of the argv area, with the environment area after it unless SPT_NOENV is set."""
    areas = _areas()
    if areas is None:
        return None
    start, arg_end = areas[0], areas[1]
    end = arg_end - 1
    if not os.environ.get("SPT_NOENV"):
        moved = _move_environ(libc)
        if moved is not None:
            end = moved
    return start, end - start


def set_title(title: str) -> bool:
    """Set comm and cmdline to `title` as setproctitle does; True when cmdline was rewritten."""
    global _buffer
    if not sys.platform.startswith("linux"):
        return False
    libc = _libc()
    if libc is None:
        return False
    if _buffer is None:
        _buffer = _title_buffer(libc)
    if _buffer is None or _buffer[1] <= 0:
        return False
    start, size = _buffer
    data = title.encode()[:size - 1]  # strlcpy into the buffer
    ctypes.memmove(start, data, len(data))
    ctypes.memset(start + len(data), 0, size - len(data))  # spt pads with NULs (PS_PADDING on Linux)
    libc.prctl(PR_SET_NAME, ctypes.c_char_p(title.encode()[:15]), 0, 0, 0)
    return True


def die_with_parent(sig: int) -> None:
    """Receive `sig` when the parent exits (what vLLM's workers effectively do when EngineCore dies)."""
    libc = _libc()
    if libc is not None and sys.platform.startswith("linux"):
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
