"""Reading /proc: who belongs to a vLLM run, and is a recorded pid still the same process.

vLLM's EngineCore and workers can outlive the API server (a SIGKILL of the leader leaves them holding GPU
memory), so "is the run gone" must be answered from the whole process table, not from the leader's exit.
A process belongs to a run when it is in the run's process group, descends from a run process, or carries
the run's token in its environment (it escaped the group with setsid but inherited the environment).
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from lynxtop.contract.files import close_fds

log = logging.getLogger(__name__)

RUN_TOKEN_ENV = "LYNXTOP_RUN_TOKEN"
SHM_SEGMENT = re.compile(r"/dev/shm/psm_[0-9A-Za-z_]+")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    comm: str
    state: str
    ppid: int
    pgid: int
    start_ticks: int  # clock ticks after boot: with the pid, identifies one process for its whole life


def _read_stat(pid: int) -> bytes | None:
    """/proc/<pid>/stat in one read (under 1 KiB), without Python's buffered file: a scan reads hundreds."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


def stat(pid: int) -> ProcStat | None:
    """Parsed /proc/<pid>/stat, or None when the process is gone or unreadable."""
    data = _read_stat(pid)
    return stat_of(pid, data) if data else None


def stat_of(pid: int, data: bytes) -> ProcStat | None:
    """`stat` of what /proc/<pid>/stat held (None: unparseable).

    Parsed as bytes, split only up to start time (field 22): a full look parses every process of the node, and
    decoding and splitting all ~52 fields was a third of it."""
    # comm may hold spaces and parentheses: it ends at the last ')'
    lpar, rpar = data.find(b"("), data.rfind(b")")
    if lpar < 0 or rpar < 0:
        return None
    rest = data[rpar + 2:].split(None, 20)
    try:
        return ProcStat(pid=pid, comm=data[lpar + 1:rpar].decode("utf-8", "replace"),
                        state=rest[0].decode("utf-8", "replace"), ppid=int(rest[1]), pgid=int(rest[2]),
                        start_ticks=int(rest[19]))
    except (IndexError, ValueError):
        return None


_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def age_s(start_ticks: int) -> float | None:
    """Seconds since a process started (`start_ticks`: /proc's start time, clock ticks after boot), on the boot
    clock, which no wall-clock step moves; None for an unknown start (0)."""
    if start_ticks <= 0:
        return None
    return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / _CLK_TCK)


@dataclass(frozen=True)
class ProcUsage:
    start_ticks: int
    state: str
    cpu_s: float  # user + system, as psutil's cpu_times() gives them
    rss_bytes: int  # psutil's memory_info().rss reads statm: the same counters, a few pages apart at most


def usage(pid: int) -> ProcUsage | None:
    """Identity, state, CPU time and RSS of a process from one read of /proc/<pid>/stat (None: gone).

    The vLLM tree is read every tick; psutil needs four reads a process for the same (is_running, status,
    cpu_times, memory_info)."""
    raw = _read_stat(pid)
    return None if not raw else usage_of(raw)


def usage_of(raw: bytes) -> ProcUsage | None:
    """`usage` of what /proc/<pid>/stat held (None: unparseable)."""
    f = usage_fields(raw)
    if f is None:
        return None
    try:
        return ProcUsage(start_ticks=f[0], state=f[1].decode(), cpu_s=f[2], rss_bytes=f[3])
    except ValueError:
        return None


def usage_fields(raw: bytes) -> tuple[int, bytes, float, int] | None:
    """`usage_of` as a tuple (start ticks, state as bytes, CPU seconds, RSS bytes): the host's tick reads its
    tree with it, without building an object a process."""
    rest = raw[raw.rfind(b")") + 2:].split(None, 22)  # up to rss (field 24): the ~30 after it are not used
    try:
        return _usage_in(rest)
    except (IndexError, ValueError):
        return None


def _usage_in(rest: list[bytes]) -> tuple[int, bytes, float, int]:
    """(start ticks, state, CPU seconds, RSS bytes) of the stat fields after comm; raises on a short or odd line."""
    return int(rest[19]), rest[0], (int(rest[11]) + int(rest[12])) / _CLK_TCK, int(rest[21]) * _PAGE


