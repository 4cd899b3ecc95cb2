"""The kept process table against real processes: the same answers as a fresh look, for a fraction of the reads."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from lynxtop.agent.serving import procs
from lynxtop.agent.serving.proctable import ProcTable

# a leader that starts a child, which starts a grandchild; all sleep
_TREE = """
import subprocess, sys, time
code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "time.sleep(60)")
subprocess.Popen([sys.executable, "-c", code])
time.sleep(60)
"""


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _wait_for(pred, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture
def tree():
    token = f"table-{os.getpid()}-{time.monotonic_ns()}"
    env = dict(os.environ, **{procs.RUN_TOKEN_ENV: token})
    leader = subprocess.Popen([sys.executable, "-c", _TREE], env=env, start_new_session=True)
    _wait_for(lambda: len(psutil.Process(leader.pid).children(recursive=True)) == 2, "the stand-in tree")
    yield leader, token
    with contextlib.suppress(ProcessLookupError):
        os.killpg(leader.pid, signal.SIGKILL)
    leader.wait()


def _psutil_tree(pid: int) -> set[int]:
    root = psutil.Process(pid)
    return {pid, *(p.pid for p in root.children(recursive=True))}


def test_tree_and_members_equal_a_fresh_look(tree):
    leader, token = tree
    table = ProcTable()
    assert {s.pid for s in table.tree(leader.pid)} == _psutil_tree(leader.pid)
    assert table.tree(leader.pid)[0].pid == leader.pid  # root first
    start = procs.stat(leader.pid).start_ticks
    assert sorted(table.members(token, leader.pid, [leader.pid], start)) == \
        procs.run_processes(token, leader.pid, [leader.pid], start)
    assert table.tree(2 ** 22 + 12345) == []  # no such process


def test_a_look_reads_only_the_pids_it_has_not_seen(tree):
    leader, _ = tree
    clock = Clock()
    table = ProcTable(full_every_s=60.0, clock=clock)
    old = table.look()
    first = table.reads
    assert first >= len(old) > 10  # the first look reads every process
    clock.t += 5
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        seen = table.look()
        assert child.pid in seen and seen[child.pid].ppid == os.getpid()
        newcomers = len(set(seen) - set(old))
        # the new pids (ours and whatever else started meanwhile; a few may have gone before being read)
        assert newcomers <= table.reads - first <= newcomers + 5 < len(old)
        clock.t += 0.5
        before = table.reads
        table.look()
        assert table.reads == before  # a look younger than reuse_s is answered again
        clock.t += 60
        again = table.look()
        assert table.reads - before >= len(again)  # the full look reads everything again
    finally:
        child.kill()
        child.wait()
    clock.t += 5
    assert child.pid not in table.look()


def test_a_new_member_is_found_at_the_next_look(tree):
    leader, _ = tree
    clock = Clock()
    table = ProcTable(clock=clock)
    before = {s.pid for s in table.tree(leader.pid)}
    grandchild = max(before)
    extra = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        clock.t += 0.5
        assert extra.pid not in table.look()  # reused: the look is younger than reuse_s
        clock.t += 5
        mine = {s.pid for s in table.tree(os.getpid())}
        assert extra.pid in mine and leader.pid in mine  # a new session does not change the parent
    finally:
        extra.kill()
        extra.wait()
    assert grandchild in {s.pid for s in table.tree(leader.pid)}


def test_a_zombie_or_a_stale_entry_is_never_named(tree):
    leader, token = tree
    clock = Clock()
    table = ProcTable(clock=clock)
    members = {s.pid for s in table.tree(leader.pid)}
    child = next(p for p in psutil.Process(leader.pid).children())
    # the child is killed but its parent (the leader, asleep) does not reap it: a zombie holds no memory
    os.kill(child.pid, signal.SIGKILL)
    _wait_for(lambda: procs.stat(child.pid).state == "Z", "the zombie")
    got = {s.pid for s in table.tree(leader.pid)}  # the same look: the kept entry still says "sleeping"
    assert child.pid not in got and leader.pid in got and got < members
    start = procs.stat(leader.pid).start_ticks
    assert child.pid not in table.members(token, leader.pid, [leader.pid], start)
    # a kept entry that no longer matches the process (a pid reused between looks) is not trusted
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        clock.t += 5
        table.look()
        st = procs.stat(stranger.pid)
        table._stats[stranger.pid] = dataclasses.replace(st, ppid=leader.pid, pgid=leader.pid,
                                                         start_ticks=st.start_ticks - 1)
        assert stranger.pid not in {s.pid for s in table.tree(leader.pid)}
        table._stats[stranger.pid] = dataclasses.replace(st, pgid=leader.pid, start_ticks=st.start_ticks - 1)
        assert stranger.pid not in table.members(token, leader.pid, [leader.pid], start)
    finally:
        stranger.kill()
        stranger.wait()


class _StatOpens:
    """Counts opens of /proc/<pid>/stat (fresh reads) made through os.open or open()."""

    def __init__(self, monkeypatch) -> None:
        self.paths: list[str] = []
        real = os.open

        def counted(path, *a, **kw):
            if isinstance(path, str) and path.startswith("/proc/") and path.endswith("/stat"):
                self.paths.append(path)
            return real(path, *a, **kw)

        monkeypatch.setattr(os, "open", counted)


def test_fresh_reads_of_a_known_process_open_nothing(tree, monkeypatch):
    """The fresh reads of the tree and of the run's members go through kept descriptors: after the first look,
    a walk at the next look reads each member again (the answer is as fresh) without opening its file."""
    leader, token = tree
    clock = Clock()
    table = ProcTable(clock=clock)
    start = procs.stat(leader.pid).start_ticks
    first = {s.pid for s in table.tree(leader.pid)}
    assert set(table.members(token, leader.pid, [leader.pid], start)) == first
    opens = _StatOpens(monkeypatch)
    clock.t += 5
    assert {s.pid for s in table.tree(leader.pid)} == first
    assert set(table.members(token, leader.pid, [leader.pid], start)) == first
    assert opens.paths == []


def test_a_kept_descriptor_of_a_reaped_process_is_read_again_by_path(tree):
    """A pid whose kept descriptor's process was reaped (the pid perhaps reused) is read through a fresh open,
    as procs.stat reads it: the table names the process that holds the pid now, never the one that left."""
    leader, _ = tree
    table = ProcTable(clock=Clock())
    members = {s.pid for s in table.tree(leader.pid)}
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    fd = os.open(f"/proc/{gone.pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    gone.wait()  # reaped: its descriptor now fails (ESRCH)
    child = next(p for p in members if p != leader.pid and psutil.Process(p).ppid() == leader.pid)
    table.files.drop([child])
    table.files._fds[child] = fd  # the child's pid kept on a descriptor of another, reaped process
    assert {s.pid for s in table.tree(leader.pid)} == members
    assert table.files._fds[child] != fd  # dropped and opened afresh


def test_a_walk_gives_the_usage_of_its_own_reads(tree):
    """tree(root, usage) fills in each named member's CPU time and RSS from the read that confirmed it: the same
    process (start ticks), nobody it did not name."""
    leader, _ = tree
    table = ProcTable(clock=Clock())
    usage: dict[int, procs.ProcUsage] = {}
    named = table.tree(leader.pid, usage)
    assert set(usage) == {s.pid for s in named}
    for s in named:
        assert usage[s.pid].start_ticks == s.start_ticks and usage[s.pid].rss_bytes > 0
    assert table.tree(2 ** 22 + 12345, usage) == [] and set(usage) == {s.pid for s in named}


def test_a_table_that_goes_closes_the_descriptors_it_kept():
    """A node has no close for its process table: the /proc/<pid>/stat descriptors it kept go with it."""
    import gc

    table = ProcTable()
    assert table.tree(os.getpid())  # read fresh: kept open
    def target(fd: int) -> str | None:
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return None

    kept = {fd: target(fd) for fd in table.files._fds.values()}
    assert kept and all(t is not None and t.endswith("/stat") for t in kept.values())
    del table
    gc.collect()
    assert all(target(fd) != t for fd, t in kept.items())  # closed (a number reused names another file)


def test_a_walk_in_the_members_tick_takes_their_reads_once(tree, monkeypatch):
    """The node looks for the run's members just before the host row walks the tree (the same tick, the same
    listing): the walk takes that look's confirming reads instead of reading each process again, with the usage
    of those reads; once: the next walk reads every member afresh."""
    leader, token = tree
    table = ProcTable(clock=Clock())
    start = procs.stat(leader.pid).start_ticks
    named = set(table.members(token, leader.pid, [leader.pid], start))
    assert len(named) == 3
    reads: list[int] = []
    real = procs._pread
    monkeypatch.setattr(procs, "_pread", lambda fd: reads.append(fd) or real(fd))
    usage: dict[int, procs.ProcUsage] = {}
    assert {s.pid for s in table.tree(leader.pid, usage)} == named
    assert reads == []  # no second read of a process the members' look has just read
    assert set(usage) == named
    assert all(usage[p].start_ticks == procs.stat(p).start_ticks and usage[p].rss_bytes > 0 for p in named)
    assert {s.pid for s in table.tree(leader.pid)} == named and len(reads) == 3  # taken once


def test_a_walk_later_than_the_members_tick_reads_afresh(tree):
    """The members' reads serve only a walk within `share_s` of them: a walk later reads each process again, so
    a child killed since (a zombie its parent has not reaped) is not named, nor its subtree."""
    leader, token = tree
    clock = Clock()
    table = ProcTable(clock=clock)
    start = procs.stat(leader.pid).start_ticks
    named = set(table.members(token, leader.pid, [leader.pid], start))
    child = next(p for p in named if p != leader.pid and psutil.Process(p).ppid() == leader.pid)
    os.kill(child, signal.SIGKILL)
    _wait_for(lambda: procs.stat(child).state == "Z", "the zombie")
    clock.t += 2 * table.share_s  # still the same look (reuse_s), not the same tick
    assert {s.pid for s in table.tree(leader.pid)} == {leader.pid}


def _stranger(token: str) -> subprocess.Popen:
    """A process of the run found by its token alone: its own session, and not a child of any member."""
    env = dict(os.environ, **{procs.RUN_TOKEN_ENV: token})
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env, start_new_session=True)


def _empty_first(monkeypatch, pid: int, times: int) -> list[int]:
    """/proc/<pid>/environ reads empty `times` times (the instant of an exec), then as it is."""
    real, calls = procs.environ_raw, []

    def raw(p: int) -> bytes | None:
        if p == pid:
            calls.append(p)
            if len(calls) <= times:
                return b""
        return real(p)

    monkeypatch.setattr(procs, "environ_raw", raw)
    return calls


def test_an_empty_environ_read_is_not_kept_as_tokenless(tree, monkeypatch):
    """A process looked at while it execs reads empty: the table must look again, not call it tokenless for
    its whole life (it would never be sampled or stopped as the run's)."""
    leader, token = tree
    start = procs.stat(leader.pid).start_ticks
    stranger = _stranger(token)
    try:
        _wait_for(lambda: procs.environ_value(stranger.pid, procs.RUN_TOKEN_ENV) == token, "the stranger's exec")
        calls = _empty_first(monkeypatch, stranger.pid, 1)
        clock = Clock()
        table = ProcTable(clock=clock)
        assert stranger.pid not in table.members(token, leader.pid, [leader.pid], start)  # the empty read
        clock.t += 5
        assert stranger.pid in table.members(token, leader.pid, [leader.pid], start)
        clock.t += 5
        assert stranger.pid in table.members(token, leader.pid, [leader.pid], start)
        assert len(calls) == 2  # a read that said something is kept
    finally:
        stranger.kill()
        stranger.wait()


def test_a_fresh_look_reads_an_empty_environ_again(tree, monkeypatch):
    leader, token = tree
    stranger = _stranger(token)
    try:
        _wait_for(lambda: procs.environ_value(stranger.pid, procs.RUN_TOKEN_ENV) == token, "the stranger's exec")
        _empty_first(monkeypatch, stranger.pid, 2)
        assert stranger.pid in procs.run_processes(token, None, ())
    finally:
        stranger.kill()
        stranger.wait()


def test_a_kernel_threads_empty_environ_is_read_once(monkeypatch):
    calls = []
    monkeypatch.setattr(procs, "environ_raw", lambda pid: calls.append(pid) or b"")
    kthread = procs.ProcStat(pid=1234, comm="kworker/0:1", state="I", ppid=2, pgid=0, start_ticks=1)
    assert procs.settled_environ_value(kthread, procs.RUN_TOKEN_ENV) is None
    assert calls == [1234]
    user = dataclasses.replace(kthread, ppid=1)
    calls.clear()
    assert procs.settled_environ_value(user, procs.RUN_TOKEN_ENV) is None
    assert calls == [1234] * 4  # one read and three more, 5 ms apart


def test_a_stray_in_the_run_log_directory_is_found_mid_exec(tmp_path, monkeypatch):
    """At agent start, a server nobody can adopt holds autostart: one caught in an exec must still count."""
    env = dict(os.environ, **{procs.RUN_TOKEN_ENV: "some-earlier-run"})
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env, cwd=tmp_path,
                             start_new_session=True)
    try:
        _wait_for(lambda: procs.environ_value(stray.pid, procs.RUN_TOKEN_ENV), "the stray's exec")
        _empty_first(monkeypatch, stray.pid, 2)
        assert procs.runs_started_in(os.path.realpath(tmp_path)) == [stray.pid]
    finally:
        stray.kill()
        stray.wait()


def test_empty_environ_reads_are_read_again_together(tree, monkeypatch):
    """A fresh look that meets several processes reading empty waits once for all of them (3 x 5 ms at most),
    not 15 ms each: the look of a dead run's leftovers runs on the event loop, over every process of the node."""
    leader, token = tree
    others = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(4)]
    try:
        pids = {p.pid for p in others}
        real, reads, sleeps = procs.environ_raw, [], []
        monkeypatch.setattr(procs, "environ_raw", lambda pid: (reads.append(pid), b"")[1] if pid in pids
                            else real(pid))
        monkeypatch.setattr(procs.time, "sleep", sleeps.append)
        found = procs.run_processes(token, leader.pid, [leader.pid])
        assert leader.pid in found and not pids & set(found)
        assert sleeps == [procs.SETTLE_S] * procs.SETTLE_TRIES
        assert sorted(reads) == sorted(list(pids) * (1 + procs.SETTLE_TRIES))
    finally:
        for p in others:
            p.kill()
            p.wait()
