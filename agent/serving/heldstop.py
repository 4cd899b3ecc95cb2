"""An operator's stop of runs the agent does not supervise: a server held at adoption (alive, carrying its run's
token, but not provably the server: adoption.py), or one whose record no agent can read or that was lost.

Such a server keeps serving and holding its GPUs, and holds autostart and `lynxtop start` (the strays check). With
nothing supervised, `lynxtop stop` used to answer "already stopped" (the CLI exits 0): a runbook's `lynxtop stop &&
<maintenance>` went on with vLLM on the GPUs. The agent never signals such a run on its own (a 20-minute load is not
thrown away on a guess), but an operator's stop is the ask to end it: its group leaders (vLLM's API server leads its
own session) get SIGTERM and drain, what is left after the grace gets SIGKILL.

Runs are found as the strays check finds them (a run token in the environment, started in the run-log directory)
plus the held record's known members; each run's processes are then looked for by its token, as descendants of
those found (vLLM's EngineCore and workers retitle themselves and hide the token) and by pid and start time once
seen, so a reused pid is never signalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from lynxtop.agent.serving import procs
from lynxtop.agent.serving.launcher import ServerRecord, leader_is_the_runs

POLL_S = 0.2  # a look reads every process's stat: five a second is enough for a stop counted in seconds


@dataclass
class HeldRuns:
    """The live processes of unsupervised runs: run token -> {pid: start ticks} (known from now on)."""

    runs: dict[str, dict[int, int]] = field(default_factory=dict)

    def pids(self) -> list[int]:
        return sorted({p for members in self.runs.values() for p in members})

    def __bool__(self) -> bool:
        return any(self.runs.values())


@dataclass
class HeldStop:
    """What the stop did: every process of those runs seen, those SIGKILLed, those alive even after SIGKILL."""

    pids: list[int]
    killed: list[int] = field(default_factory=list)
    survivors: list[int] = field(default_factory=list)


def look(log_dir: str, record: ServerRecord | None = None, exclude: Iterable[int] = ()) -> HeldRuns:
    """The unsupervised runs alive now: token carriers started in `log_dir` (the realpath of the run-log directory)
    and `record`'s run (the held server's) while its pid carries its token. `exclude`: the supervised run's
    processes. ProcUnreadable: unknown, not none."""
    skip = set(exclude)
    roots: dict[str, list[int]] = {}
    for pid in procs.runs_started_in(log_dir, exclude=skip):
        st = procs.stat(pid)
        token = procs.settled_environ_value(st, procs.RUN_TOKEN_ENV) if st is not None else None
        if token:
            roots.setdefault(token, []).append(pid)
    known: dict[str, dict[int, int]] = {}
    if record is not None and record.token and leader_is_the_runs(record):
        roots.setdefault(record.token, []).append(record.pid)
        known[record.token] = dict(record.members)
    held = HeldRuns()
    for token, pids in roots.items():
        into: dict[int, int] = {}
        procs.run_processes(token, None, pids, 0, known.get(token), into)
        held.runs[token] = {p: t for p, t in into.items() if p not in skip}
    return held


def _live(held: HeldRuns) -> dict[int, int]:
    """The processes of `held`'s runs alive now (pid -> start ticks); each one found is known from now on."""
    alive: dict[int, int] = {}
    for token, members in held.runs.items():
        into: dict[int, int] = {}
        since = min(members.values(), default=0)  # only processes started since the run's first can carry it
        procs.run_processes(token, None, (), since, members, into)
        members.update(into)
        alive.update(into)
    return alive


def _signal(pid: int, ticks: int, sig: int) -> bool:
    """`sig` to `pid` only while it is the process seen (its start time): a reused pid is someone else's."""
    st = procs.stat(pid)
    if st is None or st.start_ticks != ticks or st.state in ("Z", "X"):
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)
        return True
    return False


async def stop(held: HeldRuns, grace_s: float, kill_wait_s: float, poll_s: float = POLL_S) -> HeldStop:
    """SIGTERM the runs' group leaders (all of a run's processes where none leads its group), wait up to `grace_s`
    for the runs to end, then SIGKILL what is left until it is gone or `kill_wait_s` passed. Looks at /proc run in
    a thread; ProcUnreadable from the first look (nothing signalled), later ones end the waits early."""
    left = await asyncio.to_thread(_live, held)
    seen = dict(left)
    for members in held.runs.values():
        alive = {p: t for p, t in members.items() if p in left}
        stats = {p: procs.stat(p) for p in alive}
        leaders = [p for p, s in stats.items() if s is not None and s.pgid == p] or list(alive)
        for pid in leaders:
            _signal(pid, alive[pid], signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while left and time.monotonic() < deadline:
        await asyncio.sleep(poll_s)
        left = await _look_again(held, left)
        seen.update(left)
    killed: set[int] = set()
    deadline = time.monotonic() + kill_wait_s
    while left and time.monotonic() < deadline:
        for pid, ticks in left.items():
            if _signal(pid, ticks, signal.SIGKILL):
                killed.add(pid)
        await asyncio.sleep(poll_s)
        left = await _look_again(held, left)
        seen.update(left)
    return HeldStop(pids=sorted(seen), killed=sorted(killed), survivors=sorted(left))


async def _look_again(held: HeldRuns, last: dict[int, int]) -> dict[int, int]:
    """A new look; /proc unlistable meanwhile: the last look's processes not proven gone (a stat that cannot be read
    is not "gone": only ESRCH is)."""
    try:
        return await asyncio.to_thread(_live, held)
    except procs.ProcUnreadable:
        return {p: t for p, t in last.items() if _maybe_alive(p, t)}


def _maybe_alive(pid: int, ticks: int) -> bool:
    return procs.seen_alive(pid, ticks) is not False  # an unreadable stat is not "gone"