def stat_usage_of(pid: int, data: bytes) -> tuple[ProcStat | None, ProcUsage | None]:
    """`stat_of` and `usage_of` of one read, split once (a tree walk confirms each member and takes its usage)."""
    lpar, rpar = data.find(b"("), data.rfind(b")")
    if lpar < 0 or rpar < 0:
        return None, None
    rest = data[rpar + 2:].split(None, 22)
    try:
        s = ProcStat(pid=pid, comm=data[lpar + 1:rpar].decode("utf-8", "replace"),
                     state=rest[0].decode("utf-8", "replace"), ppid=int(rest[1]), pgid=int(rest[2]),
                     start_ticks=int(rest[19]))
    except (IndexError, ValueError):
        return None, None
    try:
        start, state, cpu_s, rss_bytes = _usage_in(rest)
        u = ProcUsage(start_ticks=start, state=state.decode(), cpu_s=cpu_s, rss_bytes=rss_bytes)
    except (IndexError, ValueError):
        u = None
    return s, u


class StatFiles:
    """/proc/<pid>/stat kept open for processes read every tick: one pread instead of an open, a read and a
    close (a third of the cost). A descriptor stays bound to the process it was opened on: once that process
    is reaped the read fails (ESRCH), even when its pid was reused, and the descriptor is dropped.

    Thread-safe (the node's process table and the host sampler share one): a descriptor is never closed under a
    read, whose number could otherwise name another file by then."""

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()
        # the node's table lives as long as its node, which has no close for it: its fds go with it
        weakref.finalize(self, close_fds, self._fds)

    def read(self, pid: int, reopen: bool = False) -> bytes | None:
        """What /proc/<pid>/stat holds now (None: gone). A kept descriptor that fails is dropped; with `reopen`
        the path is opened afresh, as `stat` would (the pid may name a new process), else None says the
        process it was kept for is gone."""
        with self._lock:
            return self._read(pid, reopen)

    def read_many(self, pids: Iterable[int]) -> list[bytes | None]:
        """`read` of each of `pids` in turn (no reopen), under one lock: the host's tick reads its whole tree."""
        with self._lock:
            return [self._read(pid, False) for pid in pids]

    def _read(self, pid: int, reopen: bool) -> bytes | None:
        fd = self._fds.get(pid)
        if fd is not None:
            raw = _pread(fd)
            if raw:
                return raw
            self._drop(pid)
            if not reopen:
                return None
        try:
            fd = self._fds[pid] = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        raw = _pread(fd)
        if not raw:
            self._drop(pid)
            return None
        return raw

    def usage(self, pid: int) -> ProcUsage | None:
        raw = self.read(pid)
        return None if raw is None else usage_of(raw)

    def keep_only(self, pids: Iterable[int]) -> None:
        keep = pids if isinstance(pids, (set, frozenset, dict)) else set(pids)
        with self._lock:
            for pid in [p for p in self._fds if p not in keep]:
                self._drop(pid)

    def drop(self, pids: Iterable[int]) -> None:
        with self._lock:
            for pid in pids:
                self._drop(pid)

    def close(self) -> None:
        self.keep_only(())

    def __len__(self) -> int:
        return len(self._fds)

    def _drop(self, pid: int) -> None:
        fd = self._fds.pop(pid, None)
        if fd is not None:
            os.close(fd)


def _pread(fd: int) -> bytes:
    try:
        return os.pread(fd, 4096, 0)
    except OSError:
        return b""


def alive(pid: int) -> bool:
    """True for a running process; a zombie holds no memory and counts as gone."""
    st = stat(pid)
    return st is not None and st.state not in ("Z", "X")


def seen_alive(pid: int, ticks: int) -> bool | None:
    """Whether the process seen as `pid` with start time `ticks` still lives: True (its stat says so), False (gone,
    a zombie, or the pid now another process's), None (it exists but its stat cannot be read: not proven gone)."""
    st = stat(pid)
    if st is not None:
        return st.start_ticks == ticks and st.state not in ("Z", "X")
    try:
        os.kill(pid, 0)  # no descriptor needed: ESRCH says no process has that pid
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return None


