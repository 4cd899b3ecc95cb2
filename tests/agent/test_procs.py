"""Who belongs to a run, read from /proc: the token only counts for processes started since the run's leader."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from support.waits import wait_for

from lynxtop.agent.serving import procs


def _sleeper(token: str) -> subprocess.Popen:
    env = dict(os.environ, **{procs.RUN_TOKEN_ENV: token})
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env, start_new_session=True)


def test_a_token_is_looked_for_only_in_processes_started_since_the_leader():
    token = f"test-{os.getpid()}-{time.monotonic_ns()}"
    early = _sleeper(token)  # escaped the group (own session) and carries the token
    try:
        # the child has exec'd with its environment (the token): until then /proc shows the parent's
        wait_for(lambda: early.pid in procs.run_processes(token, None, ()), 10, what="the sleeper's token seen")
        early_ticks = procs.stat(early.pid).start_ticks
        assert early.pid in procs.run_processes(token, None, (), since_ticks=early_ticks)
        assert early.pid in procs.run_processes(token, None, ())  # no start given: everything is looked at
        # a leader that started after it: a process older than its run cannot carry the run's token
        assert early.pid not in procs.run_processes(token, None, (), since_ticks=early_ticks + 1)
    finally:
        early.kill()
        early.wait()


def _stat_of_by_str(pid: int, data: bytes) -> procs.ProcStat | None:
    """The parse stat_of replaced (decode it all, split every field): what it says stat_of must still say."""
    raw = data.decode("utf-8", "replace")
    lpar, rpar = raw.find("("), raw.rfind(")")
    if lpar < 0 or rpar < 0:
        return None
    rest = raw[rpar + 2:].split()
    try:
        return procs.ProcStat(pid=pid, comm=raw[lpar + 1:rpar], state=rest[0], ppid=int(rest[1]),
                              pgid=int(rest[2]), start_ticks=int(rest[19]))
    except (IndexError, ValueError):
        return None


_LINE = b"4242 (%s) S 1 4242 4242 0 -1 4194560 1 0 0 0 125 37 0 0 20 0 3 0 987654 1000 2500 18446744073709551615 1"


def test_stat_parses_say_what_the_full_parse_says():
    """stat_of (bytes, split up to start time), stat_usage_of (one split for both) and usage_fields (a tuple)
    give what the full str parse and usage_of give: for every process here and for odd comms (spaces,
    parentheses, bytes that are not UTF-8) and truncated or broken lines."""
    samples = [(pid, procs._read_stat(pid)) for pid in procs.all_pids()]
    samples = [(pid, raw) for pid, raw in samples if raw]
    assert len(samples) > 3
    for comm in (b"a b", b"x) (y", b"(", b"))", b"\xff\xfe", b"caf\xc3\xa9", b""):
        samples.append((4242, _LINE % comm))
    line = _LINE % b"ok"
    samples += [(1, line[:40]), (1, line.replace(b")", b"]")), (1, line.replace(b"(", b"[")), (1, b""),
                (1, line.replace(b" 987654 ", b" x ")), (1, line.replace(b" 125 ", b" ? ")), (1, line[:-8])]
    for pid, raw in samples:
        expected = _stat_of_by_str(pid, raw)
        assert procs.stat_of(pid, raw) == expected, raw
        u = procs.usage_of(raw)
        s, u2 = procs.stat_usage_of(pid, raw)
        assert s == expected, raw
        assert u2 == (u if s is not None else None), raw
        f = procs.usage_fields(raw)
        assert (f is None) == (u is None), raw
        if u is not None:
            assert (f[0], f[1].decode(), f[2], f[3]) == (u.start_ticks, u.state, u.cpu_s, u.rss_bytes)
    u = procs.usage_of(_LINE % b"a b")
    assert u == procs.ProcUsage(start_ticks=987654, state="S", cpu_s=162 / procs._CLK_TCK,
                                rss_bytes=2500 * procs._PAGE)


def test_read_many_reads_as_read_does():
    """StatFiles.read_many (the host's tick, one lock) answers each pid as read(pid) would: a kept descriptor's
    process reaped is None and its descriptor let go, a pid not kept yet is opened, a pid that is none is None."""
    gone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    files = procs.StatFiles()
    try:
        assert files.read(gone.pid) is not None and len(files) == 1
        gone.kill()
        gone.wait()
        got = files.read_many([gone.pid, os.getpid(), 2 ** 22 + 7])
        assert got[0] is None and got[2] is None
        assert got[1] is not None and procs.stat_of(os.getpid(), got[1]).pid == os.getpid()
        assert set(files._fds) == {os.getpid()}  # the reaped one's descriptor closed, this process' kept
    finally:
        gone.kill()
        gone.wait()
        files.close()
