"""The agent when the operating system refuses it a process, a thread or a descriptor around a run's spawn.

Real refusals where the kernel gives them deterministically: a cgroup-v1 `pids.max` that the test process is moved
into makes fork and clone fail with EAGAIN (the kernel's answer at the unit's TasksMax; vLLM runs in the agent's
unit, so its thread bursts count against the same limit), and a thread pool with no idle worker then cannot start
one (RuntimeError: can't start new thread). The pidfd refusal after a successful fork is a race in the field
(another thread takes the last descriptor between the fork and pidfd_open): it is injected at the os.pidfd_open
boundary, the only stand-in here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import os
import shutil
import signal
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.agent_config import agent_toml

from lynxtop.agent.cluster.raynode import RayNode
from lynxtop.agent.serving import procs
from lynxtop.contract.config import parse_config
from lynxtop.contract.events import EventKind
from lynxtop.contract.status import RayState

pytestmark = pytest.mark.timeout(120)

PIDS = Path("/sys/fs/cgroup/pids")
ALIVE = ("starting", "ready", "crash-loop", "backoff")  # a restart policy still in force

wait_for = None


@pytest.fixture(autouse=True)
def _helpers(h):
    global wait_for
    wait_for = h.wait_for


@contextlib.contextmanager
def pids_cgroup() -> Iterator[Path]:
    """This test process in a pids cgroup of its own (limit off until `freeze`); moved back and removed after.
    Processes it started before stay outside: their exit frees nothing in the limit."""
    if not (PIDS / "cgroup.procs").exists() or os.geteuid() != 0:
        pytest.skip("needs a writable cgroup-v1 pids hierarchy (root)")
    line = next((ln for ln in Path("/proc/self/cgroup").read_text().splitlines() if ":pids:" in ln), None)
    if line is None:
        pytest.skip("this process is in no cgroup-v1 pids hierarchy")
    home = PIDS / line.split(":", 2)[2].lstrip("/")
    cg = PIDS / f"lynxtop_s20_{os.getpid()}"
    cg.mkdir()
    try:
        (cg / "cgroup.procs").write_text(str(os.getpid()))
        yield cg
    finally:
        (cg / "pids.max").write_text("max")
        for pid in (cg / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (home / "cgroup.procs").write_text(pid)
        with contextlib.suppress(OSError):
            cg.rmdir()


def freeze(cg: Path) -> None:
    """No new process or thread in the test process from now (fork and clone fail with EAGAIN)."""
    (cg / "pids.max").write_text((cg / "pids.current").read_text().strip())


def thaw(cg: Path) -> None:
    (cg / "pids.max").write_text("max")


def no_idle_threads() -> None:
    """The loop's next hand-off to a thread needs a new one (which `freeze` refuses)."""
    asyncio.get_running_loop().set_default_executor(concurrent.futures.ThreadPoolExecutor())


