"""HostSampler against real processes: a stand-in vLLM tree whose process titles are set the way vLLM's are.

Titles: the engine is exec'd with argv[0] = "VLLM::EngineCore" (what setproctitle leaves in /proc/PID/cmdline),
the worker renames itself with prctl(PR_SET_NAME) (the 15-character comm that `ps -o comm` shows), so both
ways of reading a title are exercised without installing setproctitle.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from support.waits import wait_for

from lynxtop.agent import host as host_mod
from lynxtop.agent.host import HOST_COLUMNS, HostSampler, role_of
from lynxtop.agent.serving import procs
from lynxtop.agent.serving.proctable import ProcTable

ENGINE = "import time\nend = time.time() + 60\nwhile time.time() < end: pass\n"  # burns one core (killed at teardown)
WORKER = (
    "import ctypes, time\n"
    "ctypes.CDLL(None).prctl(15, b'VLLM::Worker_TP0', 0, 0, 0)\n"  # PR_SET_NAME
    "blob = bytearray(64 * 1024 * 1024)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)
API = (
    "import subprocess, sys, time\n"
    f"e = subprocess.Popen(['VLLM::EngineCore', '-c', {ENGINE!r}], executable=sys.executable)\n"
    f"w = subprocess.Popen([sys.executable, '-c', {WORKER!r}])\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def vllm_tree():
    p = subprocess.Popen([sys.executable, "-c", API], start_new_session=True)
    try:
        deadline = time.monotonic() + 30  # three Pythons start slowly on a loaded machine
        while time.monotonic() < deadline:
            kids = psutil.Process(p.pid).children(recursive=True)
            workers = [k for k in kids if k.name().startswith("VLLM::Worker")]
            # the worker is titled before it fills its buffer: the tests read its RSS, so wait for that too
            if len(kids) == 2 and workers and workers[0].memory_info().rss > 60 * 1024 * 1024:
                break
            time.sleep(0.05)
        else:
            pytest.fail("stand-in vLLM tree did not come up")
        yield p
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # the group this fixture created, and nothing else
        p.wait(timeout=10)


def test_roles_by_title():
    assert role_of("VLLM::EngineCore") == "engine"
    assert role_of("VLLM::EngineCor") == "engine"  # the kernel's 15-character comm
    assert role_of("VLLM::Worker_TP3_EP3") == "workers"
    assert role_of("vllm") == "api" and role_of("python3") == "api"


def test_first_call_has_no_rates_then_rates(tmp_path):
    # the database does not exist yet; refresh_s=0: every call reads (by default a row 0.1 s after is a copy)
    h = HostSampler(tmp_path / "not-yet" / "lynxtop.db", refresh_s=0.0)
    a = h.sample(None)
    assert set(a) == set(HOST_COLUMNS)
    assert a["cpu_pct"] is None and a["net_rx_bytes_per_s"] is None and a["cpu_per_core_pct"] is None
    assert a["mem_total_bytes"] > a["mem_available_bytes"] > 0 and a["disk_free_bytes"] > 0
    assert a["mem_total_bytes"] == psutil.virtual_memory().total  # one /proc/meminfo read, same figures
    assert a["swap_total_bytes"] == psutil.swap_memory().total
    assert a["vllm_procs"] is None and a["vllm_cpu_pct"] is None  # no vLLM: N/A, not 0
    time.sleep(0.1)  # rates are over the time between two readings: a span must pass
    b = h.sample(None)
    per_core = json.loads(b["cpu_per_core_pct"])
    assert len(per_core) == psutil.cpu_count() and all(0 <= x <= 100 for x in per_core)
    assert 0 <= b["cpu_pct"] <= 100 and b["net_rx_bytes_per_s"] >= 0


def test_vllm_tree_cpu_and_rss_by_role(tmp_path, vllm_tree):
    h = HostSampler(tmp_path / "db.sqlite")
    pids = h.vllm_pids(vllm_tree.pid)
    assert len(pids) == 3 and vllm_tree.pid in pids
    first = h.sample(vllm_tree.pid)
    assert first["vllm_procs"] == 3 and first["vllm_engine_cpu_pct"] is None  # no previous CPU reading
    assert h.tree_pids == pids  # what the GPU sampler attributes memory to: the members this row read
    time.sleep(1.0)  # CPU % is over the span between two readings: the behaviour under test needs one
    row = h.sample(vllm_tree.pid)
    assert row["vllm_procs"] == 3
    # the engine spins, the worker sleeps (the machine is shared: "clearly busier", not "one full core")
    assert row["vllm_engine_cpu_pct"] > 5
    assert row["vllm_engine_cpu_pct"] > 3 * row["vllm_workers_cpu_pct"]
    assert row["vllm_workers_rss_bytes"] > 60 * 1024 * 1024  # the worker holds a 64 MiB buffer
    assert row["vllm_rss_bytes"] == (row["vllm_api_rss_bytes"] + row["vllm_engine_rss_bytes"]
                                     + row["vllm_workers_rss_bytes"])
    assert row["vllm_cpu_pct"] == pytest.approx(row["vllm_api_cpu_pct"] + row["vllm_engine_cpu_pct"]
                                                + row["vllm_workers_cpu_pct"], abs=0.2)


def test_tree_is_rewalked_when_a_member_dies(tmp_path, vllm_tree):
    h = HostSampler(tmp_path / "db.sqlite", tree_refresh_s=3600)
    pids = h.vllm_pids(vllm_tree.pid)
    engine = next(p for p in psutil.Process(vllm_tree.pid).children() if p.cmdline()[:1] == ["VLLM::EngineCore"])
    engine.kill()  # its parent never reaps it: it stays a zombie, which is not a member either
    deadline = time.monotonic() + 30
    while engine.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.02)
    after = h.vllm_pids(vllm_tree.pid)
    assert engine.pid in pids and engine.pid not in after and len(after) == 2
    assert h.sample(vllm_tree.pid)["vllm_procs"] == 2


def test_a_gone_root_reads_zero_processes(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(timeout=10)
    h = HostSampler(tmp_path / "db.sqlite")
    assert h.vllm_pids(p.pid) == set()
    assert h.sample(p.pid)["vllm_procs"] == 0


def test_one_proc_read_gives_what_psutil_gives():
    """The tree is read with one /proc/<pid>/stat read a process; it must say what psutil's four reads say."""
    from lynxtop.agent.serving import procs

    code = "import sys, time\nx = bytearray(48 << 20)\nprint('ready', flush=True)\ntime.sleep(30)\n"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while procs.stat(child.pid).state != "S" and time.monotonic() < deadline:  # asleep: nothing moves now
            time.sleep(0.01)
        p = psutil.Process(child.pid)
        with p.oneshot():
            t, rss = p.cpu_times(), p.memory_info().rss
        u = procs.usage(child.pid)
        assert u is not None and u.state == "S" and u.start_ticks == procs.stat(child.pid).start_ticks
        assert u.cpu_s == pytest.approx(t.user + t.system, abs=1e-9)
        # the kernel's RSS counters are per-thread caches synced now and then: stat and statm may differ by
        # a few pages (seen: 3 of 15,000)
        assert u.rss_bytes > 48 << 20 and u.rss_bytes == pytest.approx(rss, rel=0.01)
    finally:
        child.kill()
        child.wait()
    assert procs.usage(2**22 + 1) is None  # past pid_max: no such process


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_kept_stat_files_read_fresh_values_and_let_go_of_a_reaped_process():
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    files = procs.StatFiles()
    try:
        before = _open_fds()
        first = files.usage(spin.pid)
        assert first is not None and first.state in ("R", "S")
        assert _open_fds() == before + 1
        def spun_more():
            u = files.usage(spin.pid)
            return u if u is not None and u.cpu_s > first.cpu_s else None

        later = wait_for(spun_more, 20, what="more CPU time read for the spinner (read again, not cached)")
        assert later.start_ticks == procs.stat(spin.pid).start_ticks
        spin.kill()
        spin.wait()
        assert files.usage(spin.pid) is None  # reaped: the kept descriptor says so
        assert _open_fds() == before  # and was closed
        assert files.usage(os.getpid()) is not None
        files.keep_only(())
        assert _open_fds() == before
    finally:
        spin.kill()
        spin.wait()
        files.close()