def cmdline(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return [a.decode("utf-8", "surrogateescape") for a in raw.split(b"\0")[:-1]] if raw else []


def environ_has(pid: int, key: str, value: str) -> bool:
    return environ_value(pid, key) == value


def environ_value(pid: int, key: str) -> str | None:
    """The value of `key` in the environment `pid` was started with (None: unset, or the process is gone)."""
    return environ_entry(environ_raw(pid), key)


def environ_raw(pid: int) -> bytes | None:
    """/proc/<pid>/environ as read (None: gone or not readable). Empty for a kernel thread, and for the instant
    of an exec: a process started through wrappers (a pyenv shim, `env`) reads empty a few times in its first
    moments, which says nothing about its environment (`settled_environ_value`)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return None


def environ_blank(raw: bytes | None) -> bool:
    """Whether an environment as `environ_raw` read it names no variable: empty (a kernel thread, an exec under
    way) or all NULs, what setproctitle leaves once it moved the environment away to make room for a long title
    (vLLM's EngineCore and workers: measured with setproctitle 1.3.8, /proc/PID/environ keeps its length)."""
    return raw is not None and not raw.strip(b"\0")


def is_kernel_thread(s: ProcStat) -> bool:
    """kthreadd (pid 2) and its children: their environment is empty for good."""
    return s.pid == 2 or s.ppid == 2


def exec_under_way(raw: bytes | None, s: ProcStat) -> bool:
    """Whether an environ read says nothing yet: empty, from a user process (an exec under way)."""
    return raw == b"" and not is_kernel_thread(s)


SETTLE_TRIES, SETTLE_S = 3, 0.005  # an empty environ read of a user process is read again this often, this apart


def settle_environs(envs: dict[int, bytes | None], stats: dict[int, ProcStat]) -> bool:
    """Read again, together, each environ in `envs` read mid-exec (at most SETTLE_TRIES x SETTLE_S in all,
    however many); whether there was any."""
    unsettled = [pid for pid, raw in envs.items() if exec_under_way(raw, stats[pid])]
    had = bool(unsettled)
    for _ in range(SETTLE_TRIES):
        if not unsettled:
            break
        time.sleep(SETTLE_S)
        for pid in unsettled:
            envs[pid] = environ_raw(pid)
        unsettled = [pid for pid in unsettled if envs[pid] == b""]
    return had


def settled_environ_value(s: ProcStat, key: str) -> str | None:
    """`environ_value`, with a read mid-exec looked at again (`settle_environs`)."""
    envs = {s.pid: environ_raw(s.pid)}
    settle_environs(envs, {s.pid: s})
    return environ_entry(envs[s.pid], key)


def environ_entry(raw: bytes | None, key: str) -> str | None:
    """`key`'s value in an environment as `environ_raw` read it."""
    if not raw:
        return None
    prefix = f"{key}=".encode()
    for entry in raw.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix):].decode("utf-8", "surrogateescape")
    return None


