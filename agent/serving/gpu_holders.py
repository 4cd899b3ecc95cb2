"""Processes that are not the agent's run on the GPUs a profile is about to use ("GPUs taken").

A second vLLM on GPUs that already serve a model (another agent's run, another team's job, a notebook) fails only
on vLLM's own free-memory check, after it has opened CUDA contexts on the live model's GPUs; retried with backoff
it does so again and again. So every start looks at NVML's compute processes first: an operator's start, restart
or switch is refused (409 `gpus_taken`), an autostart or a retry waits until the GPUs are free.

Which GPUs: those vLLM will see (visible.py, shared with `lynxtop check`: CUDA_VISIBLE_DEVICES from the profile's
env over the agent's own, read by CUDA's rules: indices, UUIDs and unique UUID prefixes, an invalid entry hiding the
rest, CUDA_DEVICE_ORDER) when the GPU view says which GPU each process is on. MIG names, or a view without per-GPU
rows: all GPUs are checked. Ray profiles are not checked (their GPU workers are Ray's); a Ray
worker's agent tells foreign processes on its GPUs instead (agent/cluster/gpus.py).

Decided on a real process list: at the agent's start the view has NVML open but no process read until the
sampler's first tick, so an operator's action sent then waits for that sample (`first_sample`, FIRST_SAMPLE_S at
most: agent/controller.py) and, none come, is refused (503 `gpus_unknown`: try again); an autostart or a retry
waits for it (GpuGate). NVML unreadable (no process list can be had at all): the start goes ahead, as every other
check that needs NVML does (a node whose NVML is broken still serves; the API has no override to offer), and the
operator is told by a `preflight.warning` event that the GPUs were not checked; the log says it once per outage.

Another lynxtop agent's run (a second agent started by hand with its own state directory and the node's profiles):
its processes are told by the run token in their environment, on the process itself or, for vLLM's EngineCore and
workers (setproctitle blanks their environ), on an ancestor or their process group's leader (the API server, which
starts the run's session). An autostart or a retry is then held for good (state stopped, one event) instead of
waiting: waiting would take the GPUs over the moment that run ends, and an operator who stopped it there wants
them free. An operator's start is refused as for any holder, the message saying whose run it is.

A pid NVML lists that /proc does not show (it exited between NVML's list and the look, or lives in another PID
namespace: a container's processes are listed by NVML but invisible here) counts only if a GPU sample taken after
the look saw it missing lists it again (CONFIRM_PAUSE_S later, CONFIRM_WAIT_S at most; none: it counts).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from lynxtop.agent.api.control import ActionError
from lynxtop.agent.serving import procs, visible
from lynxtop.agent.serving.diskspace import DiskGate
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
OTHER_AGENT = "other_agent_run"  # the held event's reason: another lynxtop agent's run serves the GPUs
UNKNOWN_CODE = "gpus_unknown"  # ... when no GPU sample has come yet to tell
_NO_NVML = "NVML cannot list the GPUs' processes"
_GIB = 1 << 30
# How long a launch waits for a GPU sample taken after it began: at the agent's start the view holds the GPUs
# without their processes until the sampler's first tick, and an autostart comes before that tick.
FRESH_SAMPLE_S = 5.0
# How long an operator's start waits for the agent's first GPU sample (then refused: the processes are not known).
FIRST_SAMPLE_S = 5.0
# A listed pid /proc does not show counts only if a GPU sample taken CONFIRM_PAUSE_S after the look saw it missing
# lists it again (NVML drops an exited process's context a moment after its exit); none by CONFIRM_WAIT_S: it counts.
CONFIRM_PAUSE_S = 0.3
CONFIRM_WAIT_S = 3.0
_ANCESTRY_MAX = 64  # parents walked up from a holder to find the run token (a vLLM tree is 3-4 deep)


class GpuProcesses(Protocol):
    """The part of the supervisor's GPU view read here. A view may also have `process_rows` ([{gpu, pid,
    used_mem_bytes}], node.py's NodeGpuView does): then each process's GPUs and memory are known; and `sampled`,
    False while its process list is none yet (NVML open, no sample taken): then a start waits for one."""

    def gpu_info(self) -> list[dict[str, Any]] | None: ...

    def compute_pids(self) -> tuple[float, set[int]] | None: ...


@dataclasses.dataclass(frozen=True)
class LynxtopRun:
    """Another lynxtop agent's run that a holder belongs to, told by the process carrying its run token."""

    pid: int  # the process with the token: the run's API server, as a rule
    cwd: str | None  # its working directory: the run-log directory of the agent that started it (<state dir>/logs)
    agent_pid: int | None = None  # its parent, when that is a lynxtop agent (not so once the run was adopted)
    agent: str | None = None  # that agent's command line (its --config, --socket, --database), escaped

    def describe(self) -> str:
        text = f"its server pid {self.pid}" + (f", started in {self.cwd}" if self.cwd else "")
        if self.agent_pid is not None:
            text += f", by agent pid {self.agent_pid} ({self.agent})"
        return text

    def as_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "cwd": self.cwd, "agent_pid": self.agent_pid, "agent": self.agent}


