"""The node's process table between looks: who is in the served run and in its tree, for sampling.

Finding a run's processes means looking at every process on the node (procs.run_processes). Done afresh, a node's
~1 000 processes and kernel threads cost a /proc read each, twice every few seconds (the host tree and the run's
members), about half a percent of a core on its own. This table reads a process' stat once, when its pid first
shows up in /proc; a look lists /proc and reads only the new pids. Every `full_every_s` it reads them all again,
for what a kept entry can miss: a pid reused between two looks, a process that moved to another group.

What the table answers is checked against a fresh read of each process it names (a handful), so a stale entry
can leave a process out until the next full look but never puts a gone or reused pid in. Those reads go through
descriptors kept open (`files`, shared with the host sampler, which reads the tree's usage through them every
tick): a pread instead of an open, a read and a close; a kept descriptor that fails (its process reaped, the pid
perhaps reused) is dropped and the path opened afresh, so a read says what a fresh one would. The node looks
for the run's members just before the host row walks the tree, in the same tick and on the same listing: the
walk takes the members' confirming reads of the processes both name (once, within `share_s`) rather than read
them again. Decisions about stopping a run (is it gone, what is left) still scan afresh: they are rare and must
not be a minute late.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping

from lynxtop.agent.serving import procs

_DEAD = ("Z", "X")


class ProcTable:
    """Thread-safe: the host sampler and the run's member lookup read it from worker threads."""

    def __init__(self, full_every_s: float = 60.0, reuse_s: float = 1.0, share_s: float = 0.05,
                 clock: Callable[[], float] = time.monotonic):
        self.full_every_s = full_every_s
        self.reuse_s = reuse_s  # a look this young is answered again (both readers look in the same tick)
        self.share_s = share_s  # a tree walk this soon after the members' look takes its reads (same tick)
        self._shared: dict[int, bytes] = {}  # pid -> the members' confirming read, for one walk to take
        self._shared_at: float | None = None
        self._clock = clock
        self._lock = threading.Lock()
        self._stats: dict[int, procs.ProcStat] = {}
        self._tokens: dict[tuple[int, int], str | None] = {}  # (pid, start ticks) -> its run token, read once
        self.files = procs.StatFiles()  # /proc/<pid>/stat of the processes read fresh, kept while listed
        self._full_at: float | None = None
        self._look_at: float | None = None
        self.reads = 0  # stat reads of looks, for tests and benchmarks
        self.looks = 0  # listings of /proc: another reader's look since yours is one you can have for nothing

    def look(self) -> dict[int, procs.ProcStat]:
        """The processes now (as last read): new pids are read, vanished ones dropped."""
        with self._lock:
            return dict(self._look())

    def fresh(self) -> bool:
        """Whether a look now is answered by the last one (no listing of /proc)."""
        with self._lock:
            return self._fresh_look(self._clock())

    def _fresh_look(self, now: float) -> bool:
        return self._look_at is not None and 0 <= now - self._look_at < self.reuse_s

    def _look(self) -> dict[int, procs.ProcStat]:
        now = self._clock()
        if self._fresh_look(now):
            return self._stats
        self.looks += 1
        try:
            pids = procs.all_pids()
        except procs.ProcUnreadable:
            # unknown, not none: the last table stays (its processes read as alive, which refuses a start, never
            # kills) and the next look lists /proc again
            return self._stats
        full = self._full_at is None or not 0 <= now - self._full_at < self.full_every_s
        if full:
            self._full_at = now
        kept = {} if full else self._stats
        table: dict[int, procs.ProcStat] = {}
        for pid in pids:
            s = kept.get(pid)
            if s is None:
                self.reads += 1
                s = procs.stat(pid)
                if s is None:
                    continue
            table[pid] = s
        self._stats, self._look_at = table, now
        self.files.keep_only(table)  # a pid no longer listed: its process is gone
        self._tokens = {k: v for k, v in self._tokens.items() if k[0] in table and table[k[0]].start_ticks == k[1]}
        return table

    def _fresh(self, pid: int, usage: dict[int, procs.ProcUsage] | None = None,
               shared: dict[int, bytes] | None = None) -> procs.ProcStat | None:
        """A live process' stat read now (and kept); None when it is gone or a zombie. With `usage`, the same
        read's CPU time and RSS go into it. `shared`: reads made a moment ago, each taken (once) instead of a
        read of its own; a pid read here is put in it when it is the members' look's."""
        raw = shared.pop(pid, None) if shared else None
        if raw is None:
            raw = self.files.read(pid, reopen=True)
            if raw is not None and shared is self._shared:
                shared[pid] = raw
        if raw is None:
            s = u = None
        elif usage is None:
            s, u = procs.stat_of(pid, raw), None
        else:
            s, u = procs.stat_usage_of(pid, raw)  # one split for both
        if s is None or s.state in _DEAD:
            self._stats.pop(pid, None)
            return None
        self._stats[pid] = s
        if u is not None and usage is not None:
            usage[pid] = u
        return s

    def members(self, token: str | None, pgid: int | None, roots: Iterable[int] = (), since_ticks: int = 0,
                known: Mapping[int, int] | None = None, into: dict[int, int] | None = None) -> list[int]:
        """procs.run_processes over the kept table; each pid named is alive now and the process looked at."""
        with self._lock:
            table = self._look()  # zombies too: the run's leader not reaped yet still holds its group (members_in)
            found = procs.members_in(table, token, pgid, roots, since_ticks, lambda s: self._token(s) == token,
                                     known)
            out = []
            self._shared, self._shared_at = {}, self._clock()  # these reads serve the tree walk of this tick too
            for pid in found:
                kept = table[pid].start_ticks
                s = self._fresh(pid, shared=self._shared)
                if s is not None and s.start_ticks == kept:
                    out.append(pid)
                    if into is not None:
                        into[pid] = kept
            return out

    def _token(self, s: procs.ProcStat) -> str | None:
        """Read once per process; an empty read of a user process (an exec under way) is not kept, so the next
        look reads it again rather than call the process tokenless for its whole life."""
        key = (s.pid, s.start_ticks)
        if key in self._tokens:
            return self._tokens[key]
        raw = procs.environ_raw(s.pid)
        if procs.exec_under_way(raw, s):
            return None
        token = self._tokens[key] = procs.environ_entry(raw, procs.RUN_TOKEN_ENV)
        return token

    def tree(self, root: int, usage: dict[int, procs.ProcUsage] | None = None) -> list[procs.ProcStat]:
        """`root` and its live descendants, each read now (root first); empty when `root` is gone.

        Children are found through the kept parents and confirmed by the fresh read: a process that is not a
        child of its tree member any more (reparented, or a reused pid) is left out with its subtree. With
        `usage`, each member's usage from that same read is put in it (the host sampler's tick needs no second
        read of the tree it has just walked). A walk within `share_s` of the members' look (the same tick: the
        node looks for them just before the host row) takes that look's reads of the processes both name
        instead of reading them again, once: any later walk reads afresh."""
        with self._lock:
            now = self._clock()
            fresh_shared = self._shared_at is not None and 0 <= now - self._shared_at < self.share_s
            shared, self._shared = (self._shared if fresh_shared else {}), {}
            children: dict[int, list[int]] = {}
            for s in self._look().values():
                children.setdefault(s.ppid, []).append(s.pid)
            read: dict[int, procs.ProcUsage] | None = None if usage is None else {}
            top = self._fresh(root, read, shared)
            if top is None:
                return []
            out, todo, seen = [top], [top], {root}
            while todo:
                parent = todo.pop()
                for pid in children.get(parent.pid, ()):
                    s = None if pid in seen else self._fresh(pid, read, shared)
                    if s is not None and s.ppid == parent.pid:
                        seen.add(pid)
                        out.append(s)
                        todo.append(s)
            if usage is not None and read is not None:
                usage.update((s.pid, read[s.pid]) for s in out if s.pid in read)
            return out
