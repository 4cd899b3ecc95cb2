"""Processes that are not the agent's run on the GPUs a profile is about to use ("GPUs taken").

A second vLLM on GPUs that already serve a model (another agent's run, another team's job, a notebook) fails only
on vLLM's own free-memory check, after it has opened CUDA contexts on the live model's GPUs; retried with backoff
it does so again and again. So every start looks at NVML's compute processes first: an operator's start, restart
or switch is refused (409 `gpus_taken`), an autostart or a retry waits until the GPUs are free.

Which GPUs: all of them, or those `CUDA_VISIBLE_DEVICES` in the profile's env names as indices (read as NVML
indices, as `lynxtop check` does) when the GPU view says which GPU each process is on. UUIDs, MIG names, or a view
without per-GPU rows: all GPUs are checked. NVML unreadable: nothing is checked (a start is never blocked by a
view that cannot answer), told once in the log. Ray profiles are not checked (their GPU workers are Ray's).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from lynxtop.agent.serving import procs
from lynxtop.contract.config import Config, Profile
from lynxtop.contract.events import EventKind, Severity
from lynxtop.contract.status import ServingState as S  # noqa: N817 - read as a state name: S.WAITING
from lynxtop.contract.terminal import terminal_safe

if TYPE_CHECKING:
    from lynxtop.agent.serving.actions import ActionSlot
    from lynxtop.agent.serving.lifecycle import RunLifecycle
    from lynxtop.agent.serving.retry import Retry

log = logging.getLogger("lynxtop.agent.serving.supervisor")

CODE = "gpus_taken"  # the control API's error code (docs/api.md)
_INDEX = re.compile(r"[0-9]+")
_GIB = 1 << 30
# How long a launch waits for a GPU sample taken after it began: at the agent's start the view holds the GPUs
# without their processes until the sampler's first tick, and an autostart comes before that tick.
FRESH_SAMPLE_S = 5.0


class GpuProcesses(Protocol):
    """The part of the supervisor's GPU view read here. A view may also have `process_rows` ([{gpu, pid,
    used_mem_bytes}], node.py's NodeGpuView does): then each process's GPUs and memory are known."""

    def gpu_info(self) -> list[dict[str, Any]] | None: ...

    def compute_pids(self) -> tuple[float, set[int]] | None: ...


@dataclasses.dataclass(frozen=True)
class Holder:
    """A process on the GPUs that is not the run's: `gpus` and `mem_bytes` as far as the view tells them."""

    pid: int
    name: str  # /proc comm, control characters escaped ("?" when /proc does not show it)
    gpus: tuple[int, ...] = ()
    mem_bytes: int | None = None

    def describe(self) -> str:
        extra = []
        if self.mem_bytes is not None:
            extra.append(f"{self.mem_bytes / _GIB:.1f} GiB")
        if self.gpus:
            extra.append(f"on GPU {','.join(map(str, self.gpus))}")
        return f"pid {self.pid} ({self.name}{', ' + ', '.join(extra) if extra else ''})"

    def as_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "name": self.name, "gpus": list(self.gpus) or None, "used_mem_bytes": self.mem_bytes}


def profile_gpus(prof: Profile, info: list[dict[str, Any]] | None) -> tuple[int, ...] | None:
    """The NVML indices `prof` runs on (CUDA_VISIBLE_DEVICES in its env); None: all GPUs (not narrowed, or named
    in a way that cannot be mapped here: UUIDs, MIG devices, an index the node does not have)."""
    cvd = prof.env.get("CUDA_VISIBLE_DEVICES")
    if cvd is None or not info:
        return None
    parts = [p.strip() for p in cvd.split(",") if p.strip()]
    if not parts or not all(_INDEX.fullmatch(p) for p in parts):
        return None
    wanted = tuple(sorted({int(p) for p in parts}))
    known = {g.get("index") for g in info}
    return wanted if set(wanted) <= known else None


def _rows_by_pid(view: GpuProcesses) -> dict[int, list[dict[str, Any]]] | None:
    rows = getattr(view, "process_rows", None)
    if not isinstance(rows, list):
        return None
    out: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        if isinstance(r, dict) and isinstance(r.get("pid"), int):
            out.setdefault(r["pid"], []).append(r)
    return out


def _name(pid: int) -> str:
    st = procs.stat(pid)
    return terminal_safe(st.comm) if st is not None else "?"


def _holder(pid: int, rows: list[dict[str, Any]]) -> Holder:
    gpus = tuple(sorted({r["gpu"] for r in rows if isinstance(r.get("gpu"), int)}))
    mems = [r.get("used_mem_bytes") for r in rows]
    mem = sum(m for m in mems if isinstance(m, int)) if rows and all(isinstance(m, int) for m in mems) else None
    return Holder(pid, _name(pid), gpus, mem)


def gpus_text(gpus: tuple[int, ...] | None, info: list[dict[str, Any]] | None) -> str:
    """'GPU 0-7' / 'GPU 2,3': the GPUs a profile uses, as the messages name them."""
    if gpus is not None:
        return f"GPU {','.join(map(str, gpus))}"
    n = len(info or [])
    return f"GPU 0-{n - 1}" if n > 1 else ("GPU 0" if n == 1 else "the GPUs")