@dataclasses.dataclass(frozen=True)
class Holder:
    """A process on the GPUs that is not the run's: `gpus` and `mem_bytes` as far as the view tells them."""

    pid: int
    name: str  # /proc comm, control characters escaped ("?" when /proc does not show it)
    gpus: tuple[int, ...] = ()
    mem_bytes: int | None = None
    lynxtop: LynxtopRun | None = None  # another lynxtop agent's run it belongs to

    def describe(self) -> str:
        extra = []
        if self.mem_bytes is not None:
            extra.append(f"{self.mem_bytes / _GIB:.1f} GiB")
        if self.gpus:
            extra.append(f"on GPU {','.join(map(str, self.gpus))}")
        return f"pid {self.pid} ({self.name}{', ' + ', '.join(extra) if extra else ''})"

    def as_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "name": self.name, "gpus": list(self.gpus) or None, "used_mem_bytes": self.mem_bytes,
                "lynxtop_run": self.lynxtop.pid if self.lynxtop is not None else None}


def profile_gpus(prof: Profile, info: list[dict[str, Any]] | None) -> tuple[int, ...] | None:
    """The NVML indices `prof`'s vLLM sees (visible.py: CUDA_VISIBLE_DEVICES as CUDA reads it, from the profile's env
    over the agent's own); None: all GPUs (not narrowed, or named in a way that cannot be mapped here: MIG devices,
    no GPU facts). (): none (an empty value, or an invalid first entry)."""
    if not info:
        return None
    gpus, _ = visible.visible_gpus(visible.effective_env(prof.env), info)
    return tuple(sorted(gpus)) if gpus is not None else None


def rows_by_pid(view: GpuProcesses) -> dict[int, list[dict[str, Any]]] | None:
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


def holder_of(pid: int, rows: list[dict[str, Any]], lynxtop: LynxtopRun | None = None) -> Holder:
    """`pid` as a Holder: its name from /proc, its GPUs and memory from its `rows` (the view's, rows_by_pid); also
    read by a Ray worker's look at its GPUs (agent/cluster/gpus.py)."""
    gpus = tuple(sorted({r["gpu"] for r in rows if isinstance(r.get("gpu"), int)}))
    mems = [r.get("used_mem_bytes") for r in rows]
    mem = sum(m for m in mems if isinstance(m, int)) if rows and all(isinstance(m, int) for m in mems) else None
    return Holder(pid, _name(pid), gpus, mem, lynxtop)


def _token_of(pid: int) -> str | None:
    return procs.environ_entry(procs.environ_raw(pid), procs.RUN_TOKEN_ENV) or None


