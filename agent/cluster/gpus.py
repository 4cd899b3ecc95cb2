"""A worker's GPUs taken by processes that are not Ray's (another team's job, a notebook, a leftover vLLM).

On a Ray worker the agent runs no vLLM: the head's vLLM places its ranks on this node through Ray, and nothing
looks at the GPUs before they load (gpu_holders.py skips Ray profiles; the head's gate counts the GPUs Ray
declares, not free ones). A foreign process here makes those ranks run out of GPU memory, and the head records
crash, backoff, crash again with only vLLM's log tail. So the worker's agent looks at the processes NVML lists
on its GPUs (the view the sampler keeps, as GpuGuard reads it) every `[ray] view_interval_s`; one that is not
Ray's is told in the status (`cluster.gpus_taken`) and by one `preflight.warning` per episode, ended by another
(info) once they are gone.

Ray's: a descendant of this node's `ray start` (the raylet and the workers it starts, vLLM's ranks among them), a
process in `ray start`'s session or process group (the agent starts it in a session of its own: a Ray process
whose parent died stays there) or one carrying its run token. With Ray not running, no process is Ray's. A
process listed by NVML counts once it has been listed for CONFIRM_S (a Ray worker that outlives its raylet by a
moment, a pid that exited between NVML's list and the look: no event).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from lynxtop.agent.cluster.raynode import RayNode
from lynxtop.agent.serving import procs
from lynxtop.agent.serving.gpu_holders import GpuProcesses, Holder, holder_of, rows_by_pid, sampled
from lynxtop.agent.serving.run import now_ms
from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.contract.status import GpuTaker

log = logging.getLogger(__name__)

CONFIRM_S = 3.0  # a pid counts once NVML has listed it this long (samples' clock): NVML re-reads its list ~1 s
REASON, REASON_FREE = "gpus_taken", "gpus_free"  # the two events' details.reason
_ANCESTRY_MAX = 64


def _session(pid: int) -> int | None:
    """The session id of `pid` (/proc/<pid>/stat field 6), None when /proc does not show it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read(4096)
        return int(data[data.rfind(b")") + 2:].split()[3])
    except (OSError, ValueError, IndexError):
        return None


def is_rays(st: procs.ProcStat, ray_pid: int | None, token: str | None) -> bool:
    """Whether the process `st` belongs to this node's Ray, whose `ray start` is `ray_pid` (None: not running,
    then none does) and whose processes inherit the run `token`. Reads /proc: call it in a thread."""
    if not ray_pid:
        return False
    cur: procs.ProcStat | None = st
    for _ in range(_ANCESTRY_MAX):
        if cur is None:
            break
        if cur.pid == ray_pid:
            return True
        if cur.ppid <= 1:
            break
        cur = procs.stat(cur.ppid)
    if st.pgid == ray_pid or _session(st.pid) == ray_pid:
        return True
    return bool(token) and procs.environ_entry(procs.environ_raw(st.pid), procs.RUN_TOKEN_ENV) == token


def foreign(view: GpuProcesses, ray_pid: int | None, token: str | None) -> tuple[float, list[Holder]] | None:
    """(the sample's time, the processes on the GPUs that are not Ray's); None when NVML cannot say (unreadable,
    or no GPU sample yet). A pid /proc does not show (another PID namespace: a container's job) is foreign."""
    seen = view.compute_pids()
    if seen is None or not sampled(view):
        return None
    rows = rows_by_pid(view) or {}
    out = []
    for pid in sorted(seen[1]):
        st = procs.stat(pid)
        if st is not None and is_rays(st, ray_pid, token):
            continue
        out.append(holder_of(pid, rows.get(pid, [])))
    return seen[0], out


class WorkerGpus:
    """The worker's look at its GPUs every `interval_s`: `taken` (the status's), one event per episode."""

    def __init__(self, view: GpuProcesses, ray: RayNode, record: Callable[[Event], None], *, interval_s: float,
                 node: str, on_change: Callable[[], None] | None = None):
        self.view = view
        self.ray = ray
        self._record = record
        self.interval_s = interval_s
        self.node = node  # how the events name this worker (its Ray address, else its host name)
        self.on_change = on_change
        self.taken: tuple[GpuTaker, ...] = ()
        self.since_ms: int | None = None  # the episode's start (None: none open)
        self._first: dict[int, float] = {}  # pid -> the sample time it was first listed (foreign) at
        self._since_mono: float | None = None

    async def run(self) -> None:
        failing = False
        while True:
            try:
                await self.poll()
                failing = False
            except Exception as exc:  # noqa: BLE001 - a bug in one look must not end the watch for good
                if not failing:
                    log.exception("looking at this worker's GPU processes failed: %s", exc)
                failing = True
            await asyncio.sleep(self.interval_s)

    async def poll(self) -> None:
        proc = self.ray.proc
        alive = proc is not None and not proc.exited
        ray_pid = proc.pid if alive and proc is not None else None
        token = proc.record.token if alive and proc is not None else None
        found = await asyncio.to_thread(foreign, self.view, ray_pid, token)
        if found is None:
            return  # NVML cannot say: the last answer stands, nothing opened or ended
        ts, holders = found
        listed = {h.pid for h in holders}
        self._first = {pid: t for pid, t in self._first.items() if pid in listed}
        for pid in listed:
            self._first.setdefault(pid, ts)
        counted = [h for h in holders if ts - self._first[h.pid] >= CONFIRM_S]
        self._update(counted, ray_pid)

    def _update(self, holders: list[Holder], ray_pid: int | None) -> None:
        taken = tuple(GpuTaker(pid=h.pid, name=h.name, gpus=h.gpus, used_mem_bytes=h.mem_bytes) for h in holders)
        if taken == self.taken:
            return
        was, self.taken = self.taken, taken
        if taken and not was:
            self.since_ms, self._since_mono = now_ms(), time.monotonic()
            what = "; ".join(h.describe() for h in holders)
            ray = f"Ray's `ray start` is pid {ray_pid}" if ray_pid else "this node's Ray is not running"
            self._record(Event(EventKind.PREFLIGHT_WARNING, Severity.WARNING,
                               f"worker {self.node}: process(es) that are not Ray's hold this node's GPUs: {what} "
                               f"({ray}; not below it, nor in its session). vLLM's ranks that Ray places here will "
                               "run out of GPU memory, and the head's vLLM crash and retry; check them (ps -fp PID) "
                               "and stop them",
                               details={"reason": REASON, "role": "worker", "node": self.node,
                                        "pids": [h.pid for h in holders],
                                        "processes": [h.as_dict() for h in holders], "ray_pid": ray_pid}))
        elif was and not taken:
            lasted = time.monotonic() - self._since_mono if self._since_mono is not None else None
            self.since_ms = self._since_mono = None
            self._record(Event(EventKind.PREFLIGHT_WARNING, Severity.INFO,
                               f"worker {self.node}: no process but Ray's holds this node's GPUs any more (pids "
                               f"{', '.join(str(t.pid) for t in was)} gone"
                               + (f" after {lasted:.0f} s)" if lasted is not None else ")"),
                               details={"reason": REASON_FREE, "role": "worker", "node": self.node,
                                        "pids": [t.pid for t in was], "lasted_s": lasted}))
        if self.on_change:
            with contextlib.suppress(Exception):
                self.on_change()
