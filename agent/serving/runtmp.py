"""A run's own temporary directory, `<database dir>/run-tmp/<8 hex of the run token>`, handed to vLLM as TMPDIR.

Why not /tmp: the systemd unit has PrivateTmp=yes, so the agent's /tmp and /var/tmp are directories of the unit's own
that systemd removes when the unit stops, and every start of the unit gets new ones. vLLM is the agent's child and
lives in that namespace, and with KillMode=process it outlives the unit's stop (live restore): what it keeps in /tmp
would be deleted under a serving model, and the next agent, in a new private /tmp, could not see it. vLLM 0.32 keeps
there, all through `tempfile.gettempdir()` (so TMPDIR moves them): its ZMQ IPC sockets (VLLM_RPC_BASE_PATH's
default), the `vllm_dist_*` rendezvous file, torch's `torchinductor_<user>` directory, the Prometheus directory of
several API servers, and the session of a Ray it starts itself (Ray reads TMPDIR too). The state directory outlives
the unit, and one agent holds it (agent.lock), so no other agent sweeps this one's directories.

The directory is the agent's, 0700, made only where nothing is (a symlink or file planted there is refused, never
followed); its path is kept in serving.json, so whichever agent sees the run's last process gone (the one that
started it, or one that adopted it) removes it, and only a real directory of the agent's user of the shape given here.
A profile that sets TMPDIR keeps its own, and the agent makes and removes nothing for it.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import stat
from collections.abc import Iterable
from pathlib import Path

from lynxtop.agent.serving import procs

log = logging.getLogger(__name__)

ROOT_NAME = "run-tmp"
NAME = re.compile(r"[0-9a-f]{8}")  # the run token's first 8 hex digits, as in the run log's name
# Unix socket paths hold 107 bytes. The longest known to be made under TMPDIR: a Ray that vLLM starts itself binds
# <TMPDIR>/ray/session_<date>_<µs>_<pid>/sockets/plasma_store, 68 bytes past TMPDIR (Ray 2.60 refuses longer);
# vLLM's ZMQ sockets need 37 (<TMPDIR>/<uuid4>). /var/lib/lynxtop/run-tmp/<8> is 33.
MAX_LEN = 107 - 68


def root_for(database: Path) -> Path:
    return database.parent / ROOT_NAME


class _NotOurs(OSError):
    """A directory there, but not one the agent may hand a run: the message says why."""


def _open_own_dir(path: str | Path, dir_fd: int | None = None) -> int:
    """An fd on `path` if it is a directory of ours that no one else may write to; OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    st = os.fstat(fd)
    why = None
    if st.st_uid != os.geteuid():
        why = f"owned by uid {st.st_uid}, not the agent's uid {os.geteuid()}"
    elif st.st_mode & 0o022:
        why = f"writable by others (mode {stat.S_IMODE(st.st_mode):04o})"
    if why:
        os.close(fd)
        raise _NotOurs(why)
    return fd


def _too_long(path: Path) -> str | None:
    n = len(os.fsencode(path))
    if n <= MAX_LEN:
        return None
    return (f"{path} would be {n} bytes, more than the {MAX_LEN} that leave room for unix-socket paths under it (a "
            "shorter [agent] database directory makes it fit)")


def _own_dir(path: Path) -> int:
    """An fd of `path`, made 0700 where nothing is; what is there is used only if `_open_own_dir` accepts it."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass  # checked below, through an fd that did not follow a link
    return _open_own_dir(path)


def make(root: Path, name: str) -> tuple[str | None, str | None]:
    """Create `root`/`name`, 0700: (its path, None), or (None, why not) and the run keeps the agent's TMPDIR."""
    path = root / name
    if why := _too_long(path):
        return None, why
    try:
        rfd = _own_dir(root)
    except OSError as exc:
        return None, _refusal(root, exc)
    try:
        os.mkdir(name, 0o700, dir_fd=rfd)  # never through anything already there: a symlink stays unfollowed
        fd = _open_own_dir(name, dir_fd=rfd)
        os.fchmod(fd, 0o700)  # whatever the umask
        os.close(fd)
    except OSError as exc:
        return None, _refusal(path, exc)
    finally:
        os.close(rfd)
    return str(path), None


def make_kept(path: Path) -> tuple[str | None, str | None]:
    """`path` as a directory of the agent's user that others cannot write to, made 0700 where nothing is and kept
    across runs (Ray's `<database dir>/rt`): (its path, None), or (None, why not). What is already there is used
    only if `_open_own_dir` accepts it (never through a symlink); the agent never removes it."""
    if why := _too_long(path):
        return None, why
    try:
        fd = _own_dir(path)
    except OSError as exc:
        return None, _refusal(path, exc)
    try:
        os.fchmod(fd, 0o700)  # whatever the umask, or a 0755 of an earlier hand
    except OSError as exc:
        return None, _refusal(path, exc)
    finally:
        os.close(fd)
    return str(path), None