def lynxtop_run(st: procs.ProcStat, own_tokens: set[str]) -> LynxtopRun | None:
    """The lynxtop run `st` (a process on the GPUs) belongs to when it is not this agent's: the first process
    carrying a run token among `st` and its ancestors, else its process group's leader (vLLM's EngineCore and
    workers retitle themselves, which blanks their environ; the API server above them, which leads the run's
    session, keeps it). None: no token found (an environ /proc does not let this user read, a run whose API server
    is gone), a token in `own_tokens`, or a process below this agent (its own, whatever the token says)."""
    me = os.getpid()
    found: procs.ProcStat | None = None
    cur: procs.ProcStat | None = st
    for _ in range(_ANCESTRY_MAX):
        if cur is None:
            break
        if cur.pid == me:
            return None
        if found is None and _token_of(cur.pid):
            found = cur
        if cur.ppid <= 1:
            break
        cur = procs.stat(cur.ppid)
    if found is None and st.pgid > 1 and st.pgid != st.pid:
        leader = procs.stat(st.pgid)
        if leader is not None and leader.pgid == leader.pid and leader.pid != me and _token_of(leader.pid):
            found = leader
    if found is None or _token_of(found.pid) in own_tokens:
        return None
    try:
        cwd: str | None = terminal_safe(os.readlink(f"/proc/{found.pid}/cwd"))
    except OSError:
        cwd = None
    args = procs.cmdline(found.ppid) or []
    if "agent" in args and any(os.path.basename(a) == "lynxtop" or a == "lynxtop" for a in args):
        cmd = " ".join(args)
        return LynxtopRun(found.pid, cwd, found.ppid, terminal_safe(cmd if len(cmd) <= 200 else cmd[:199] + "…"))
    return LynxtopRun(found.pid, cwd)


def gpus_text(gpus: tuple[int, ...] | None, info: list[dict[str, Any]] | None) -> str:
    """'GPU 0-7' / 'GPU 2,3': the GPUs a profile uses, as the messages name them."""
    if gpus == ():
        return "no GPU (CUDA_VISIBLE_DEVICES hides them all)"
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
    unknown: bool = False  # no GPU sample yet: which processes hold the GPUs is not known (no holders listed)

    def __bool__(self) -> bool:
        return bool(self.holders) or self.unknown

    def pids(self) -> list[int]:
        return [h.pid for h in self.holders]

    def other_runs(self) -> list[LynxtopRun]:
        """The other lynxtop agents' runs among the holders, each once."""
        runs: dict[int, LynxtopRun] = {}
        for h in self.holders:
            if h.lynxtop is not None:
                runs.setdefault(h.lynxtop.pid, h.lynxtop)
        return list(runs.values())

    def what(self) -> str:
        """'GPU 0-7 hold processes that are not this agent's run: pid 9 (sleep)'."""
        if self.unknown:
            return (f"no GPU sample has come since the agent started, so which processes hold {self.gpus_text} "
                    "is not known yet (NVML slow to answer?)")
        text = (f"{self.gpus_text} hold process(es) that are not this agent's run: "
                + "; ".join(h.describe() for h in self.holders))
        others = self.other_runs()
        if others:
            text += ("; " + ("they are" if all(h.lynxtop is not None for h in self.holders) else "among them")
                     + " another lynxtop agent's run (" + "; ".join(r.describe() for r in others) + ")")
        return text

    def refusal(self, prof: Profile) -> str:
        """The 409's message: what is wrong and how to proceed."""
        if self.other_runs():
            how = ("Stop that run through the agent that supervises it (lynxtop stop, with that agent's --socket or "
                   "config), not by killing its processes (that agent would restart them)")
        else:
            how = "Check them (ps -fp PID) and stop them"
        return (f"cannot start profile {prof.name}: {self.what()}. A vLLM started there would fail its free-memory "
                f"check after opening CUDA contexts on those GPUs (or crowd what runs there). {how}, or give the "
                "profile other GPUs (CUDA_VISIBLE_DEVICES in its env); nothing was changed")

    def details(self) -> dict[str, Any]:
        out = {"gpus": list(self.gpus) if self.gpus is not None else None, "pids": self.pids(),
               "processes": [h.as_dict() for h in self.holders]}
        others = self.other_runs()
        if others:
            out["lynxtop_runs"] = [r.as_dict() for r in others]
        return out


