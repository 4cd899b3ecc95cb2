"""A stop while the agent is out of file descriptors: /proc cannot be listed, which says nothing about whether the
run's processes live. Once, `all_pids()` answered [] and the stop read the run as gone at its first look: no grace,
no SIGKILL, "stopped", serving.json removed, the pidfd closed, while a server ignoring SIGTERM and its engine ran
on unsupervised.

Real exhaustion: the soft RLIMIT_NOFILE of the test process is lowered to just above its highest open descriptor and
every free number below it taken (EMFILE for any open, /proc reads included), then given back. `keep_taking` also
takes every number freed meanwhile (the run's pidfd closed at its exit), so /proc stays unreadable until released.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from lynxtop.agent.serving import procs

pytestmark = pytest.mark.timeout(120)


@contextlib.contextmanager
def no_descriptors(keep_taking: bool = False) -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    top = max(int(n) for n in os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (top + 1, hard))
    held: list[int] = []
    done = threading.Event()

    def take() -> None:
        while True:
            try:
                held.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            except OSError:
                return

    def keep() -> None:
        while not done.wait(0.002):
            take()

    take()
    taker = threading.Thread(target=keep, daemon=True) if keep_taking else None
    if taker is not None:
        taker.start()
    try:
        yield
    finally:
        done.set()
        if taker is not None:
            taker.join()
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def exists(pid: int) -> bool:
    """Whether any process has `pid` (no descriptor needed: readable while the test holds them all)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def test_an_unlistable_proc_is_unknown_not_empty():
    """`all_pids` (and the run's look built on it) raise rather than answer "no process"."""
    assert os.getpid() in procs.all_pids()
    with no_descriptors(), pytest.raises(procs.ProcUnreadable, match="out of file descriptors"):
        procs.all_pids()
    with no_descriptors(), pytest.raises(procs.ProcUnreadable):
        procs.run_processes(None, os.getpgid(0), [os.getpid()])
    assert os.getpid() in procs.all_pids()  # listed again once descriptors are free


async def test_a_stop_out_of_descriptors_does_not_call_a_live_server_stopped(make_sup, h, monkeypatch):
    """The auditor's case: a server that needs its SIGKILL (ignores SIGTERM), stopped with no free descriptor."""
    monkeypatch.setenv("STANDIN_MODE", "ignore_term")
    sup = make_sup()
    await sup.start("alpha", by="test")
    await h.wait_for(lambda: sup.state == "ready", 30, what="ready")
    leader = sup.proc.pid
    members = sup.proc.members()
    assert len(members) >= 2, members
    try:
        with no_descriptors():
            await sup.stop(by="test")
            with contextlib.suppress(AssertionError):
                await h.wait_for(lambda: sup.state == "stopped", 20, what="stopped")
        state, reason = sup.state, sup.reason
        alive = [p for p in members if procs.alive(p)]
        assert not (state == "stopped" and alive), (
            f"serving reads {state!r} ({reason}) while the run's processes {alive} (leader {leader}) live on: "
            f"unsupervised, serving.json removed={not sup.state_path.exists()}")
    finally:
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await sup.shutdown(stop_serving=True)


async def test_a_stop_that_cannot_see_waits_kills_and_keeps_the_record(make_sup, h, monkeypatch):
    """/proc unreadable for the whole stop: the grace is waited, the group SIGKILLed through what needs no
    descriptor (pidfd, killpg while the leader is ours), and the stop stays "stopping" with serving.json kept
    until a look can confirm; then it ends as stopped."""
    monkeypatch.setenv("STANDIN_MODE", "ignore_term")
    sup = make_sup()
    await sup.start("alpha", by="test")
    await h.wait_for(lambda: sup.state == "ready", 30, what="ready")
    members = sup.proc.members()
    assert len(members) >= 2, members
    try:
        t0 = time.monotonic()
        with no_descriptors(keep_taking=True):
            await sup.stop(by="test")
            # grace 3 s, then SIGKILL: both processes end even though nothing can be read
            await h.wait_for(lambda: not any(exists(p) for p in members), 30, what="the run SIGKILLed")
            killed_after = time.monotonic() - t0
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                assert sup.state == "stopping", (sup.state, sup.reason)
                await asyncio.sleep(0.1)
            assert sup.state_path.exists(), "serving.json removed while the stop could not confirm the run gone"
        assert killed_after >= 2.5, f"the run was killed {killed_after:.1f} s into the stop: no grace waited"
        await h.wait_for(lambda: sup.state == "stopped", 30, what="stopped once /proc can be read")
        assert not sup.state_path.exists()
    finally:
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await sup.shutdown(stop_serving=True)