def _refusal(path: Path, exc: OSError) -> str:
    if isinstance(exc, _NotOurs):
        return f"{path} is {exc}: not used"
    if isinstance(exc, FileExistsError):
        return f"{path} already exists (not made by the agent for this run): not used"
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # O_NOFOLLOW met a symlink; or a file is there
        return f"{path} is {'a symlink: not followed' if os.path.islink(path) else 'not a directory: not used'}"
    return f"cannot use {path}: {exc.strerror or exc}"


def remove(path: str) -> str | None:
    """Remove a run's directory and everything in it, never through a symlink (in its place, in it, or as its
    `run-tmp`); None, or why it was left."""
    if not isinstance(path, str):  # serving.json is read back, not trusted
        return f"{path!r} (not a run's temporary directory: left alone)"
    p = Path(path)
    if not (p.is_absolute() and os.path.normpath(path) == path and p.parent.name == ROOT_NAME
            and NAME.fullmatch(p.name)):
        return f"{path} (not a run's temporary directory: left alone)"
    if not shutil.rmtree.avoids_symlink_attacks:  # the fd-based rmtree: it never follows a link inside
        return f"{path} (this platform's rmtree could follow symlinks)"
    try:
        rfd = _open_own_dir(p.parent)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path} (left: {_refusal(p.parent, exc)})"
    try:
        st = os.lstat(p.name, dir_fd=rfd)
        if stat.S_ISLNK(st.st_mode):
            return f"{path} (a symlink, not the directory the agent made: not followed)"
        if not stat.S_ISDIR(st.st_mode):
            return f"{path} (not a directory)"
        if st.st_uid != os.geteuid():
            return f"{path} (owned by uid {st.st_uid}, not the agent's uid {os.geteuid()})"
        shutil.rmtree(p.name, dir_fd=rfd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path} ({exc.strerror or exc})"
    finally:
        os.close(rfd)
    log.info("removed the run's temporary directory %s", path)
    return None


def _users(root: str, log_dir: str, skip: set[int]) -> tuple[set[str], list[int]]:
    """(names under `root` a live process has as TMPDIR or cwd, pids of processes of a run whose TMPDIR is unknown).

    The latter are processes started in the run-log directory (every run is) whose environment names nothing: vLLM's
    retitled EngineCore and workers (setproctitle overwrites /proc/PID/environ with NULs). `skip`: the kept run's
    pids. Other users' processes cannot be read, nor enter a 0700 directory."""
    names: set[str] = set()
    unknown: list[int] = []
    prefix = root + os.sep
    for pid in procs.all_pids():
        st = procs.stat(pid)
        if pid == os.getpid() or pid in skip or st is None or st.state in ("Z", "X") or procs.is_kernel_thread(st):
            continue
        envs = {pid: procs.environ_raw(pid)}
        procs.settle_environs(envs, {pid: st})
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            cwd = ""
        for where in (procs.environ_entry(envs[pid], "TMPDIR"), cwd):
            if where and (where + os.sep).startswith(prefix):
                names.add(where[len(prefix):].split(os.sep)[0])
        if procs.environ_blank(envs[pid]) and cwd == log_dir:  # all NULs once retitled, not empty
            unknown.append(pid)
    return names, sorted(unknown)


def stale(root: Path, keep: Iterable[str | None]) -> list[str]:
    """The entries of `root` but `keep`'s (paths): listed on the event loop, so a run started after is never one."""
    kept = {os.path.basename(k) for k in keep if isinstance(k, str)}  # serving.json's value: of any type
    try:
        return sorted(n for n in os.listdir(root) if n not in kept)
    except OSError:
        return []


def sweep(root: Path, names: list[str], log_dir: Path, skip: set[int]) -> tuple[list[str], list[str]]:
    """Remove the directories `names` of runs that are gone (a node crash; a stop that left a process), but those a
    live process is in, and none while a process of a run (not `skip`, the kept run's) could be in any; (removed,
    kept)."""
    try:
        used, unknown = _users(str(root), os.path.realpath(log_dir), skip)
    except procs.ProcUnreadable as exc:  # which processes live is unknown: any directory may still be in use
        log.warning("run-tmp: %d director(ies) of earlier runs kept: %s; removed at a later agent start",
                    len(names), exc)
        return [], [f"{root / n} (kept: {exc})" for n in names]
    if unknown:
        kept = [f"{root / n} (kept: processes of an earlier run live, pids {unknown})" for n in names]
        log.warning("run-tmp: %d director(ies) of earlier runs kept: processes of an earlier run live (pids %s), "
                    "whose TMPDIR cannot be read; removed at a later agent start once they are gone", len(names),
                    unknown)
        return [], kept
    removed: list[str] = []
    kept = []
    for n in names:
        path = str(root / n)
        if not NAME.fullmatch(n):
            kept.append(f"{path} (kept: not a name the agent gives)")
        elif n in used:
            kept.append(f"{path} (kept: the TMPDIR or working directory of a live process)")
        elif (why := remove(path)) is None:
            removed.append(path)
        else:
            kept.append(why)
    for why in kept:
        log.warning("run-tmp: %s", why)
    return removed, kept