def sampled(view: Any) -> bool:
    """Whether `view`'s process list comes from a GPU sample (a view that does not say: it does)."""
    return getattr(view, "sampled", True) is not False


async def first_sample(view: GpuProcesses, action: str) -> None:
    """An operator's start, restart or switch (agent/controller.py): wait (FIRST_SAMPLE_S at most) for the agent's
    first GPU sample, at once when there is one or NVML cannot answer (no sample would list processes then either;
    the look says so). None within the bound (NVML slow to answer): refused, 503 gpus_unknown, nothing changed."""
    deadline = time.monotonic() + FIRST_SAMPLE_S
    while not sampled(view) and view.compute_pids() is not None:
        if time.monotonic() >= deadline:
            what = Taken(None, gpus_text(None, view.gpu_info()), (), unknown=True).what()
            raise ActionError(UNKNOWN_CODE, f"cannot {action} yet: {what}; a vLLM started on GPUs another model "
                              "holds would fail its free-memory check after opening CUDA contexts there. Try again "
                              "in a few seconds (lynxtop status shows the GPUs once sampled); nothing was changed",
                              503, details={"waited_s": FIRST_SAMPLE_S})
        await asyncio.sleep(0.05)


class GpuGuard:
    """Looks for foreign processes on a profile's GPUs; remembers whether "NVML cannot say" was logged."""

    def __init__(self, view: GpuProcesses):
        self.view = view
        self._unknown_told = False
        # an operator's start that goes ahead unchecked (NVML unavailable) is told here: the lifecycle's event path
        # (GpuGate wires it); called from the look's thread, as the store's own events come from the writer's
        self.warn: Callable[[str], None] | None = None
        # the run tokens of this agent's runs (GpuGate wires it): a process carrying one is never another agent's
        self.own_tokens: Callable[[], set[str]] = set

    def sampled(self) -> bool:
        """Whether the view's process list comes from a GPU sample (a view that does not say: it does)."""
        return sampled(self.view)

    def _unchecked(self, prof: Profile, operator: bool, why: str | None = None) -> None:
        """No process list (NVML cannot list them, or `why`): the start goes ahead unchecked; logged once per
        outage, and an operator's action told each time (they asked, and see events, not the agent's log)."""
        if why is None and not self._unknown_told:
            log.warning("GPU processes cannot be read (NVML unavailable): starts go ahead without checking "
                        "the GPUs for other processes")
            self._unknown_told = True
        if not operator:
            return
        message = (f"profile {prof.name}: {why or _NO_NVML}, so the GPUs were not "
                   "checked for other processes (another agent's model, another team's job); starting anyway. A "
                   "vLLM started where another model runs fails its free-memory check after opening CUDA contexts "
                   "there: check with nvidia-smi")
        if self.warn is not None:
            self.warn(message)  # the event path logs it too
        elif why is not None:
            log.warning("%s", message)

    def look(self, prof: Profile, ours: Callable[[], Iterable[int]], *, operator: bool = True) -> Taken | None:
        """The foreign processes on `prof`'s GPUs (an empty `Taken`: free); None when NVML cannot say.

        `ours`: the pids of the run being replaced (a switch's or restart's old run), no obstacle. Read after the
        GPUs' list, so a process of that run that appears meanwhile counts as the run's, never as foreign.
        Reads /proc: call it in a thread. A Ray profile is not checked: its GPU workers are Ray's processes (the
        node's raylet starts them), which nothing here can tell from a foreign job's.

        Before the agent's first GPU sample: for the GpuGate (`operator` False: an autostart or retry, which waited
        for a sample already) an `unknown` Taken, waited on like a taken one. An operator's action through the API
        waited for that sample before (`first_sample`, agent/controller.py); one that comes before any can
        (finishing an interrupted switch or restart at the agent's start, before the sampler runs) goes ahead
        unchecked, told, as with NVML unreadable."""
        if prof.uses_ray:
            return Taken(None, "the GPUs", ())
        seen = self.view.compute_pids()
        if seen is None:
            self._unchecked(prof, operator)
            return None
        self._unknown_told = False
        info = self.view.gpu_info()
        rows = rows_by_pid(self.view)
        wanted = profile_gpus(prof, info) if rows is not None else None  # unmappable: every GPU counts
        if not self.sampled():
            if operator:
                self._unchecked(prof, operator, "started before the agent's first GPU sample (no process list yet)")
                return None
            return Taken(wanted, gpus_text(wanted, info), (), unknown=True)
        mine = set(ours())
        own = self.own_tokens()
        holders, unseen = [], []
        for pid in sorted(seen[1] - mine):
            st = procs.stat(pid)
            h = holder_of(pid, (rows or {}).get(pid, []), lynxtop_run(st, own) if st is not None else None)
            if wanted is not None and h.gpus and not set(h.gpus) & set(wanted):
                continue  # on GPUs the profile does not use
            holders.append(h)
            if st is None:
                unseen.append(pid)
        if unseen:  # exited since NVML's list, or in another PID namespace: a later list tells
            listed = self._listed_after(time.monotonic() + CONFIRM_PAUSE_S)
            if listed is not None:
                holders = [h for h in holders if h.pid not in unseen or h.pid in listed]
        return Taken(wanted, gpus_text(wanted, info), tuple(holders))

    def _listed_after(self, since: float) -> set[int] | None:
        """The pids of the first GPU sample taken at `since` or later (monotonic clock, as the view's sample times);
        None when none comes by CONFIRM_WAIT_S from now or NVML cannot say. Sleeps: the look's thread only."""
        deadline = time.monotonic() + CONFIRM_WAIT_S
        while True:
            seen = self.view.compute_pids()
            if seen is None:
                return None
            if seen[0] >= since:
                return seen[1]
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)


