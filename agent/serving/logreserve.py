"""Disk blocks held in reserve past the end of the current run's log: a load survives a disk that fills under it.

vLLM writes to the run's log itself (launcher.spawn: stdout and stderr, O_APPEND), and its progress bars (tqdm:
the checkpoint shards) re-raise ENOSPC, so a disk that fills *during* a 20-minute load kills it with exit 1
(diskspace.py's preflight only looks before the start). So the log gets `[agent] run_log_reserve_mb` of blocks
allocated past its end without changing its size (`fallocate(FALLOC_FL_KEEP_SIZE)`, Linux): appends land in
them even when the file system is full. Python's os.posix_fallocate would change the size (the readers would
see zeros), hence libc's `fallocate` through ctypes.

The reserve is made as soon as the run is watched and topped up every CHECK_EVERY_S (an fstat: `st_blocks * 512 -
st_size` is what is left past the end) once less than half is left, and right after logcap's truncate, which
frees it. A top-up is only tried where the file system has the room (a failed fallocate may keep part of what it
took: the reserve never takes the last blocks from the history database); on a full disk it waits for the next
check, said once per episode. A file system without fallocate (EOPNOTSUPP) runs without a reserve, said once.
When the run ends the reserve is given back (`release`: ftruncate to the log's own size frees the blocks past it
on ext4, XFS and tmpfs; a hole punched past the end is a no-op on ext4).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import logging
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

CHECK_EVERY_S = 5.0  # how often what is left is looked at (an fstat); a top-up only below half
FALLOC_FL_KEEP_SIZE = 0x01
_UNSUPPORTED = (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)  # EINVAL: a file system that refuses the mode
_OPEN = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # never O_CREAT: a missing log has no reserve
_libc_fallocate: Callable[..., int] | None = None


def _fallocate_fn() -> Callable[..., int]:
    global _libc_fallocate
    if _libc_fallocate is None:
        if not sys.platform.startswith("linux"):
            raise OSError(errno.ENOSYS, "fallocate is Linux only")
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).fallocate
        fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]  # off_t: 64-bit
        fn.restype = ctypes.c_int
        _libc_fallocate = fn
    return _libc_fallocate


def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    """libc's fallocate(2); OSError with its errno."""
    if _fallocate_fn()(fd, mode, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def left(st: os.stat_result) -> int:
    """Bytes allocated past the end of the file (its last block's slack included)."""
    return max(st.st_blocks * 512 - st.st_size, 0)


def unsupported(exc: OSError) -> bool:
    """The file system cannot hold a reserve at all (retrying is pointless)."""
    return exc.errno in _UNSUPPORTED


def reserve_fd(fd: int, nbytes: int) -> int:
    """Make `nbytes` past the current end of the open file `fd` allocated, if less than half of that is left;
    the bytes newly reserved (0: enough was left). OSError: ENOSPC (also when statvfs says there is no room for
    it), or `unsupported`."""
    st = os.fstat(fd)
    have = left(st)
    if nbytes <= 0 or not stat.S_ISREG(st.st_mode) or have >= nbytes // 2:
        return 0
    need = nbytes - have
    free = _free_of_fd(fd)
    if free is not None and free < need:
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({free} bytes free, {need} needed)")
    fallocate(fd, FALLOC_FL_KEEP_SIZE, st.st_size, nbytes)
    return left(os.fstat(fd)) - have


def _free_of_fd(fd: int) -> int | None:
    try:
        st = os.fstatvfs(fd)
    except OSError:
        return None
    return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize


def reserve(path: str | Path, nbytes: int) -> int:
    """`reserve_fd` on the log at `path` (0 when it is gone: a log that could not be created has none)."""
    try:
        fd = os.open(path, _OPEN)
    except FileNotFoundError:
        return 0
    try:
        return reserve_fd(fd, nbytes)
    finally:
        os.close(fd)


def release(path: str | Path) -> int:
    """Give back the blocks past the end of the ended run's log: the bytes freed (0: none, or no log). Its
    writers are gone (a live one appending between the fstat and the ftruncate would lose that write)."""
    try:
        fd = os.open(path, _OPEN)
    except OSError:
        return 0
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or left(st) < st.st_blksize:  # no more than its last block's slack
            return 0
        os.ftruncate(fd, st.st_size)  # the same size: the blocks past it are freed
        os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))  # the log's age (retention keeps the newest) unchanged
        return max(st.st_blocks - os.fstat(fd).st_blocks, 0) * 512
    except OSError as exc:
        log.warning("cannot give back the disk reserve of the run's log %s: %s", path, exc.strerror or exc)
        return 0
    finally:
        os.close(fd)


def release_quietly(path: str | Path) -> None:
    """`release` for a run's end: the cleanup after it never fails for it."""
    freed = release(path)
    if freed:
        log.info("gave back the %d bytes held in reserve past the end of %s (the run ended)", freed, path)


class Keeper:
    """The reserve of one run's log, with its episodes: a failed top-up is said once until one succeeds."""

    def __init__(self, log_path: str):
        self.log_path = log_path
        self.failing: str | None = None  # why the last top-up failed (an episode in progress)
        self.unsupported = False

    def check(self, nbytes: int) -> int:
        """Top the reserve up to `nbytes` if less than half is left; the bytes reserved. Blocking (a thread)."""
        if self.unsupported or nbytes <= 0:
            return 0
        try:
            made = reserve(self.log_path, nbytes)
        except OSError as exc:
            self._failed(exc, nbytes)
            return 0
        if self.failing is not None:
            log.info("the run's log %s has its disk reserve again (%d MiB)", self.log_path, nbytes >> 20)
            self.failing = None
        return made

    def _failed(self, exc: OSError, nbytes: int) -> None:
        why = exc.strerror or str(exc)
        if unsupported(exc):
            self.unsupported = True
            log.warning("cannot hold a disk reserve for the run's log %s (%s: its file system has no fallocate): "
                        "a disk that fills during the load may kill it", self.log_path, why)
        elif self.failing is None:
            log.warning("cannot top up the %d MiB disk reserve of the run's log %s: %s; retried every %g s (vLLM "
                        "dies when its progress bars find the disk full)", nbytes >> 20, self.log_path, why,
                        CHECK_EVERY_S)
        self.failing = why


async def keep_reserved(log_path: str, reserve_mb: Callable[[], int], running: Callable[[], bool]) -> None:
    """At once, then every CHECK_EVERY_S while `running()`: keep `reserve_mb()` MiB past the log's end (read each
    time: a config reload applies; 0: no top-ups), in a thread (fallocate and statvfs may block)."""
    keeper = Keeper(log_path)
    while running() and not keeper.unsupported:
        nbytes = reserve_mb() << 20
        if nbytes > 0:
            try:
                await asyncio.to_thread(keeper.check, nbytes)
            except Exception as exc:  # noqa: BLE001 - a failed check must not end the run's watch
                log.warning("cannot check the disk reserve of the run's log %s: %s: %s", log_path,
                            type(exc).__name__, exc)
        await asyncio.sleep(CHECK_EVERY_S)
