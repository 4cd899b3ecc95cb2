"""The file through which a simulated EngineCore tells the simulated GPUs what it holds and does.

One small binary file per EngineCore (`engine-<pid>.state`, fixed layout: a header struct, then the GPUs, the
holders, the two strings and the header's generation again, zero-padded to a whole number of SLOT bytes).
It is created atomically (write to a temp file, fsync-free rename) and then published in place: each publish
`pwrite`s the record over the file when its size is unchanged, so the GPU model inside the agent keeps the
file open and `pread`s it (`StateFiles`), with no directory listing, stat, open or close per publish (issue
29.3). A read that caught a write half done has two different generations and is read again or skipped.
A file only counts while at least one of the processes it names is alive and is the same process (pid and
start time), so memory is "released" exactly when the processes exit, however they exit, and a recycled pid
never resurrects old memory.
"""

from __future__ import annotations

import itertools
import os
import select
import struct
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from lynxtop.contract.files import atomic_write, close_fds, read_all

STATE_VERSION = 3  # 1 was JSON, 2 was replaced by a rename at every publish (no generation)
SLOT = 4096  # a state file's size is a multiple of this: a publish of the same size is written in place


def _start_ticks(pid: int) -> int | None:
    """Start time of pid in clock ticks after boot (field 22 of /proc/PID/stat); None if gone or a zombie."""
    try:
        raw = read_all(f"/proc/{pid}/stat")
    except OSError:
        return None
    rest = raw[raw.rfind(b")") + 2:].split()
    if not rest or rest[0] in (b"Z", b"X"):
        return None
    try:
        return int(rest[19])
    except (IndexError, ValueError):
        return None


def process_identity(pid: int) -> int | None:
    return _start_ticks(pid)


def same_process_alive(pid: int, start_ticks: int | None) -> bool:
    now = _start_ticks(pid)
    return now is not None and (start_ticks is None or now == start_ticks)


@dataclass
class Holder:
    gpu: int
    pid: int
    start_ticks: int | None
    mem_bytes: int


@dataclass
class EngineState:
    engine_pid: int
    api_pid: int
    model: str
    tp: int
    gpus: list[int]
    phase: str  # "loading weights" | "kv cache" | "cuda graphs" | "ready" | "hung" | "orphaned" | "dead"
    holders: list[Holder] = field(default_factory=list)
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    busy_frac: float = 0.0  # share of the last interval the engine was computing
    prefill_frac: float = 0.0  # share spent on prompt tokens (tensor-core heavy)
    decode_frac: float = 0.0  # share spent decoding (DRAM-bandwidth heavy)
    mean_batch: float = 0.0
    prompt_tokens_per_s: float = 0.0
    generation_tokens_per_s: float = 0.0
    straggler_gpu: int | None = None  # the GPU of this engine that runs slow (--sim-fail straggler=GPU)
    straggler_slowdown: float = 1.0  # how much slower; the group's other GPUs wait for it in the all-reduce
    updated_unix: float = 0.0
    version: int = STATE_VERSION
    simulated: bool = True

    def alive(self) -> bool:
        """True while any process holding memory for this engine is still the same live process."""
        return any(same_process_alive(pid, ticks) for pid, ticks in ((h.pid, h.start_ticks) for h in self.holders))


def state_path(state_dir: Path, engine_pid: int) -> Path:
    return state_dir / f"engine-{engine_pid}{SUFFIX}"


SUFFIX = ".state"
MAGIC = b"LXES"
# magic, version, generation, engine pid, api pid, tp, running, waiting, straggler GPU (-1: none), kv usage, busy,
# prefill, decode, mean batch, prompt tok/s, generation tok/s, straggler slowdown, updated (unix s), simulated,
# then the counts: GPUs, holders, model bytes, phase bytes; the record ends with the generation again
_HEAD = struct.Struct("<4sHQqqqqqqdddddddddBHHHH")
_GEN = struct.Struct("<Q")
# each publish's generation: a new one per record written by this process (a start from the clock, so a
# restarted engine's first records do not repeat its predecessor's)
_GENERATIONS = itertools.count(time.time_ns())
_HOLDER = struct.Struct("<qqqq")  # gpu, pid, start ticks (-1: unknown), memory bytes
_NONE = -1