class GpuGate:
    """An autostart or a retry (or a start whose GPUs were taken after its checks) waits here, launching nothing,
    while foreign processes hold the profile's GPUs (or, no GPU sample yet, nobody can say whether they do): the
    state is `waiting` with the reason, told by one event per episode; re-checked every `backoff_initial_s`; a stop
    ends the wait (`cancel`). Every launch passes here, so the wait for room on a full disk (diskspace.DiskGate,
    the same shape) comes first, in the same gate."""

    def __init__(self, lc: RunLifecycle, slot: ActionSlot, retry: Retry, guard: GpuGuard,
                 config: Callable[[], Config]):
        self._lc = lc
        self._config = config
        self._slot = slot
        self._retry = retry
        self.guard = guard
        guard.warn = lambda message: lc.event(EventKind.PREFLIGHT_WARNING, Severity.WARNING, message,
                                              reason="gpus_unchecked")
        guard.own_tokens = lambda: {t for t in (lc.run_token(),) if t}
        self.task: asyncio.Task | None = None  # the start or retry waiting here
        self.disk = DiskGate(lc, slot, retry, config)  # waited for first: a full disk (diskspace.py)

    async def _look(self, prof: Profile) -> Taken | None:
        return await asyncio.to_thread(self.guard.look, prof, self._lc.run_members, operator=False)

    async def _fresh_sample(self) -> None:
        """Wait (FRESH_SAMPLE_S at most) for a GPU sample taken from now on, or for NVML to say it cannot answer."""
        since = time.monotonic()
        while time.monotonic() < since + FRESH_SAMPLE_S:
            seen = self.guard.view.compute_pids()
            if seen is None or seen[0] >= since:
                return
            await asyncio.sleep(0.05)

    async def wait(self, prof: Profile, autostart: bool) -> bool:
        """True once no foreign process holds `prof`'s GPUs (at once when none does or NVML cannot say), and,
        before that, once the file systems the run writes to have room (diskspace.DiskGate). False: an autostart
        or retry held for good (another lynxtop agent's run holds them: `_hold`), nothing to launch."""
        await self.disk.wait(prof, autostart)
        if not prof.uses_ray:
            await self._fresh_sample()
        taken = await self._look(prof)
        if not taken:
            return True
        holds = autostart or self._slot.name() == "retry"  # the agent's own start, not an operator's
        lc = self._lc
        lc.profile, lc.profile_name = prof, prof.name
        self._retry.started()  # no retry pending: this wait is the retry
        if holds and taken.other_runs():
            return self._hold(prof, taken, autostart)

        def why(t: Taken) -> str:
            until = "a GPU sample shows them free" if t.unknown else "they are gone"
            return f"not starting profile {prof.name}: {t.what()}; starts once {until}"

        lc.set_state(S.WAITING, why(taken))
        self._held(prof, taken, autostart)
        self.task = asyncio.current_task()
        try:
            with self._slot.waiting():
                while taken:
                    await asyncio.sleep(self._config().agent.backoff_initial_s)
                    was_unknown, taken = taken.unknown, await self._look(prof)
                    if holds and taken and taken.other_runs():
                        return self._hold(prof, taken, autostart)
                    if taken and was_unknown and not taken.unknown:  # sampled now, and taken: the processes told
                        self._held(prof, taken, autostart)
                    if taken and why(taken) != lc.reason:  # the same episode: the reason follows, no new event
                        lc.set_state(S.WAITING, why(taken))
        finally:
            self.task = None
        log.info("profile %s: no other process holds its GPUs now; starting it", prof.name)
        return True

    def _hold(self, prof: Profile, taken: Taken, autostart: bool) -> bool:
        """Another lynxtop agent's run holds the GPUs: the autostart or retry ends here for good, launching nothing
        (waiting would take the GPUs over the moment that run ends: an operator who stops it there wants them
        free). State stopped, one event; an operator's start here is the way on. False: the launch ends with
        nothing spawned."""
        what = "autostart" if autostart else "retry"
        reason = (f"{what} of profile {prof.name} held: {taken.what()}. Not started here, not even once they are "
                  f"gone; `lynxtop start {prof.name}` on this agent starts it then")
        kind = EventKind.AGENT_AUTOSTART_HELD if autostart else EventKind.SERVING_BACKOFF
        self._lc.set_state(S.STOPPED, reason)
        self._lc.event(kind, Severity.ERROR, f"{reason}. Two agents serving one node's GPUs would take them over "
                       "from each other; stop that run through its own agent", reason=OTHER_AGENT, **taken.details())
        return False

    def _held(self, prof: Profile, taken: Taken, autostart: bool) -> None:
        """The wait's event: what holds the GPUs (or that nobody can say yet), for an autostart or a retry."""
        kind, severity = ((EventKind.AGENT_AUTOSTART_HELD, Severity.ERROR) if autostart
                          else (EventKind.SERVING_BACKOFF, Severity.WARNING))
        head = f"{'autostart' if autostart else 'start'} of profile {prof.name} held: {taken.what()}"
        if taken.unknown:
            self._lc.event(kind, severity, f"{head}. Waiting for a GPU sample (lynxtop stop ends the wait)",
                           reason=UNKNOWN_CODE, **taken.details())
            return
        self._lc.event(kind, severity, f"{head}; a vLLM started there would fail its free-memory check after "
                       "opening CUDA contexts on those GPUs. Waiting until they are gone (ps -fp PID; lynxtop stop "
                       "ends the wait)", reason=CODE, **taken.details())

    async def cancel(self) -> None:
        """A stop ends a start or retry that waits here (or for room on the disk)."""
        await self.disk.cancel()
        task = self.task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
