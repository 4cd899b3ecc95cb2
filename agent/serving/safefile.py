"""Reading the agent's state files (serving.json, switch.json, crash-loop.json, ray.json, agent.lock ...) without
trusting what stands at their path.

The state directory is writable by the service user, which vLLM runs as (possibly with a model's own code,
`trust_remote_code`). So a state file may be replaced by anything: a symlink to /etc/shadow (an agent run as root
would read it, or truncate it: agent.lock), a FIFO (a plain read blocks forever; at start that read runs on the
event loop, so READY never goes out and systemd's start timeout restarts the agent in a loop), a device, or a
huge file. Here a state file is only ever opened without following a symlink and without blocking, and is used
only if it is a regular file of at most `MAX_BYTES`; its JSON is read strictly (`loads_strict`): Python's json
takes `Infinity`, `NaN` and `1e999` (inf) and ints of any size, on which `int()` or a date raise what no caller
expects (an agent that crashed at every start on `"since_ms": 1e999`).

Writes need nothing of this: `atomic_write` renames a new file over the path, and a rename replaces a symlink
rather than writing through it.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from lynxtop.agent import dirtrust

MAX_BYTES = 1 << 20  # every state file is a few KiB: anything larger is not one of ours
INT_LIMIT = 1 << 63  # the JSON ints a state file holds (pids, ms, run ids) fit 64 bits
MAX_DEPTH = 32  # a state file nests two or three levels
_SAFE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY

_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"))


class StateFileError(OSError):
    """A state file that exists but is not used: not a regular file, too large, or not UTF-8. str() is the
    whole message, naming the path; `reason` the same without it (for a caller that names the path itself).
    An OSError, so a caller's `except OSError` (cannot read) takes it."""

    def __init__(self, path: Path | str, reason: str, refused: str = "not read"):
        super().__init__(f"{path} {reason}: {refused}")
        self.path, self.reason = str(path), reason


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path: Path | str, flags: int = os.O_RDONLY, mode: int = 0o600, *, refused: str = "not read") -> int:
    """A descriptor of the regular file at `path`, opened with `flags` but never through a symlink and never
    blocking (a FIFO); `flags` may hold O_CREAT (then `mode` applies). Raises FileNotFoundError when there is no
    file (and no O_CREAT), StateFileError "<path> is a FIFO (named pipe), not a regular file: <refused>" when
    something else stands there, other OSErrors as os.open does."""
    try:
        before: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
        before = None
    if before is not None and not stat.S_ISREG(before.st_mode):  # refused before opening: a device is not opened
        raise StateFileError(path, f"is {_kind(before.st_mode)}, not a regular file", refused)
    try:
        fd = os.open(path, flags | _SAFE_FLAGS, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symlink put there since the lstat
            raise StateFileError(path, "is a symbolic link, not a regular file", refused) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StateFileError(path, f"is {_kind(st.st_mode)}, not a regular file", refused)
        if before is not None and (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise StateFileError(path, "was replaced while being opened", refused)
        os.set_blocking(fd, True)  # a regular file: only the open needed O_NONBLOCK
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: Path | str, limit: int = MAX_BYTES, owner: int | None = None) -> bytes:
    """The content of the regular file at `path`, at most `limit` bytes (else StateFileError); with `owner`, only
    a file that uid owns (checked on the descriptor read from: a file swapped in after the check is never read)."""
    fd = open_regular(path)
    try:
        if owner is not None and (uid := os.fstat(fd).st_uid) != owner:
            raise StateFileError(path, f"belongs to {dirtrust.user(uid)}, not to this agent's user "
                                       f"{dirtrust.user(owner)}: another user may have written it (remove it if it "
                                       "is not the agent's)")
        parts, size = [], 0
        while size <= limit and (chunk := os.read(fd, min(65536, limit + 1 - size))):
            parts.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise StateFileError(path, f"is larger than {limit} bytes, too large for a state file")
    return b"".join(parts)


def read_text(path: Path | str, limit: int = MAX_BYTES, owner: int | None = None) -> str:
    """A state file's text (UTF-8). FileNotFoundError: there is none; StateFileError (an OSError, its str() the
    whole message naming the path): something is there that is not read; any other OSError: it could not be read.
    Never follows a symlink, never blocks."""
    data = read_bytes(path, limit, owner)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StateFileError(path, f"is not UTF-8 text (byte {exc.start})") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a state file holds")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"the number {text} is not finite")
    return value


def _int(text: str) -> int:
    if len(text.lstrip("-")) > 19:  # before int(): Python's digit limit would raise its own message
        raise ValueError(f"the integer {text[:24]}... is out of range (64 bits)")
    value = int(text)
    if not -INT_LIMIT <= value < INT_LIMIT:
        raise ValueError(f"the integer {value} is out of range (64 bits)")
    return value


def _depth(value: Any) -> int:
    """How deeply `value` nests (iteratively: a deep value must not exhaust the stack here either)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def loads_strict(text: str) -> Any:
    """JSON as a state file holds it: finite numbers, ints of 64 bits, at most MAX_DEPTH levels (whatever reads
    or prints it later must not run out of stack). Raises ValueError naming what is wrong (json.JSONDecodeError
    is one)."""
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite, parse_int=_int)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if _depth(value) > MAX_DEPTH:
        raise ValueError(f"nested more than {MAX_DEPTH} levels deep")
    return value


def read_json(path: Path | str, limit: int = MAX_BYTES) -> Any:
    """`read_text` then `loads_strict`: FileNotFoundError, OSError (StateFileError among them) or ValueError."""
    return loads_strict(read_text(path, limit))


def open_log_append(path: Path | str, mode: int = 0o640, *, refused: str = "not written") -> int:
    """A write-only O_APPEND descriptor of a run's log at `path` (vLLM's, Ray's), which may sit in a directory
    someone else can write (a configured log_dir; Ray's log name is predictable): never through a symlink and
    only a regular file. A new name is created with O_EXCL (a link planted there, even a dangling one, is
    refused by the kernel rather than followed); an existing file is appended to only when it is a regular file
    the agent's own user owns with one name (a hard link to another file, /etc/shadow, has two). StateFileError
    naming the path when something else stands there; other OSErrors (no space, no permission) as os.open."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | _SAFE_FLAGS, mode)
    except FileExistsError:
        pass
    else:
        os.set_blocking(fd, True)  # the server's stdout: no O_NONBLOCK left on it
        return fd
    fd = open_regular(path, os.O_WRONLY | os.O_APPEND, refused=refused)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise StateFileError(path, f"is owned by uid {st.st_uid}, not by the agent's user (uid {os.geteuid()})",
                                 refused)
        if st.st_nlink != 1:
            raise StateFileError(path, f"has {st.st_nlink} names (hard links), not one", refused)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_log_read(path: Path | str, *, refused: str = "not read") -> BinaryIO:
    """A run's log opened for reading (the logs answer, the start-up phases, an event's log tail): a regular
    file with one name, never through a symlink and never blocking on a FIFO, as its directory may be writable by
    others (a link there once served a 0600 file as a run's log lines). StateFileError naming the path and why
    when something else stands there; FileNotFoundError and other OSErrors as open() raises them."""
    fd = open_regular(path, refused=refused)
    try:
        links = os.fstat(fd).st_nlink
        if links != 1:  # a hard link to another file (only a link can give a log a second name)
            raise StateFileError(path, f"has {links} names (hard links), not one", refused)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