def _pack(st: EngineState, gen: int = 0) -> bytes:
    """The record of `st`, zero-padded to a multiple of SLOT bytes."""
    gen &= 0xFFFF_FFFF_FFFF_FFFF
    model, phase = st.model.encode(), st.phase.encode()
    head = _HEAD.pack(
        MAGIC, STATE_VERSION, gen, st.engine_pid, st.api_pid, st.tp, st.running, st.waiting,
        _NONE if st.straggler_gpu is None else st.straggler_gpu, st.kv_usage, st.busy_frac, st.prefill_frac,
        st.decode_frac, st.mean_batch, st.prompt_tokens_per_s, st.generation_tokens_per_s, st.straggler_slowdown,
        st.updated_unix, int(st.simulated), len(st.gpus), len(st.holders), len(model), len(phase))
    holders = b"".join(_HOLDER.pack(h.gpu, h.pid, _NONE if h.start_ticks is None else h.start_ticks, h.mem_bytes)
                       for h in st.holders)
    rec = b"".join((head, struct.pack(f"<{len(st.gpus)}q", *st.gpus), holders, model, phase, _GEN.pack(gen)))
    return rec + bytes(-len(rec) % SLOT)


_COUNTS = _HEAD.size - 8  # where the header's four counts start: from here to the trailer, what rarely changes


def _unpack(raw: bytes, like: tuple[bytes, EngineState] | None = None) -> EngineState:
    """The state in `raw`; ValueError or struct.error for a file of another layout, cut short, or read while a
    publish was writing it (`Torn`). With `like` (an earlier record of the same file and its state), a record whose
    counts, GPUs, holders, model and phase are byte for byte `like`'s takes `like`'s objects for them (an engine
    republishes the same of those twice a second; only its figures move): the reader never changes them."""
    (magic, version, generation, engine_pid, api_pid, tp, running, waiting, straggler, kv, busy, prefill, decode, batch,
     prompt, gen, slowdown, updated, simulated, n_gpus, n_holders, n_model, n_phase) = _HEAD.unpack_from(raw)
    if magic != MAGIC or version != STATE_VERSION:
        raise ValueError("not an engine state file of this version")
    off = _HEAD.size + 8 * n_gpus + _HOLDER.size * n_holders
    end = off + n_model + n_phase
    if len(raw) < end + _GEN.size or len(raw) % SLOT:
        raise ValueError("engine state file of the wrong length")
    if _GEN.unpack_from(raw, end)[0] != generation:
        raise Torn("engine state file read while it was written")
    if like is not None and like[0][_COUNTS:end] == raw[_COUNTS:end]:
        old = like[1]
        gpus, model, phase, holders = old.gpus, old.model, old.phase, old.holders
    else:
        gpus = list(struct.unpack_from(f"<{n_gpus}q", raw, _HEAD.size))
        flat = struct.unpack_from(f"<{4 * n_holders}q", raw, _HEAD.size + 8 * n_gpus)
        holders = [Holder(flat[i], flat[i + 1], None if flat[i + 2] == _NONE else flat[i + 2], flat[i + 3])
                   for i in range(0, len(flat), 4)]
        model, phase = raw[off:off + n_model].decode(), raw[off + n_model:end].decode()
    return EngineState(
        engine_pid, api_pid, model, tp, gpus, phase, holders,
        running, waiting, kv, busy, prefill, decode, batch, prompt, gen, None if straggler == _NONE else straggler,
        slowdown, updated, version, bool(simulated))


class Torn(ValueError):
    """A record read while a publish was writing over it: its two generations differ."""


def load_state(path: str | os.PathLike) -> EngineState:
    """One state file (for tools and tests); OSError, ValueError or struct.error where it is not one."""
    return _load(path)


def _load(path: str | os.PathLike) -> EngineState:
    """A state file's state; read once more if the first read caught a publish half written."""
    try:
        return _unpack(read_all(os.fspath(path)))
    except Torn:
        return _unpack(read_all(os.fspath(path)))


