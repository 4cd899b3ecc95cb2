"""The current run's log, capped in size by copy-truncate: a run serves for weeks, its log does not grow for weeks.

vLLM writes to its log for as long as it runs (uvicorn's access line per request, the 10 s stats line: 0.2-0.4 GB
a day at 20-50 req/s), and the log shares its disk with the history database and serving.json. The server holds
the file open O_APPEND (launcher.spawn), so the log cannot be renamed away (the server would go on writing to
the renamed file); it can be truncated: after truncate(0) the writer's next write lands at the new end. So once
the log passes `[agent] run_log_max_mb`, its last part (at most half the cap, from a line's start: the copy is
bounded) is copied to `<log>.1`, replacing an older one, and the log is truncated to 0.

Lines written between the copy and the truncate are lost (the copy of half the cap takes well under a second).
The readers of the log (the start-up phase tracker, the API's log follower) notice a file shorter than their
offset and read it again from its start.

Two things the truncate would take are put back at once: the start-up line naming the run's `vllm_dist_*`
rendezvous file (runfiles reads the log's start for it when the run ends: without it the file stayed in /tmp),
as one line at the new start; and the log's disk reserve (logreserve.py), which the truncate frees.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lynxtop.agent.serving import logreserve, runfiles

if TYPE_CHECKING:
    from lynxtop.contract.config import AgentConfig

log = logging.getLogger(__name__)

CHECK_EVERY_S = 30.0  # how often the log's size is looked at (a stat; a copy only once past the cap)
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Capped:
    """One cap: the log's size then, the bytes kept in `<log>.1`, and why none were if the copy failed."""

    size: int
    kept: int
    error: str | None = None


def kept_path(log_path: str | Path) -> Path:
    """Where the most recent part of a capped log is kept: `<log>.1`."""
    return Path(f"{log_path}.1")


def cap(log_path: str | Path, max_bytes: int, reserve_bytes: int = 0) -> Capped | None:
    """Cap `log_path` at `max_bytes` (<= 0: no cap); None when nothing was done. Blocking: call it in a thread.
    `reserve_bytes`: the log's disk reserve, made again after the truncate (logreserve.py).

    The log is truncated even if its copy fails (a full disk): the cap is what keeps the disk for the database."""
    if max_bytes <= 0:
        return None
    try:  # the file itself, not a symlink: truncated through the descriptor that read it
        fd = os.open(log_path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None  # gone, or not ours: nothing to cap
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size <= max_bytes:
            return None
        # read before the copy: nothing between the copy and the truncate (the lines written then are lost)
        dist = runfiles.dist_files_in(os.pread(fd, min(st.st_size, runfiles.LOG_SCAN_BYTES), 0))
        kept, errors = 0, []
        try:
            kept = _copy_tail(fd, st.st_size, max_bytes // 2, kept_path(log_path))
        except OSError as exc:
            errors.append(f"cannot keep its last part in {kept_path(log_path)}: {exc.strerror or exc}")
        os.ftruncate(fd, 0)
        errors += _put_back(fd, dist, reserve_bytes)
        return Capped(st.st_size, kept, "; ".join(errors) or None)
    finally:
        os.close(fd)


def _put_back(fd: int, dist: set[str], reserve_bytes: int) -> list[str]:
    """After the truncate: the line naming the rendezvous files (appended: the writer may have written since),
    then the disk reserve. What could not be done, said (a failed reserve is retried by logreserve's keeper)."""
    errors = []
    if dist:
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
            os.write(fd, runfiles.dist_note(dist))
        except OSError as exc:
            errors.append(f"cannot keep the line naming {', '.join(sorted(dist))} (removed when the run ends): "
                          f"{exc.strerror or exc}")
    if reserve_bytes > 0:
        try:
            logreserve.reserve_fd(fd, reserve_bytes)
        except OSError as exc:
            errors.append(f"its disk reserve is not made again yet: {exc.strerror or exc}")
    return errors


def _line_start(fd: int, size: int, keep: int) -> int:
    """The first line start within the last `keep` bytes of the file (`size`: nothing to keep, none found)."""
    start = size - keep
    if start <= 0:
        return 0
    pos = start - 1  # the byte before: a newline there means `start` begins a line
    while pos < size:
        data = os.pread(fd, min(_CHUNK, size - pos), pos)
        if not data:
            break
        nl = data.find(b"\n")
        if nl >= 0:
            return pos + nl + 1
        pos += len(data)
    return size


def _copy_tail(fd: int, size: int, keep: int, dest: Path) -> int:
    """Copy the file's whole lines of its last `keep` bytes (up to `size`) to `dest`, replaced atomically."""
    start = _line_start(fd, size, keep)
    tmp = Path(f"{dest}.tmp")
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
    try:
        pos = start
        while pos < size:
            data = os.pread(fd, min(_CHUNK, size - pos), pos)
            if not data:
                break
            view = memoryview(data)
            while view:
                view = view[os.write(out, view):]
            pos += len(data)
        os.close(out)
        out = -1
        os.replace(tmp, dest)
    except BaseException:
        if out >= 0:
            os.close(out)
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return pos - start


async def keep_capped(log_path: str, max_mb: Callable[[], int], running: Callable[[], bool],
                      reserve_mb: Callable[[], int] = lambda: 0) -> None:
    """Every CHECK_EVERY_S while `running()`: cap the log at `max_mb()` MiB and make its `reserve_mb()` MiB
    reserve again after the truncate (both read each time: a config reload applies), in a thread (a copy of up
    to half the cap never holds the event loop)."""
    while running():
        await asyncio.sleep(CHECK_EVERY_S)
        limit = max_mb()
        if limit <= 0 or not running():
            continue
        try:
            done = await asyncio.to_thread(cap, log_path, limit << 20, reserve_mb() << 20)
        except Exception as exc:  # noqa: BLE001 - a failed cap must not end the run's watch
            log.warning("cannot cap the run's log %s: %s: %s", log_path, type(exc).__name__, exc)
            continue
        if done is None:
            continue
        if done.error:
            log.warning("the run's log %s passed %d MiB (%d bytes): emptied, but %s", log_path, limit, done.size,
                        done.error)
        else:
            log.info("the run's log %s passed %d MiB (%d bytes): its last %d bytes kept in %s, the log emptied",
                     log_path, limit, done.size, done.kept, kept_path(log_path))


async def look_after(log_path: str, agent: Callable[[], AgentConfig], running: Callable[[], bool]) -> None:
    """The current run's log while `running()`: capped at `run_log_max_mb` (keep_capped) and with its
    `run_log_reserve_mb` disk reserve, made at once and topped up (logreserve.keep_reserved): a disk that fills
    during the load must not kill it. `agent()` is read at each use: a config reload applies."""
    await asyncio.gather(
        keep_capped(log_path, lambda: agent().run_log_max_mb, running, lambda: agent().run_log_reserve_mb),
        logreserve.keep_reserved(log_path, lambda: agent().run_log_reserve_mb, running))