async def idle_threads(n: int = 8) -> None:
    """`n` idle workers: hand-offs made one at a time need no new thread while frozen."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=n)
    loop = asyncio.get_running_loop()
    loop.set_default_executor(pool)
    gate = asyncio.Event()
    started: list[int] = []

    def hold() -> None:
        started.append(1)
        while not gate.is_set():
            os.sched_yield()

    futs = [loop.run_in_executor(None, hold) for _ in range(n)]
    await wait_for(lambda: len(started) == n, 20, what="the pool's threads")
    gate.set()
    await asyncio.gather(*futs)


def kill_run(sup) -> None:
    if sup.proc is not None:
        for pid in procs.run_processes(sup.proc.record.token, sup.proc.record.pgid, known=sup.proc.known):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# ------------------------------------------------------------------------------------- a pidfd refused after the fork

def refuse_first_pidfd(monkeypatch) -> list[int]:
    real = os.pidfd_open
    refused: list[int] = []

    def pidfd_open(pid: int, flags: int = 0) -> int:
        if not refused:
            refused.append(pid)
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real(pid, flags)

    monkeypatch.setattr(os, "pidfd_open", pidfd_open)
    return refused


async def test_a_pidfd_refused_after_the_fork_leaves_no_unsupervised_server(make_sup, monkeypatch):
    """Popen succeeded, then os.pidfd_open failed (EMFILE): the start once said "could not start" and went STOPPED
    while the server it forked ran on, with no record, no run and no stop reaching it."""
    sup = make_sup()
    refused = refuse_first_pidfd(monkeypatch)
    await sup.start("alpha", by="test")
    await wait_for(lambda: refused and sup.action is None, 30, what="the start to end")
    forked = refused[0]
    try:
        alive_unknown = procs.alive(forked) and (sup.proc is None or sup.proc.pid != forked)
        assert not alive_unknown, (
            f"serving is {sup.state!r} ({sup.reason}) while the server it forked, pid {forked}, runs unsupervised "
            f"(run {sup.run_id}); `lynxtop stop` cannot reach it")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(forked, signal.SIGKILL)


async def test_a_server_watched_without_a_pidfd_has_its_crash_seen(make_sup, monkeypatch):
    """No pidfd on the forked server: it is watched all the same (its exit polled in /proc), so it becomes ready,
    and its crash is seen and backed off, as with a pidfd."""
    sup = make_sup()
    refused = refuse_first_pidfd(monkeypatch)
    await sup.start("alpha", by="test")
    await wait_for(lambda: sup.state == "ready", 30, what="ready without a pidfd")
    try:
        assert refused and sup.proc.pid == refused[0] and sup.proc.pidfd_error, sup.proc.pidfd_error
        first = sup.proc.pid
        os.kill(first, signal.SIGKILL)
        await wait_for(lambda: sup.proc is not None and sup.proc.pid != first or sup.state in ("backoff", "crash-loop"),
                       30, what="the crash to be seen")
        assert sup.crashes == 1, (sup.state, sup.reason)
    finally:
        kill_run(sup)
        with contextlib.suppress(ProcessLookupError, IndexError):
            os.killpg(refused[0], signal.SIGKILL)  # the old code left it unrecorded
        await sup.shutdown(stop_serving=True)


# ------------------------------------------------------------------------------------- the retry's fork refused

async def test_a_retry_whose_fork_is_refused_eagain_keeps_retrying(make_sup, store):
    """A crash, then the retry's fork meets EAGAIN (a pids limit, a moment): serving went STOPPED for good, the
    restart policy abandoned; once processes could be made again nothing retried."""
    sup = make_sup()
    await sup.start("alpha", by="test")
    await wait_for(lambda: sup.state == "ready", 30, what="ready")
    with pids_cgroup() as cg:
        await idle_threads()  # the refusal meets the fork itself, not a thread
        freeze(cg)
        try:
            os.kill(sup.proc.pid, signal.SIGKILL)  # a crash while serving: backoff, then a retry
            await wait_for(lambda: sup.state == "stopped" or "could not" in sup.reason, 30, what="the retry's spawn")
        finally:
            thaw(cg)
        seen = (sup.state, sup.reason)
        with contextlib.suppress(AssertionError):
            await wait_for(lambda: sup.state in ALIVE, 10, what="retry")
        try:
            assert sup.state in ALIVE, (
                f"after the crash the retry's fork was refused ({seen}); 10 s after the refusal passed serving is "
                f"still {sup.state!r} ({sup.reason}) and nothing retries")
            assert "TasksMax" in seen[1] and "pids cgroup" in seen[1], seen  # the operator is told which limit
            await wait_for(lambda: sup.state == "ready", 30, what="the retry to become ready")
        finally:
            kill_run(sup)
            await sup.shutdown(stop_serving=True)


async def test_a_retry_refused_a_thread_keeps_retrying(make_sup, store):
    """A crash while no thread can start: the retry's hand-off to a thread raised RuntimeError and serving stayed
    "backoff" with a retry time long passed, nothing retrying. Now it is a failure backed off, and the retry after
    the limit passes makes the run ready."""
    sup = make_sup()
    await sup.start("alpha", by="test")
    await wait_for(lambda: sup.state == "ready", 30, what="ready")
    with pids_cgroup() as cg:
        no_idle_threads()
        freeze(cg)
        try:
            os.kill(sup.proc.pid, signal.SIGKILL)
            with contextlib.suppress(AssertionError):  # the old code said nothing: its retry's task just died
                await wait_for(lambda: "could not start" in sup.reason or sup.state == "crash-loop", 15,
                               what="a retry refused its thread")
        finally:
            thaw(cg)
        seen = (sup.state, sup.reason)
        with contextlib.suppress(AssertionError):
            await wait_for(lambda: sup.state in ("starting", "ready", "crash-loop"), 20, what="the retry")
        try:
            assert sup.state in ("starting", "ready", "crash-loop"), (
                f"a retry refused a thread ({seen}); once threads start again serving is still {sup.state!r} "
                f"({sup.reason}), its next retry due {sup._retry.next_retry_ms}")
        finally:
            kill_run(sup)
            await sup.shutdown(stop_serving=True)


async def test_an_operators_start_refused_eagain_is_stopped_and_names_the_limit(make_sup, store):
    """An operator's start whose fork is refused stays a clean "stopped" + serving.start_failed (they see it and
    act), and the reason names the limit: a process/thread limit (TasksMax, the pids cgroup)."""
    sup = make_sup()
    with pids_cgroup() as cg:
        await idle_threads()
        freeze(cg)
        try:
            await sup.start("alpha", by="test")
            await wait_for(lambda: sup.action is None, 30, what="the start to end")
        finally:
            thaw(cg)
    try:
        assert sup.state == "stopped" and sup.proc is None, (sup.state, sup.reason)
        assert "Resource temporarily unavailable" in sup.reason and "TasksMax" in sup.reason, sup.reason
        await asyncio.sleep(1.5)  # backoff_initial_s is 0.2: an operator's start is not retried
        assert sup.state == "stopped" and sup.proc is None, (sup.state, sup.reason)
    finally:
        kill_run(sup)
        await sup.shutdown(stop_serving=True)


# ------------------------------------------------------------------------------------- a thread refused during a load

async def test_a_loading_run_is_still_watched_after_a_thread_could_not_start(make_sup, store, monkeypatch):
    """While a run loads, the watch hands `proc.members` to a worker thread each second; a thread that could not
    start (RuntimeError: can't start new thread) killed the run's lifecycle task: the run stayed "starting" for
    ever, its readiness never seen, its readiness timeout never fired, a crash never noticed."""
    monkeypatch.setenv("STANDIN_STARTUP_S", "4")
    sup = make_sup()
    await sup.start("alpha", by="test")
    await wait_for(lambda: sup.state == "starting" and sup.proc is not None, 20, what="loading")
    with pids_cgroup() as cg:
        no_idle_threads()
        freeze(cg)
        try:
            await asyncio.sleep(2.5)  # a few looks of the loading run (one a second)
        finally:
            thaw(cg)
        task = sup.runs._task
        died = task is not None and task.done() and not task.cancelled() and task.exception() is not None
        with contextlib.suppress(AssertionError):
            await wait_for(lambda: sup.state == "ready", 20, what="ready")
        try:
            assert sup.state == "ready" and not died, (
                f"serving is {sup.state!r} ({sup.reason}); the run's lifecycle task "
                f"{'died of ' + repr(task.exception()) if died else 'is alive'}; the server (pid {sup.proc.pid}) "
                "answers /health but is no longer watched")
        finally:
            kill_run(sup)
            await sup.shutdown(stop_serving=True)


async def test_a_load_that_crashes_while_no_thread_can_start_is_backed_off(make_sup, store, monkeypatch):
    """A load dies while no thread can start: the watch's look and the crash's free-space check (crash_cause) run
    inline, so the crash is seen, counted and backed off instead of a dead task holding "starting"."""
    monkeypatch.setenv("STANDIN_STARTUP_S", "30")
    sup = make_sup()
    await sup.start("alpha", by="test")
    await wait_for(lambda: sup.state == "starting" and sup.proc is not None, 20, what="loading")
    first = sup.proc.pid
    with pids_cgroup() as cg:
        no_idle_threads()
        freeze(cg)
        try:
            os.kill(first, signal.SIGKILL)
            await wait_for(lambda: sup.crashes >= 1 and sup.state in ("backoff", "crash-loop"), 30,
                           what="the crash to be handled")
        finally:
            thaw(cg)
        try:
            assert "before becoming ready" in (sup.runs.run.crash_reason or ""), sup.runs.run.crash_reason
        finally:
            kill_run(sup)
            await sup.shutdown(stop_serving=True)


# ------------------------------------------------------------------------------------- Ray's retry

FAKE_RAY = textwrap.dedent("""\
    #!{python}
    # a stand-in for `ray start --block`: says it started, then blocks; SIGTERM ends it cleanly
    import signal, sys, time
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    print("Ray runtime started.", flush=True)
    while True:
        time.sleep(1)
""")


async def test_a_ray_retry_whose_fork_is_refused_keeps_retrying(tmp_path, monkeypatch):
    """Ray exits, then its retry's fork meets EAGAIN: Ray went "stopped" for good on this node. Now the refusal is
    a failure backed off, and Ray runs again once processes can be made."""
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    short = Path(tempfile.mkdtemp(prefix="lx", dir="/tmp"))  # Ray's socket paths need a short directory
    exe = tmp_path / "bin" / "ray"
    exe.parent.mkdir()
    exe.write_text(FAKE_RAY.format(python=sys.executable))
    exe.chmod(0o755)
    text = agent_toml(short / "lynxtop.db", short / "agent.sock", role="worker", backoff_initial_s=0.2,
                      backoff_max_s=1, crash_loop_failures=20, crash_loop_window_s=60)
    cfg = parse_config(text + f'\n[ray]\nexecutable = "{exe}"\nhead_address = "10.0.0.1:6379"\n')
    events: list = []
    (short / "state").mkdir()
    rn = RayNode(cfg, events.append, state_dir=short / "state")
    try:
        await rn.boot()
        await wait_for(lambda: rn.state == RayState.RUNNING, 20, what="Ray running")
        with pids_cgroup() as cg:
            await idle_threads()
            freeze(cg)
            try:
                rn.proc.signal_group(signal.SIGKILL)
                await wait_for(lambda: any(e.kind == EventKind.RAY_EXITED and "could not start" in e.message
                                           for e in events), 30, what="the retry's spawn refused")
            finally:
                thaw(cg)
            seen = (rn.state, rn.reason)
            with contextlib.suppress(AssertionError):
                await wait_for(lambda: rn.state == RayState.RUNNING, 20, what="Ray running again")
            assert rn.state == RayState.RUNNING, (
                f"Ray's retry was refused a process ({seen}); once processes can be made it is still {rn.state} "
                f"({rn.reason})")
    finally:
        if rn.proc is not None and not rn.proc.exited:
            rn.proc.signal_group(signal.SIGKILL)
        await rn.shutdown(stop_ray=True)
        shutil.rmtree(short, ignore_errors=True)