def write_state(state_dir: Path, state: EngineState) -> None:
    """Publish `state`: in place over the engine's file when it has the record's size (readers keep it open),
    else by an atomic replace (the first publish, a record grown past its slot, a file gone or cut)."""
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # private: other users cannot plant GPU state
    path = state_path(state_dir, state.engine_pid)
    rec = _pack(state, next(_GENERATIONS))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:  # none yet, or not a plain file of ours (a link): replaced as a whole
        fd = -1
    if fd >= 0:
        try:
            if os.fstat(fd).st_size == len(rec) and os.pwrite(fd, rec, 0) == len(rec):
                return
        finally:
            os.close(fd)
    atomic_write(path, rec, mode=0o600, fsync=False)


def remove_state(state_dir: Path, engine_pid: int) -> None:
    try:
        state_path(state_dir, engine_pid).unlink()
    except OSError:
        pass


# file name -> ((inode, mtime ns, size), or the bytes read with `StateFiles`; state; when its liveness was checked
# (monotonic s); the verdict; its holders as `PidWatch` watches them)
StateCache = dict[str, tuple[tuple[int, int, int] | bytes, EngineState, float, bool, tuple["Proc", ...]]]
LIVENESS_S = 1.0  # with a cache and a clock, an engine's holders are looked up in /proc at most this often
Proc = tuple[int, int | None]  # (pid, start ticks): one process, never a later one with the same pid


def _holders(st: EngineState) -> list[Proc]:
    return [(h.pid, h.start_ticks) for h in st.holders]


def _is_proc(proc: Proc) -> bool:
    pid, ticks = proc
    return type(pid) is int and pid > 0 and (ticks is None or type(ticks) is int)


class PidWatch:
    """Whether memory holders are still the same live processes, by pidfd: /proc is read once per holder.

    A holder's identity (pid, start ticks) is checked once, right after its pidfd is opened (the fd then names
    that very process, whatever later reuses the pid); from then on a process that exited (zombie or reaped)
    makes its fd readable, and one `poll(0)` per directory read answers for every holder at once. The model
    reads the directory five times a second: this replaces a /proc read per holder per second (and the second
    of delay in releasing memory that saved it) with one system call. `usable` is False where pidfd_open is
    missing or refused (not Linux, a kernel before 5.3, a seccomp filter): `read_states` then reads /proc."""

    def __init__(self) -> None:
        self._fds: dict[Proc, int] = {}
        self._gone: set[Proc] = set()  # found exited (or never the named process): dead for good
        self._poll = select.poll() if hasattr(select, "poll") else None
        self._exited: set[int] | None = None  # fds readable at this read's poll (None: not polled yet)
        self.usable = self._poll is not None and hasattr(os, "pidfd_open")
        weakref.finalize(self, close_fds, self._fds)

    def begin(self) -> None:
        """A new directory read: the next question polls again."""
        self._exited = None

    def quiet(self) -> bool:
        """No watched process has exited (this read's one poll): every earlier verdict still holds."""
        if self._exited is None:
            self._exited = {f for f, _ in self._poll.poll(0)}  # type: ignore[union-attr]
        return not self._exited

    def alive(self, proc: Proc) -> bool:
        if proc in self._gone:
            return False
        fd = self._fds.get(proc)
        if fd is None:
            fd = self._open(proc)
            if fd is None:
                return False
        if self._exited is None:
            self._exited = {f for f, _ in self._poll.poll(0)}  # type: ignore[union-attr]
        if fd in self._exited:
            self._forget(proc)
            self._gone.add(proc)
            return False
        return True

    def _open(self, proc: Proc) -> int | None:
        pid, ticks = proc
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._gone.add(proc)
            return None
        except OSError:  # refused here (EPERM under seccomp, ENOSYS): fall back to /proc for good
            self.usable = False
            self.close()
            return None
        if not same_process_alive(pid, ticks):  # checked after opening: the fd is that process or none
            os.close(fd)
            self._gone.add(proc)
            return None
        self._fds[proc] = fd
        self._poll.register(fd, select.POLLIN)  # type: ignore[union-attr]
        self._exited = None  # a new fd: poll it too
        return fd

    def _forget(self, proc: Proc) -> None:
        fd = self._fds.pop(proc, None)
        if fd is not None:
            self._poll.unregister(fd)  # type: ignore[union-attr]
            os.close(fd)

    def keep_only(self, procs: set[Proc]) -> None:
        """Close the fds of holders no state file names any more."""
        for proc in [p for p in self._fds if p not in procs]:
            self._forget(proc)
        self._gone &= procs

    def close(self) -> None:
        for proc in list(self._fds):
            self._forget(proc)
        self._gone.clear()