def test_the_tree_is_rewalked_on_the_members_listing_of_the_shared_table(tmp_path):
    """The node's look for the run's members lists /proc every 5 s; the tree's walk takes that listing when it
    comes rather than list /proc again on its own 5 s, out of step: a child is found with it, at no listing."""
    flag = tmp_path / "go"
    code = (f"import os, subprocess, time\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.02)\n"
            "subprocess.Popen(['sleep', '60'])\ntime.sleep(60)\n")
    leader = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        t = [1000.0]
        table = ProcTable(clock=lambda: t[0])
        h = HostSampler(tmp_path / "db.sqlite", tree_refresh_s=5.0, clock=lambda: t[0], table=table)
        assert h.vllm_pids(leader.pid) == {leader.pid}
        flag.touch()
        child = wait_for(lambda: [c.pid for c in psutil.Process(leader.pid).children()], what="the child")[0]
        looks = table.looks
        t[0] += 2.0  # the tree's own walk is 3 s away
        assert h.vllm_pids(leader.pid) == {leader.pid}  # no walk, no listing
        table.members(None, leader.pid, [leader.pid], 0)  # the members' look: one listing
        assert h.vllm_pids(leader.pid) == {leader.pid, child}  # found now, with that listing
        assert table.looks == looks + 1
        t[0] += 4.0
        assert h.vllm_pids(leader.pid) == {leader.pid, child} and table.looks == looks + 1  # 4 s after the walk
        t[0] += 1.0
        assert h.vllm_pids(leader.pid) == {leader.pid, child} and table.looks == looks + 2  # its own 5 s
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait(timeout=10)