@dataclasses.dataclass(frozen=True)
class Taken:
    """What a look found: the GPUs `prof` uses and the foreign processes on them (empty: free)."""

    gpus: tuple[int, ...] | None  # None: all
    gpus_text: str
    holders: tuple[Holder, ...]

    def __bool__(self) -> bool:
        return bool(self.holders)

    def pids(self) -> list[int]:
        return [h.pid for h in self.holders]

    def what(self) -> str:
        """'GPU 0-7 hold processes that are not this agent's run: pid 9 (sleep)'."""
        return (f"{self.gpus_text} hold process(es) that are not this agent's run: "
                + "; ".join(h.describe() for h in self.holders))

    def refusal(self, prof: Profile) -> str:
        """The 409's message: what is wrong and how to proceed."""
        return (f"cannot start profile {prof.name}: {self.what()}. A vLLM started there would fail its free-memory "
                "check after opening CUDA contexts on those GPUs (or crowd what runs there). Check them "
                "(ps -fp PID) and stop them, or give the profile other GPUs (CUDA_VISIBLE_DEVICES in its env); "
                "nothing was changed")

    def details(self) -> dict[str, Any]:
        return {"gpus": list(self.gpus) if self.gpus is not None else None, "pids": self.pids(),
                "processes": [h.as_dict() for h in self.holders]}


class GpuGuard:
    """Looks for foreign processes on a profile's GPUs; remembers whether "NVML cannot say" was logged."""

    def __init__(self, view: GpuProcesses):
        self.view = view
        self._unknown_told = False

    def look(self, prof: Profile, ours: Callable[[], Iterable[int]]) -> Taken | None:
        """The foreign processes on `prof`'s GPUs (an empty `Taken`: free); None when NVML cannot say.

        `ours`: the pids of the run being replaced (a switch's or restart's old run), no obstacle. Read after the
        GPUs' list, so a process of that run that appears meanwhile counts as the run's, never as foreign.
        Reads /proc: call it in a thread. A Ray profile is not checked: its GPU workers are Ray's processes (the
        node's raylet starts them), which nothing here can tell from a foreign job's."""
        if prof.uses_ray:
            return Taken(None, "the GPUs", ())
        seen = self.view.compute_pids()
        if seen is None:
            if not self._unknown_told:
                log.warning("GPU processes cannot be read (NVML unavailable): starts go ahead without checking "
                            "the GPUs for other processes")
                self._unknown_told = True
            return None
        self._unknown_told = False
        info = self.view.gpu_info()
        rows = _rows_by_pid(self.view)
        wanted = profile_gpus(prof, info) if rows is not None else None  # unmappable: every GPU counts
        mine = set(ours())
        holders = []
        for pid in sorted(seen[1] - mine):
            h = _holder(pid, (rows or {}).get(pid, []))
            if wanted is not None and h.gpus and not set(h.gpus) & set(wanted):
                continue  # on GPUs the profile does not use
            holders.append(h)
        return Taken(wanted, gpus_text(wanted, info), tuple(holders))


class GpuGate:
    """An autostart or a retry (or a start whose GPUs were taken after its checks) waits here, launching nothing,
    while foreign processes hold the profile's GPUs: the state is `waiting` with the reason, told by one event per
    episode; re-checked every `backoff_initial_s`; a stop ends the wait (`cancel`)."""

    def __init__(self, lc: RunLifecycle, slot: ActionSlot, retry: Retry, guard: GpuGuard,
                 config: Callable[[], Config]):
        self._lc = lc
        self._config = config
        self._slot = slot
        self._retry = retry
        self.guard = guard
        self.task: asyncio.Task | None = None  # the start or retry waiting here

    async def _look(self, prof: Profile) -> Taken | None:
        return await asyncio.to_thread(self.guard.look, prof, self._lc.run_members)

    async def _fresh_sample(self) -> None:
        """Wait (FRESH_SAMPLE_S at most) for a GPU sample taken from now on, or for NVML to say it cannot answer."""
        since = time.monotonic()
        while time.monotonic() < since + FRESH_SAMPLE_S:
            seen = self.guard.view.compute_pids()
            if seen is None or seen[0] >= since:
                return
            await asyncio.sleep(0.05)

    async def wait(self, prof: Profile, autostart: bool) -> None:
        """Return once no foreign process holds `prof`'s GPUs (at once when none does or NVML cannot say)."""
        if not prof.uses_ray:
            await self._fresh_sample()
        taken = await self._look(prof)
        if not taken:
            return
        lc = self._lc
        lc.profile, lc.profile_name = prof, prof.name
        self._retry.started()  # no retry pending: this wait is the retry

        def why(t: Taken) -> str:
            return f"not starting profile {prof.name}: {t.what()}; starts once they are gone"

        lc.set_state(S.WAITING, why(taken))
        kind, severity = ((EventKind.AGENT_AUTOSTART_HELD, Severity.ERROR) if autostart
                          else (EventKind.SERVING_BACKOFF, Severity.WARNING))
        lc.event(kind, severity, f"{'autostart' if autostart else 'start'} of profile {prof.name} held: "
                 f"{taken.what()}; a vLLM started there would fail its free-memory check after opening CUDA "
                 "contexts on those GPUs. Waiting until they are gone (ps -fp PID; lynxtop stop ends the wait)",
                 reason=CODE, **taken.details())
        self.task = asyncio.current_task()
        try:
            with self._slot.waiting():
                while taken:
                    await asyncio.sleep(self._config().agent.backoff_initial_s)
                    taken = await self._look(prof)
                    if taken and why(taken) != lc.reason:  # the same episode: the reason follows, no new event
                        lc.set_state(S.WAITING, why(taken))
        finally:
            self.task = None
        log.info("profile %s: no other process holds its GPUs now; starting it", prof.name)

    async def cancel(self) -> None:
        """A stop ends a start or retry that waits here."""
        task = self.task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
