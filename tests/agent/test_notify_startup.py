"""sd_notify datagrams read from a real socket; start-up phases and log tails from real files."""

from __future__ import annotations

import os
import socket

import pytest

from lynxtop.agent.notify import Notifier
from lynxtop.agent.serving.launcher import child_env, prune_logs
from lynxtop.agent.serving.startup import PhaseTracker, tail_lines


@pytest.fixture
def dgram(tmp_path):
    path = str(tmp_path / "notify")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(2)
    yield path, s
    s.close()


def test_notifier_sends_each_message_as_one_datagram(dgram):
    path, s = dgram
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "20000000", "WATCHDOG_PID": str(os.getpid()), "HOME": "/x"}
    n = Notifier.from_env(env)
    assert env == {"HOME": "/x"}  # consumed: no child can inherit them
    assert n.watchdog_interval_s == 10.0
    assert n.ready("serving stopped")
    assert s.recv(4096) == b"READY=1\nSTATUS=serving stopped"
    assert not n.status("serving stopped")  # unchanged: not resent
    assert n.status("serving ready")
    assert s.recv(4096) == b"STATUS=serving ready"
    assert n.watchdog()
    assert s.recv(4096) == b"WATCHDOG=1"
    assert n.stopping()
    assert s.recv(4096) == b"STOPPING=1"


def test_notifier_abstract_socket_and_absent_systemd():
    name = f"lynxtop-test-{os.getpid()}"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind("\0" + name)
    s.settimeout(2)
    try:
        n = Notifier.from_env({"NOTIFY_SOCKET": "@" + name})
        assert n.ready()
        assert s.recv(100) == b"READY=1"
    finally:
        s.close()
    off = Notifier.from_env({})
    assert not off.enabled and not off.ready() and off.watchdog_interval_s is None


def test_notifier_ignores_watchdog_meant_for_another_pid_and_survives_a_dead_socket(tmp_path):
    n = Notifier.from_env({"NOTIFY_SOCKET": str(tmp_path / "gone"), "WATCHDOG_USEC": "1000000",
                           "WATCHDOG_PID": "1"})
    assert n.watchdog_interval_s is None
    assert not n.ready() and n.errors == 1  # logged, never raised


def test_notifier_never_waits_on_a_receiver_that_stopped_reading(dgram):
    """The agent sends from its event loop: a full receive queue drops the message (EAGAIN) at once instead of
    blocking the loop until a timeout."""
    path, _s = dgram  # bound, never read
    n = Notifier(path)
    sent = 0
    while n.send("STATUS=" + "x" * 1000) and sent < 100_000:
        sent += 1
    assert sent > 0 and n.errors == 1
    assert isinstance(n.last_error, BlockingIOError)  # not TimeoutError: nothing waited


def test_child_env_strips_systemd_variables_and_adds_profile_env():
    base = {"NOTIFY_SOCKET": "/run/systemd/notify", "WATCHDOG_USEC": "1", "WATCHDOG_PID": "1", "PATH": "/bin"}
    env = child_env({"VLLM_LOGGING_LEVEL": "DEBUG"}, "tok123", base)
    assert env == {"PATH": "/bin", "VLLM_LOGGING_LEVEL": "DEBUG", "LYNXTOP_RUN_TOKEN": "tok123"}


REAL_LOG = """\
INFO 12-02 10:00:01 [core.py:93] Initializing a V1 LLM engine (v0.11.0) with config: model='deepseek-ai/DeepSeek-V4.1'
(Worker_TP0 pid=101) INFO 12-02 10:00:20 [gpu_model_runner.py:2602] Starting to load model deepseek-ai/DeepSeek-V4.1...
(Worker_TP0 pid=101) INFO 12-02 10:09:40 [default_loader.py:267] Loading weights took 558.21 seconds
(Worker_TP1 pid=102) INFO 12-02 10:09:41 [default_loader.py:267] Loading weights took 559.02 seconds
(Worker_TP0 pid=101) INFO 12-02 10:10:02 [gpu_worker.py:298] Available KV cache memory: 31.42 GiB
(EngineCore_DP0 pid=90) INFO 12-02 10:10:03 [kv_cache_utils.py:1087] GPU KV cache size: 1,004,160 tokens
(Worker_TP0 pid=101) INFO 12-02 10:11:10 [gpu_model_runner.py:3480] Graph capturing finished in 67 secs, took 1.2 GiB
(APIServer pid=80) INFO 12-02 10:11:30 [api_server.py:1896] Starting vLLM API server 0 on http://127.0.0.1:8000
(APIServer pid=80) INFO:     Application startup complete.
"""


def test_phases_follow_real_vllm_lines_in_order_and_only_forward(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("")
    t = PhaseTracker(log, started_ms=1000)
    assert t.phase == "loading weights" and t.poll(1100) == []
    lines = REAL_LOG.splitlines(keepends=True)
    seen = []
    ts = 2000
    for line in lines:
        with log.open("a") as f:
            f.write(line[:20])  # a line arrives in two writes: nothing is matched on half a line
        seen += [m.phase for m in t.poll(ts)]
        with log.open("a") as f:
            f.write(line[20:])
        seen += [m.phase for m in t.poll(ts + 1)]
        ts += 10
    assert seen == ["kv cache", "cuda graphs", "api up"]
    assert [m.phase for m in t.marks] == ["loading weights", "kv cache", "cuda graphs", "api up"]
    assert t.phase_since_ms > 2000


def test_phases_enforce_eager_and_truncated_log(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("Loading weights took 3 seconds\nStarting vLLM API server 0 on http://127.0.0.1:8000\n")
    t = PhaseTracker(log, started_ms=0)
    assert [m.phase for m in t.poll(5)] == ["kv cache", "api up"]  # no graphs with --enforce-eager
    log.write_text("x\n")  # replaced by a shorter file: read from the start, never crash
    assert t.poll(6) == []
    assert PhaseTracker(tmp_path / "missing.log", 0).poll(1) == []


def test_vllm_032_server_line_marks_api_up(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("Loading weights took 3 seconds\n"
                   "(APIServer pid=7) INFO 12-02 10:11:30 [api_server.py:1] Starting vLLM server on http://127.0.0.1:8000\n")
    assert [m.phase for m in PhaseTracker(log, started_ms=0).poll(5)] == ["kv cache", "api up"]


def test_tail_lines_reads_only_the_end_of_a_big_log(tmp_path):
    log = tmp_path / "big.log"
    with log.open("w") as f:
        for i in range(200_000):
            f.write(f"line {i}\n")
    assert tail_lines(log, 3) == ["line 199997", "line 199998", "line 199999"]
    assert tail_lines(log, 3, max_bytes=20) == ["line 199999"]  # the cut first line is dropped
    assert tail_lines(tmp_path / "none.log") == [] and tail_lines(None) == []


def test_prune_logs_keeps_the_newest_and_the_protected(tmp_path):
    paths = []
    for i in range(6):
        p = tmp_path / f"run{i}.log"
        p.write_text("x")
        os.utime(p, (1000 + i, 1000 + i))
        paths.append(p)
    (tmp_path / "notes.txt").write_text("not a log")
    removed = prune_logs(tmp_path, keep=3, protect={str(paths[0])})
    assert sorted(removed) == [paths[1], paths[2]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "run0.log", "run3.log", "run4.log",
                                                          "run5.log"]