def test_a_kept_file_reads_what_a_fresh_open_reads(tmp_path):
    """The per-tick /proc files are read through a kept descriptor; what a fresh open would read still wins: a
    file grown past the buffer is read whole, a kept read that repeats the last one (a replaced file, a caching
    layer) is read afresh, and a file gone is None, as before."""
    path = tmp_path / "stat"
    path.write_bytes(b"a" * 100)
    kept = host_mod._KeptFile(str(path))
    kept._size = 16
    try:
        assert kept.read() == b"a" * 100  # past the buffer: whole
        path.write_bytes(b"b" * 40)  # the same file, rewritten in place
        assert kept.read() == b"b" * 40
        fresh = tmp_path / "new"
        fresh.write_bytes(b"c" * 40)
        fresh.rename(path)  # another file under the name: the kept one says what it said before
        assert kept.read() == b"c" * 40
        path.unlink()
        assert kept.read() is None
    finally:
        kept.close()


def test_the_host_files_are_read_through_kept_descriptors(tmp_path):
    h = HostSampler(tmp_path / "db.sqlite")
    h.sample(None)
    fds = {p: host_mod._KEPT[p]._fd for p in ("/proc/stat", "/proc/meminfo", "/proc/net/dev")}
    h._refresh = type(h._refresh)(0.0)  # every sample reads
    h.sample(None)
    assert all(fd is not None for fd in fds.values())
    assert {p: host_mod._KEPT[p]._fd for p in fds} == fds  # the same descriptors, not opened again


def test_a_tick_reads_each_member_once_walk_or_not(tmp_path, vllm_tree, monkeypatch):
    """Every tick reads each member's /proc/<pid>/stat once: on a tick that walks the tree again (every 5 s, or
    on the members' listing) the walk's confirming read is the member's usage, not followed by a second read;
    and a member already known is read through its kept descriptor, opening nothing."""
    t = [1000.0]
    h = HostSampler(tmp_path / "db.sqlite", tree_refresh_s=5.0, clock=lambda: t[0],
                    table=ProcTable(clock=lambda: t[0]))
    h.sample(vllm_tree.pid)
    members = h.tree_pids
    assert len(members) == 3
    reads: list[int] = []
    opens: list[str] = []
    real_pread, real_read, real_open = os.pread, os.read, os.open

    def note(data: bytes) -> bytes:
        head = data[:data.find(b" (")]
        if head.isdigit():  # /proc/<pid>/stat begins "<pid> (comm)"; /proc/stat, meminfo, net/dev do not
            reads.append(int(head))
        return data

    def counted_open(path, *a, **kw):
        if isinstance(path, str) and path.split("/")[2:3] != ["stat"] and path.endswith("/stat"):
            opens.append(path)  # /proc/<pid>/stat (a kept /proc/stat is opened afresh when it reads the same)
        return real_open(path, *a, **kw)

    monkeypatch.setattr(os, "pread", lambda fd, n, off: note(real_pread(fd, n, off)))
    monkeypatch.setattr(os, "read", lambda fd, n: note(real_read(fd, n)))
    monkeypatch.setattr(os, "open", counted_open)
    for step, walks in ((1.0, False), (4.0, True), (1.0, False)):
        t[0] += step
        reads.clear()
        row = h.sample(vllm_tree.pid)
        assert sorted(reads) == sorted(members), f"walk={walks}"
        assert row["vllm_procs"] == 3 and row["vllm_cpu_pct"] is not None
    assert opens == []


