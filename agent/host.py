"""Host readings per tick through psutil: CPU, load, memory, swap, the database's disk, network, and the vLLM tree.

Rates (CPU %, network bytes/s, per-process CPU) come from deltas between two calls of this object, never
from psutil's module-level `cpu_percent` state, which any other caller in the process would disturb. The
first call has no previous reading, so its rates are None (NULL), not 0.

The vLLM tree is split by process title: vLLM names its processes with setproctitle (`VLLM::EngineCore`,
`VLLM::Worker_TP0`, ...); anything else in the tree (the `vllm serve` API server, its helpers) counts as API.
The tree is re-walked every `tree_refresh_s` (and at once when a known member dies) through the node's kept
process table (agent/serving/proctable.py), which reads only the processes it has not seen before; and sooner
whenever the node's look for the run's members has just listed /proc (every 5 s, in the same tick), so that
the two share one listing (on a node of ~1 000 processes a listing is ~1-2 ms) rather than fall out of step.
Each tick reads a member's /proc/<pid>/stat once, through a descriptor the table keeps open: on a walk, the
walk's own confirming read gives the member's CPU time and RSS.

At 10 Hz sampling the whole row is read about once a second and copied into the ticks between (`sample`):
every rate is then over about a second of jiffies instead of a tenth, and /proc is read a tenth as often.

Each group of readings (CPU, load, memory, disk, network, the vLLM tree) stands alone: one that fails (an
unreadable /proc file, `os.getloadavg` raising, a line that does not parse) leaves its own columns NULL, the others
and the tick's GPU rows are kept; its failure is logged when it starts and when it ends. Figures are what they can
be: CPU 0-100, memory and swap used never below 0 (a container's /proc/meminfo may give available > total).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from lynxtop.agent.gpu.refresh import MAX_AGE_S, Refresh
from lynxtop.agent.serving import procs
from lynxtop.agent.serving.proctable import ProcTable
from lynxtop.contract.columns import HOST_METRICS, names
from lynxtop.contract.files import read_all

HOST_COLUMNS = names(HOST_METRICS)
log = logging.getLogger("lynxtop.agent")
_READ_ERRORS = (OSError, ValueError, IndexError)  # a reading that fails or does not parse: its group is NULL
_GROUP_COLUMNS = {"cpu": ("cpu_pct", "cpu_per_core_pct"), "load": ("load1", "load5", "load15"),
                  "memory": ("mem_used_bytes", "mem_available_bytes", "mem_total_bytes", "swap_used_bytes",
                             "swap_total_bytes"),
                  "net": ("net_rx_bytes_per_s", "net_tx_bytes_per_s"),
                  "tree": tuple(c for c in HOST_COLUMNS if c.startswith("vllm_"))}
ROLES = ("api", "engine", "workers")
_DEAD = (b"Z", b"X")  # a process' state in /proc/<pid>/stat: zombie, dead


def role_of(title: str) -> str:
    """The vLLM role for a process title or name ('api', 'engine' or 'workers')."""
    if title.startswith("VLLM::EngineCor"):  # the kernel's comm keeps 15 characters: "VLLM::EngineCor"
        return "engine"
    if title.startswith("VLLM::Worker"):
        return "workers"
    return "api"


TITLE_WAIT_S = 120.0  # a tree member without a vLLM title is looked at again on each walk for this long


def _title(s: procs.ProcStat) -> str:
    """setproctitle rewrites argv; comm (15 chars) is the fallback where argv is unreadable or empty."""
    argv = procs.cmdline(s.pid)
    if argv and argv[0].startswith("VLLM::"):
        return argv[0]
    return s.comm


_MEMINFO_KEYS = (b"\nMemTotal:", b"\nMemAvailable:", b"\nSwapTotal:", b"\nSwapFree:")


def _meminfo() -> tuple[int, int, int, int] | None:
    """(mem total, mem available, swap total, swap free) in bytes from one read of /proc/meminfo.

    psutil's virtual_memory() and swap_memory() read it twice plus /proc/vmstat: ~0.3 ms a tick for nothing.
    The four lines are found, not every line split: a third of the cost.
    """
    raw = _read("/proc/meminfo")
    if raw is None:
        return None
    data = b"\n" + raw
    vals = []
    for key in _MEMINFO_KEYS:
        at = data.find(key)
        if at < 0:
            return None
        at += len(key)
        end = data.find(b"\n", at)
        vals.append(int(data[at:end if end >= 0 else len(data)].split()[0]) * 1024)  # kB
    return vals[0], vals[1], vals[2], vals[3]


def _read_fresh(path: str) -> bytes | None:
    try:
        return read_all(path)
    except OSError:
        return None


class _KeptFile:
    """A /proc file read every tick through a descriptor kept open: a pread at offset 0 has the kernel write it
    afresh, without the open and close of every other read (half the cost of /proc/meminfo or /proc/net/dev).

    A kept read that fails, comes back empty, or gives exactly the bytes of the one before (a layer that caches
    it, such as a FUSE /proc in a container, would) is made again on a fresh open, as every read was before, and
    that descriptor is kept instead.
    """

    def __init__(self, path: str):
        self.path = path
        self._fd: int | None = None
        self._size = 16384  # grows to hold the whole file (/proc/stat of a large node is tens of KiB)
        self._last: bytes | None = None
        self._lock = threading.Lock()  # shared by every sampler of the process: a descriptor closed under one

    def read(self) -> bytes | None:
        with self._lock:
            return self._read()

    def _read(self) -> bytes | None:
        data = self._pread() if self._fd is not None else None
        if not data or data == self._last:  # the descriptor is suspect: the file is opened afresh (and kept)
            self.close()
            data = self._pread()
        self._last = data
        return data

    def _pread(self) -> bytes | None:
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            data = os.pread(self._fd, self._size, 0)
            while len(data) >= self._size:  # it may have more: read it whole, from the start
                self._size *= 2
                data = os.pread(self._fd, self._size, 0)
            return data
        except OSError:
            self.close()
            return None

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


_KEPT = {p: _KeptFile(p) for p in ("/proc/stat", "/proc/meminfo", "/proc/net/dev")}


def _read(path: str) -> bytes | None:
    """A /proc file read every tick; None where there is none (not Linux)."""
    kept = _KEPT.get(path)
    return kept.read() if kept is not None else _read_fresh(path)


def _per_core() -> list[tuple[float, float]]:
    """(busy, total) time of each core, as psutil's cpu_times(percpu=True) adds them, from one read of /proc/stat."""
    data = _read("/proc/stat")
    if data is None:  # not Linux
        out = []
        for c in psutil.cpu_times(percpu=True):
            total = sum(c) - getattr(c, "guest", 0.0) - getattr(c, "guest_nice", 0.0)
            out.append((total - c.idle - getattr(c, "iowait", 0.0), total))
        return out
    out = []
    end = data.find(b"\nintr")  # the cores' lines come first; intr's hundreds of counters need no splitting
    for line in (data if end < 0 else data[:end]).split(b"\n"):
        if not line.startswith(b"cpu") or line.startswith(b"cpu "):
            continue
        # user nice system idle iowait irq softirq steal: only the 8 used are converted (half the cost)
        v = [*map(int, line.split(None, 9)[1:9]), 0, 0, 0, 0, 0]
        # guest time is already inside user on Linux; counting it twice would exceed 100 %
        total = float(sum(v[:8]))
        out.append((total - v[3] - v[4], total))
    return out