RACY_NS = 2_000_000_000  # a listing is reused only while the directory's mtime was this old when it was made
_READ = os.O_RDONLY | os.O_CLOEXEC


class StateFiles:
    """The state files a reader keeps open, so each publish (written in place) costs it one `pread`.

    The directory is listed again only when its mtime moved (a file created, replaced by a rename or removed:
    each changes it; a write in place does not), or while that mtime is under RACY_NS old, as a change in the
    same clock tick could leave it unchanged. A file is known by device and inode: a name whose file was
    replaced is opened again, and the fds of files gone are closed."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[int, int, int, int]] = {}  # name -> (fd, st_dev, st_ino, size)
        self._listed: tuple[int, int, int] | None = None  # the directory's (dev, ino, mtime) the listing is of
        self._entries: list[tuple[str, int, int]] = []  # (name, fd, size), by name
        weakref.finalize(self, _close_open, self._open)

    def entries(self, state_dir: Path) -> list[tuple[str, int, int]] | None:
        """(name, fd, size) of each engine state file of ours, by name; None without a readable directory."""
        try:
            d = os.stat(state_dir)
            key = (d.st_dev, d.st_ino, d.st_mtime_ns)
            if key == self._listed:
                return self._entries
            listing = sorted(os.scandir(state_dir), key=lambda e: e.name)
        except OSError:
            self.close()
            return None
        me = os.getuid()
        kept: dict[str, tuple[int, int, int, int]] = {}
        for entry in listing:
            name = entry.name
            if not (name.startswith("engine-") and name.endswith(SUFFIX)):
                continue
            try:
                info = entry.stat()
                old = self._open.get(name)
                if old is not None and (old[1], old[2]) == (info.st_dev, info.st_ino):
                    kept[name] = old
                    continue
                fd = os.open(entry.path, _READ)
            except OSError:
                continue
            try:
                info = os.fstat(fd)  # the file opened, whatever the name points at since the listing
            except OSError:
                os.close(fd)
                continue
            if me != 0 and info.st_uid != me:
                os.close(fd)  # another user's file: never let it invent GPU memory on our node
                continue
            kept[name] = (fd, info.st_dev, info.st_ino, info.st_size)
        for name, (fd, *_) in self._open.items():
            if kept.get(name, (-1,))[0] != fd:
                _close(fd)
        self._open.clear()
        self._open.update(kept)
        self._entries = [(name, fd, size) for name, (fd, _, _, size) in kept.items()]
        self._listed = key if time.time_ns() - d.st_mtime_ns >= RACY_NS else None
        return self._entries

    def close(self) -> None:
        _close_open(self._open)
        self._listed, self._entries = None, []


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _close_open(files: dict[str, tuple[int, int, int, int]]) -> None:
    for fd, *_ in files.values():
        _close(fd)
    files.clear()


def _pread_state(fd: int, size: int, hit: tuple | None) -> tuple[bytes, EngineState]:
    """(raw, state) of an open state file; a torn read is read once more, then answered with the last state read
    (`hit`) if any. Raises OSError, ValueError or struct.error as `_unpack` does."""
    raw = os.pread(fd, max(size, SLOT), 0)
    like = None
    if hit is not None and type(hit[0]) is bytes:
        if hit[0] == raw:
            return raw, hit[1]
        like = (hit[0], hit[1])
    try:
        return raw, _unpack(raw, like)
    except Torn:
        raw = os.pread(fd, max(size, SLOT), 0)
        try:
            return raw, _unpack(raw, like)
        except Torn:
            if hit is None:
                raise
            return hit[0], hit[1]


def read_states(state_dir: Path, cache: StateCache | None = None, now: float | None = None,
                liveness_s: float = LIVENESS_S, watch: PidWatch | None = None,
                files: StateFiles | None = None) -> list[EngineState]:
    """Every readable state file of a live engine; unreadable or foreign files are skipped, not fatal.

    With `cache` (kept by the caller between reads), a file that is still the same file (inode, mtime, size:
    writers replace it by a rename, so each write is a new inode) is not parsed again. With `now` too (monotonic
    seconds), an engine's liveness verdict is reused for `liveness_s` while its holders are the same processes
    (an engine republishes twice a second with the same holders): each check reads /proc once per holder, and
    the GPU model reads the directory five times a second. An engine's memory is therefore released at most
    `liveness_s` after its last holder exits, as a real driver frees it some time after the process is gone.
    With a usable `watch` (kept by the caller too), liveness is its pidfds' instead: /proc is read once per
    holder, and memory is released at the first read after the last holder exits.
    With `files` (kept by the caller too), the files stay open and each read is one `pread` a file
    (`StateFiles`); an unchanged file is then one whose bytes are unchanged."""
    out: list[EngineState] = []
    if watch is not None and not watch.usable:
        watch = None
    if watch is not None:
        watch.begin()
    named: set[Proc] = set()
    opened = files.entries(state_dir) if files is not None else None
    try:
        entries = sorted(os.scandir(state_dir), key=lambda e: e.name) if files is None else opened
    except OSError:
        entries = None
    if entries is None:
        if watch is not None:
            watch.keep_only(named)  # no directory, no engines: every fd is closed
        if cache is not None and files is not None:
            cache.clear()
        return out
    me = os.getuid()
    seen: StateCache = {}
    quiet = watch is not None and watch.quiet()  # no holder exited: an unchanged file keeps its verdict
    for item in entries:
        hit = None
        try:
            if files is not None:
                name, fd, size = item  # type: ignore[misc]
                hit = cache.get(name) if cache is not None else None
                key, st = _pread_state(fd, size, hit)
            else:
                entry = item
                name = entry.name  # type: ignore[union-attr]
                if not (name.startswith("engine-") and name.endswith(SUFFIX)):
                    continue
                info = entry.stat()  # type: ignore[union-attr]
                if me != 0 and info.st_uid != me:
                    continue  # another user's file: never let it invent GPU memory on our node
                key = (info.st_ino, info.st_mtime_ns, info.st_size)
                hit = cache.get(name) if cache is not None else None
                if hit is not None and hit[0] == key:
                    st = hit[1]
                else:
                    st = _load(entry.path)  # type: ignore[union-attr]
        except (OSError, ValueError, struct.error):  # unreadable, another layout, cut short: skipped
            continue
        procs: tuple[Proc, ...] = ()
        if watch is not None and quiet and hit is not None and hit[1].holders is st.holders:
            # the same holders (`_unpack` kept their list), no exit since: nothing to ask
            checked, alive, procs = hit[2], hit[3], hit[4]
            named.update(procs)
        elif watch is not None:
            procs = tuple(p for p in _holders(st) if _is_proc(p))  # a file naming no real process holds nothing
            named.update(procs)
            checked, alive = (now if now is not None else float("-inf")), any(map(watch.alive, procs))
            if not watch.usable:  # pidfd_open refused on the way: /proc from here on
                watch, alive = None, st.alive()
        elif (hit is not None and now is not None and 0.0 <= now - hit[2] < liveness_s
                and (hit[1] is st or _holders(hit[1]) == _holders(st))):
            checked, alive = hit[2], hit[3]
        else:
            checked, alive = (now if now is not None else float("-inf")), st.alive()
        seen[name] = (key, st, checked, alive, procs)
        if alive:
            out.append(st)
    if cache is not None:
        cache.clear()
        cache.update(seen)  # files gone since are forgotten
    if watch is not None:
        watch.keep_only(named)
    return out