def test_per_core_times_from_proc_stat(monkeypatch):
    """Each core's (busy, total) as psutil adds them: the first 8 counters (guest time is inside user), idle and
    iowait not busy; a kernel that prints fewer counters reads them as 0; intr's line and those after it are no
    core's, and a total line is skipped."""
    stat = (b"cpu  10 20 30 40 50 60 70 80 90 100\n"
            b"cpu0 1 2 3 4 5 6 7 8 9 10\n"
            b"cpu1 100 0 50 1000 7\n"
            b"cpu2 5 5 5 5\n"
            b"intr 123 4 5 6 7\nctxt 999\ncpu9 1 1 1 1 1 1 1 1\nsoftirq 1 2 3\n")
    monkeypatch.setattr(host_mod, "_read", lambda path: stat if path == "/proc/stat" else None)
    assert host_mod._per_core() == [(36.0 - 4 - 5, 36.0), (1157.0 - 1000 - 7, 1157.0), (20.0 - 5, 20.0)]
    stat = stat[:stat.find(b"intr")]  # no intr line: the whole file is read for the cores
    assert host_mod._per_core() == [(27.0, 36.0), (150.0, 1157.0), (15.0, 20.0)]


# titles itself only when told: vLLM's engine and workers set theirs after their imports, seconds after they start
LATE_TITLE = (
    "import ctypes, sys\n"
    "blob = bytearray(32 * 1024 * 1024)\n"
    "print('up', flush=True)\n"
    "sys.stdin.readline()\n"
    "ctypes.CDLL(None).prctl(15, b'VLLM::EngineCor', 0, 0, 0)\n"  # PR_SET_NAME
    "print('titled', flush=True)\n"
    "sys.stdin.readline()\n"
)


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _late_titled() -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", LATE_TITLE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, start_new_session=True)
    assert p.stdout.readline().strip() == "up"
    return p


def test_a_title_set_after_the_first_look_gives_the_role(tmp_path):
    """The first walk sees the process untitled ("api"); once it titles itself, a later walk gives it its role:
    before, the first role was kept for the process's whole life, and a TP8 run's engine and workers counted as
    the API server's CPU and memory."""
    p = _late_titled()
    try:
        clock = _Clock()
        h = HostSampler(tmp_path / "db.sqlite", clock=clock, refresh_s=0.0)
        first = h.sample(p.pid)
        assert first["vllm_api_rss_bytes"] > 30 * 1024 * 1024 and first["vllm_engine_rss_bytes"] == 0
        p.stdin.write("title\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "titled"
        clock.t += h.tree_refresh_s  # the next walk
        row = h.sample(p.pid)
        assert row["vllm_engine_rss_bytes"] > 30 * 1024 * 1024 and row["vllm_api_rss_bytes"] == 0
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)


def test_an_untitled_process_is_looked_at_again_only_for_a_while(tmp_path, monkeypatch):
    """A member that never gets a vLLM title (the API server, a compile worker) is read again on each walk for
    TITLE_WAIT_S, then its role stands and its title is not read any more."""
    p = _late_titled()
    try:
        clock = _Clock()
        h = HostSampler(tmp_path / "db.sqlite", clock=clock, refresh_s=0.0)
        reads = []
        real = procs.cmdline
        monkeypatch.setattr(procs, "cmdline", lambda pid: (reads.append(pid), real(pid))[1])
        h.sample(p.pid)
        for _ in range(3):
            clock.t += h.tree_refresh_s
            h.sample(p.pid)
        assert reads.count(p.pid) == 4  # the first walk and three more
        clock.t += host_mod.TITLE_WAIT_S
        h.sample(p.pid)  # past the wait: the last look, and the role stands
        for _ in range(3):
            clock.t += h.tree_refresh_s
            h.sample(p.pid)
        assert reads.count(p.pid) == 5
        p.stdin.write("title\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "titled"
        clock.t += h.tree_refresh_s
        assert h.sample(p.pid)["vllm_api_rss_bytes"] > 30 * 1024 * 1024  # a title this late is not looked for
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