def _net_bytes() -> tuple[int, int] | None:
    """Bytes received and sent by every interface but loopback, from one read of /proc/net/dev."""
    data = _read("/proc/net/dev")
    if data is None:
        try:
            counters = psutil.net_io_counters(pernic=True)
        except (OSError, RuntimeError):
            return None
        return (sum(c.bytes_recv for n, c in counters.items() if n != "lo"),
                sum(c.bytes_sent for n, c in counters.items() if n != "lo"))
    rx = tx = 0
    for line in data.split(b"\n")[2:]:
        name, sep, rest = line.partition(b":")
        if not sep or name.strip() == b"lo":
            continue
        f = rest.split()
        if len(f) >= 9:
            rx += int(f[0])
            tx += int(f[8])
    return rx, tx


def _disk_path(db_path: str | os.PathLike) -> str:
    """The nearest existing directory of the database: the file may not exist yet on a first start."""
    p = Path(db_path).absolute()
    for cand in (p, *p.parents):
        if cand.exists():
            return str(cand)
    return "/"


class HostSampler:
    def __init__(self, db_path: str | os.PathLike, tree_refresh_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic, table: ProcTable | None = None,
                 refresh_s: float = MAX_AGE_S):
        self.db_path = db_path
        self.tree_refresh_s = tree_refresh_s
        self._table = table or ProcTable()  # the node shares its table with the run's member lookup
        self._clock = clock
        self._prev_t: float | None = None
        self._prev_cpu: list[tuple[float, float]] | None = None  # (busy, total) per core
        self._prev_net: tuple[int, int] | None = None
        self._tree_root: int | None = None
        self._tree_at = 0.0
        self._tree_look = -1  # the table's look count after the last walk
        self._procs: dict[int, int] = {}  # pid -> start ticks: a reused pid is another process
        self._roles: dict[int, str] = {}
        self._untitled: dict[int, float] = {}  # pid -> first walk that saw it without a vLLM title (monotonic)
        self._prev_proc_cpu: dict[int, float] = {}
        self.tree_pids: frozenset[int] = frozenset()  # the tree's members as the last `sample` read them
        self._stat_files = self._table.files  # the descriptors the table's fresh reads keep, one per process
        self._disk: str | None = None  # the database file, once it exists (its filesystem is the one to watch)
        self._refresh = Refresh(refresh_s)  # the row is read about once a second (agent/gpu/refresh.py)
        self._row: dict | None = None  # the last row read, for the root it was read for
        self._row_at: float | None = None
        self._row_root: int | None = None
        self._failing: set[str] = set()  # the groups of readings failing now (logged when it starts and ends)

    # ------------------------------------------------------------------ the vLLM tree

    def vllm_pids(self, root_pid: int | None) -> set[int]:
        """Pids of the supervised vLLM process and all its descendants (empty when there is none)."""
        if root_pid is None:
            self._tree_root = None
            self._stat_files.drop(self._procs)  # the table keeps only what it reads itself
            self._procs.clear()
            return set()
        return set(self._members(root_pid))

    def _members(self, root_pid: int) -> dict[int, tuple[float, int]]:
        """The tree's live members with their (CPU seconds, RSS bytes), one /proc read each (a walk's reads are
        its usage); a member gone re-walks the tree."""
        now = self._clock()
        if (root_pid != self._tree_root or now - self._tree_at >= self.tree_refresh_s
                or self._table.looks != self._tree_look and self._table.fresh()):  # another reader's listing
            usage = self._refresh_tree(root_pid, now)
        else:
            usage = self._usage()
        if len(usage) < len(self._procs):
            self._refresh_tree(root_pid, now)
            usage = self._usage()
        return usage

    def _usage(self) -> dict[int, tuple[float, int]]:
        """Each kept member's (CPU seconds, RSS bytes) read now: one pread a process, parsed into a tuple (no
        object a process); one that is gone, a zombie or its pid reused is left out."""
        out = {}
        usage_fields = procs.usage_fields
        for (pid, start), raw in zip(self._procs.items(), self._stat_files.read_many(self._procs), strict=True):
            u = None if raw is None else usage_fields(raw)
            if u is not None and u[0] == start and u[1] not in _DEAD:
                out[pid] = u[2], u[3]
        return out

    def _refresh_tree(self, root_pid: int, now: float) -> dict[int, tuple[float, int]]:
        """Walk the tree again; the usage of its members from the walk's own reads (made now)."""
        self._tree_root, self._tree_at = root_pid, now
        usage: dict[int, procs.ProcUsage] = {}
        members = self._table.tree(root_pid, usage)  # live ones only: a killed worker stays a zombie until reaped
        self._tree_look = self._table.looks
        starts = {s.pid: s.start_ticks for s in members}
        for pid in list(self._roles):
            if starts.get(pid) != self._procs.get(pid):  # gone, or the pid now names another process
                del self._roles[pid]
                self._untitled.pop(pid, None)
                self._prev_proc_cpu.pop(pid, None)
        self._stat_files.drop([pid for pid in self._procs if pid not in starts])  # left the tree
        self._procs = starts
        untitled = self._untitled
        for s in members:
            if s.pid not in self._roles:
                role = self._roles[s.pid] = role_of(_title(s))
                if role == "api":
                    untitled[s.pid] = now
            elif s.pid in untitled:  # vLLM titles its engine and workers after their imports: seconds in
                role = role_of(_title(s))
                if role != "api" or now - untitled[s.pid] >= TITLE_WAIT_S:
                    self._roles[s.pid] = role
                    del untitled[s.pid]
        return {pid: (u.cpu_s, u.rss_bytes) for pid, u in usage.items()}

    # ------------------------------------------------------------------ one tick

    def sample(self, vllm_root_pid: int | None) -> dict:
        """The host row of this tick: read about once a second, a copy of the last reading in between.

        Every figure here is either a rate over jiffies (100 a second: a 0.1 s span resolves a core's CPU only to
        10 %) or moves slower than a second, so a 10 Hz tick that read /proc each time paid for noise. The row is
        read again when `Refresh` says (never older than a second in any row) and whenever the served root
        changes (a new run's tree is read on its first tick).
        """
        now = self._clock()
        self._refresh.tick(now)
        if self._row is None or vllm_root_pid != self._row_root or self._refresh.due(self._row_at, now):
            self._row, self._row_at, self._row_root = self._read(vllm_root_pid, now), now, vllm_root_pid
        return self._row.copy()

    def _read(self, vllm_root_pid: int | None, now: float) -> dict:
        dt = None if self._prev_t is None else now - self._prev_t
        self._prev_t = now
        row: dict = dict.fromkeys(HOST_COLUMNS)
        failed: list[tuple[str, Exception]] = []
        try:
            self._cpu(row)
        except _READ_ERRORS as e:
            failed.append(("cpu", e))
        try:
            row["load1"], row["load5"], row["load15"] = os.getloadavg()
        except _READ_ERRORS as e:  # OSError "Load averages are unobtainable" where /proc/loadavg can't be read
            failed.append(("load", e))
        try:
            self._memory(row)
        except _READ_ERRORS as e:
            failed.append(("memory", e))
        self._disk_space(row)
        try:
            self._net(row, dt)
        except _READ_ERRORS as e:
            self._prev_net = None  # the next rate starts afresh
            failed.append(("net", e))
        try:
            self._sample_tree(vllm_root_pid, dt, row)
        except _READ_ERRORS as e:
            failed.append(("tree", e))
        if failed or self._failing:
            self._episodes(row, failed)
        return row

    def _episodes(self, row: dict, failed: list[tuple[str, Exception]]) -> None:
        """The failed groups' columns NULL (one may have failed half-way); a group's failure logged when it starts
        and when it ends, not on every read."""
        now_failing = set()
        for group, e in failed:
            now_failing.add(group)
            for col in _GROUP_COLUMNS[group]:
                row[col] = None
            if group not in self._failing:
                log.warning("host readings: %s unreadable (%s: %s); its columns are NULL until it reads again",
                            group, type(e).__name__, e)
        for group in self._failing - now_failing:
            log.info("host readings: %s readable again", group)
        self._failing = now_failing

    def _cpu(self, row: dict) -> None:
        per_core = _per_core()
        if self._prev_cpu is not None and len(self._prev_cpu) == len(per_core):
            pcts = []
            busy_sum = total_sum = 0.0
            for (b1, t1), (b0, t0) in zip(per_core, self._prev_cpu, strict=True):
                db, dtot = b1 - b0, t1 - t0
                pcts.append(round(max(0.0, min(100.0, 100.0 * db / dtot)), 1) if dtot > 0 else 0.0)
                busy_sum += db
                total_sum += dtot
            # a core's idle or iowait stepping back (NO_HZ accounting, a VM's vCPU) makes the sums lie: 0-100
            row["cpu_pct"] = round(max(0.0, min(100.0, 100.0 * busy_sum / total_sum)), 1) if total_sum > 0 else 0.0
            row["cpu_per_core_pct"] = json.dumps(pcts)
        self._prev_cpu = per_core

    @staticmethod
    def _memory(row: dict) -> None:
        mi = _meminfo()
        if mi is not None:
            total, avail, swap_total, swap_free = mi
        else:  # not Linux, or /proc unreadable
            vm, sw = psutil.virtual_memory(), psutil.swap_memory()
            total, avail, swap_total, swap_free = vm.total, vm.available, sw.total, sw.free
        row["mem_total_bytes"] = total
        row["mem_available_bytes"] = avail
        # what `free` users mean by "in use"; a container's meminfo (lxcfs) may give available > total
        row["mem_used_bytes"] = max(0, total - avail)
        row["swap_used_bytes"], row["swap_total_bytes"] = max(0, swap_total - swap_free), swap_total

    def _disk_space(self, row: dict) -> None:
        try:
            path = self._disk or _disk_path(self.db_path)
            du = shutil.disk_usage(path)
            if self._disk is None and path == str(Path(self.db_path).absolute()):
                self._disk = path  # the database itself: no need to look again (before it exists, look each tick)
            row["disk_free_bytes"], row["disk_total_bytes"] = du.free, du.total
        except OSError:
            self._disk = None  # the directory went away: look for the nearest one again next tick

    def _net(self, row: dict, dt: float | None) -> None:
        net = _net_bytes()
        if net is not None and self._prev_net is not None and dt:
            row["net_rx_bytes_per_s"] = max(0, round((net[0] - self._prev_net[0]) / dt))
            row["net_tx_bytes_per_s"] = max(0, round((net[1] - self._prev_net[1]) / dt))
        self._prev_net = net

    def _sample_tree(self, root_pid: int | None, dt: float | None, row: dict) -> None:
        if root_pid is None:
            self.vllm_pids(None)
            self._prev_proc_cpu.clear()
            self.tree_pids = frozenset()
            return
        members = self._members(root_pid)
        self.tree_pids = frozenset(members)
        cpu = dict.fromkeys(ROLES, 0.0)
        rss = dict.fromkeys(ROLES, 0)
        # the tree's first tick has no previous CPU times: its rates are unknown (None), not zero
        have_rate = dt is not None and dt > 0 and bool(self._prev_proc_cpu)
        roles, prev_cpu = self._roles, self._prev_proc_cpu
        for pid, (used, rss_bytes) in members.items():
            role = roles.get(pid, "api")
            rss[role] += rss_bytes
            prev = prev_cpu.get(pid)
            if prev is not None and have_rate:  # a process born this tick counts from the next one
                cpu[role] += 100.0 * max(0.0, used - prev) / dt  # type: ignore[operator]
            prev_cpu[pid] = used
        row["vllm_procs"] = len(members)
        row["vllm_rss_bytes"] = sum(rss.values())
        for role in ROLES:
            row[f"vllm_{role}_rss_bytes"] = rss[role]
        if have_rate:
            row["vllm_cpu_pct"] = round(sum(cpu.values()), 1)
            for role in ROLES:
                row[f"vllm_{role}_cpu_pct"] = round(cpu[role], 1)