def uid(pid: int) -> int | None:
    """The real uid that owns `pid` (the owner of /proc/<pid>), or None when it is gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def shm_segments(pid: int) -> set[str]:
    """The `/dev/shm/psm_*` files `pid` has mapped (Python's multiprocessing.shared_memory, as vLLM uses).

    Read from /proc/<pid>/maps while the process lives: after a SIGKILL nobody unlinks them, and their random
    names cannot be told apart from another run's by looking at /dev/shm.
    """
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            raw = f.read()
    except OSError:
        return set()
    found = set()
    for line in raw.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5].decode("utf-8", "surrogateescape")
        if SHM_SEGMENT.fullmatch(path):  # a "(deleted)" suffix does not match: already unlinked
            found.add(path)
    return found


def title(pid: int) -> str:
    """What `ps` shows: the cmdline (setproctitle rewrites it, e.g. 'VLLM::EngineCore'), else comm."""
    args = cmdline(pid)
    if args:
        return " ".join(args).strip()  # setproctitle pads the argv area with spaces
    st = stat(pid)
    return st.comm if st else ""


class ProcUnreadable(OSError):
    """/proc cannot be listed (the agent out of file descriptors, EMFILE/ENFILE; /proc not mounted): which
    processes run is unknown, never "none". A caller does nothing destructive on it (no record removed, no run
    called gone, no directory swept) and tries again later. str() says why."""


_unreadable_told = False  # the listing's failure was logged (once per episode: a node look runs every 5 s)


def all_pids() -> list[int]:
    """Every pid /proc lists; ProcUnreadable when it cannot be listed (an empty answer would say "nothing runs"
    of a node whose processes are merely unreadable: a stop once called a live server stopped that way)."""
    global _unreadable_told
    try:
        names = os.listdir("/proc")
    except OSError as exc:
        why = ("out of file descriptors" if exc.errno in (errno.EMFILE, errno.ENFILE) else exc.strerror or str(exc))
        if not _unreadable_told:
            _unreadable_told = True
            log.warning("cannot list /proc (%s): the node's processes are unknown until it can; nothing is "
                        "stopped, swept or called gone meanwhile", why)
        raise ProcUnreadable(exc.errno, f"cannot list /proc: {why}") from None
    if _unreadable_told:
        _unreadable_told = False
        log.info("/proc can be listed again")
    return [int(name) for name in names if name.isdigit()]


def run_processes(token: str | None, pgid: int | None, roots: Iterable[int] = (), since_ticks: int = 0,
                  known: Mapping[int, int] | None = None, into: dict[int, int] | None = None) -> list[int]:
    """Live pids of one run: same process group, descendants of `roots` or of group members, the token, or known.

    `since_ticks`: when the run's leader started; only processes started since then can carry its token, so only
    their environments are read (a node's hundreds of older processes cost a stat each, not two reads).
    `known`: pid -> start ticks of processes seen in the run before (`ServerProcess.known`): a process that
    retitled itself no longer shows the token, and once its leader is gone neither does its group. `into`: filled
    with each member's pid -> start ticks, for the caller to know them next time.

    ProcUnreadable when /proc cannot be listed: the members are unknown, not none."""
    stats = {s.pid: s for s in (stat(p) for p in all_pids()) if s is not None}  # zombies too: `members_in`
    envs: dict[int, bytes | None] = {}  # the environments read, by pid

    def carries_token(s: ProcStat) -> bool:
        if s.pid not in envs:
            envs[s.pid] = environ_raw(s.pid)
        return token is not None and environ_entry(envs[s.pid], RUN_TOKEN_ENV) == token

    found = members_in(stats, token, pgid, roots, since_ticks, carries_token, known)
    if settle_environs(envs, stats):  # reads mid-exec, read again together: the look once more if any
        found = members_in(stats, token, pgid, roots, since_ticks, carries_token, known)
    if into is not None:
        into.update((pid, stats[pid].start_ticks) for pid in found)
    return found


def members_in(stats: dict[int, ProcStat], token: str | None, pgid: int | None, roots: Iterable[int],
               since_ticks: int, carries_token: Callable[[ProcStat], bool],
               known: Mapping[int, int] | None = None) -> list[int]:
    """`run_processes` over a given table of processes; `carries_token(stat)` reads the environment.

    Only live processes are members; a zombie in `stats` counts for one thing: the run's leader not yet reaped
    holds its pid, so its group is the run's (`_group_is_the_runs`)."""
    me = os.getpid()
    known = known or {}
    live = {pid: s for pid, s in stats.items() if s.state not in ("Z", "X")}

    def is_known(s: ProcStat) -> bool:  # pid and start time: a reused pid is someone else
        return known.get(s.pid) == s.start_ticks

    if pgid is not None and not _group_is_the_runs(stats, live, token, pgid, since_ticks,
                                                   lambda s: is_known(s) or carries_token(s)):
        pgid = None
    members = {pid for pid in roots if pid in live}
    for s in live.values():
        if s.pid == me:
            continue
        if (pgid is not None and s.pgid == pgid or is_known(s)
                or token and s.start_ticks >= since_ticks and carries_token(s)):
            members.add(s.pid)
    # close over descendants: a child that called setsid is still a child
    children: dict[int, list[int]] = {}
    for s in live.values():
        children.setdefault(s.ppid, []).append(s.pid)
    todo = list(members)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in members and child != me:
                members.add(child)
                todo.append(child)
    members.discard(me)
    return sorted(members)


def _group_is_the_runs(stats: dict[int, ProcStat], live: dict[int, ProcStat], token: str | None, pgid: int,
                       leader_ticks: int, carries_token: Callable[[ProcStat], bool]) -> bool:
    """Whether process group `pgid` is still the run's: its leader (pid == pgid) there with the recorded start, alive
    or a zombie not yet reaped (it holds its pid: no other process can have that number, so no other group can
    either; the agent looks in that moment, `ServerProcess._on_exit_now`), or gone while a live process of the
    group carries the run's token or was seen in the run (`carries_token` says). The kernel hands out no number a
    live group still uses, but once the run's group is empty a stranger may get it (a new session leader):
    signalling that group would kill someone else's processes."""
    leader = stats.get(pgid)
    if leader is not None:
        return leader_ticks <= 0 or leader.start_ticks == leader_ticks
    if token is None:
        return True  # nothing to tell the run by: the group is all there is
    return any(s.pgid == pgid and carries_token(s) for s in live.values())


def runs_started_in(cwd: str, exclude: Iterable[int] = ()) -> list[int]:
    """Live processes of any lynxtop run started in `cwd` (the run-log directory: every run starts there).

    For a server nobody can adopt (state file lost or unreadable): its token is unknown, but its environment
    still carries one and its working directory names this agent's runs. ProcUnreadable: unknown, not none.
    """
    skip = {os.getpid(), *exclude}
    found = []
    for pid in all_pids():
        if pid in skip or not alive(pid):
            continue
        try:
            if os.readlink(f"/proc/{pid}/cwd") != cwd:
                continue
        except OSError:
            continue
        st = stat(pid)  # in the run-log directory: a user process, whose empty read is an exec under way
        token = settled_environ_value(st, RUN_TOKEN_ENV) if st is not None else None
        if token is not None:
            found.append(pid)
    return sorted(found)


# ---------------------------------------------------------------------------------------------- listening sockets

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


def _addr(hexaddr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """/proc/net/tcp{,6}'s local address: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hexaddr)
    return ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)))


def listeners(port: int) -> dict[int, str] | None:
    """Listening TCP sockets on `port` (any address) of this network namespace: socket inode -> "addr:port".

    None when neither /proc/net/tcp nor /proc/net/tcp6 can be read (nothing can be said either way)."""
    found: dict[int, str] = {}
    read_any = False
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/net/{name}", encoding="ascii") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        read_any = True
        for line in lines:
            parts = line.split()
            if len(parts) < 10 or parts[3] != _LISTEN:
                continue
            addr, _, hexport = parts[1].partition(":")
            try:
                if int(hexport, 16) != port:
                    continue
                ip = _addr(addr)
                found[int(parts[9])] = f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
            except ValueError:
                continue
    return found if read_any else None


def conflicts(host: str, bound: str) -> bool:
    """Whether a listener on `bound` ("addr:port") keeps a server from binding `host` on the same port.

    Only two different specific addresses leave each other alone; a wildcard, or a host name, is taken to
    collide with everything (a name may resolve to any address of the node)."""
    mine = host.strip("[]")
    other = bound.rpartition(":")[0].strip("[]")
    try:
        a, b = ipaddress.ip_address(mine or "0.0.0.0"), ipaddress.ip_address(other)
    except ValueError:
        return True
    if a.is_unspecified or b.is_unspecified:
        return True
    if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped:
        a = a.ipv4_mapped
    if isinstance(b, ipaddress.IPv6Address) and b.ipv4_mapped:
        b = b.ipv4_mapped
    return a == b


def socket_owners(inodes: Iterable[int], pids: Iterable[int] | None = None) -> list[int]:
    """The processes (among `pids`, or every one) holding a descriptor on one of the socket `inodes`.

    /proc unlistable: none named, which callers say as "held by a process this agent cannot see" (`PortHolder`):
    the answer only names who holds a port, it never decides that a run is gone."""
    wanted = {f"socket:[{i}]" for i in inodes}
    if not wanted:
        return []
    owners = []
    try:
        candidates = all_pids() if pids is None else pids
    except ProcUnreadable:
        return []
    for pid in candidates:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # gone, or another user's (the agent runs as root on a node: it sees them all)
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                    owners.append(pid)
                    break
            except OSError:
                continue
    return sorted(owners)


@dataclass(frozen=True)
class PortHolder:
    """A listening socket in the way of a server's host:port, and who holds it (pids empty: not visible)."""

    address: str
    pids: tuple[int, ...]

    def describe(self) -> str:
        if not self.pids:
            return f"{self.address} (held by a process this agent cannot see)"
        return f"{self.address} held by " + ", ".join(f"pid {p} ({title(p)[:80] or '?'})" for p in self.pids)


def port_holders(host: str, port: int) -> list[PortHolder]:
    """Who listens where a server on `host`:`port` would have to bind (empty: the port is free)."""
    if not port:
        return []  # port 0: the server picks one itself
    socks = listeners(port) or {}
    out = []
    for inode, bound in sorted(socks.items()):
        if conflicts(host, bound):
            out.append(PortHolder(bound, tuple(socket_owners([inode]))))
    return out


def listener_is_ours(port: int, members: Iterable[int]) -> tuple[bool | None, list[PortHolder]]:
    """Whether a process of the run (`members`) holds a socket listening on `port`.

    (True, []): yes. (False, holders): no, and who holds the listeners there. (None, []): nothing can be
    said (/proc/net unreadable), so the caller goes by the answer alone."""
    socks = listeners(port)
    if socks is None:
        return None, []
    if socket_owners(socks, members):
        return True, []
    return False, [PortHolder(bound, tuple(socket_owners([inode]))) for inode, bound in sorted(socks.items())]
