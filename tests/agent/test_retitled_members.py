"""A run's processes that no longer show its token are still the run's.

vLLM's EngineCore and workers retitle themselves (setproctitle moves the environment away and reuses its memory for
the title), so /proc/PID/environ no longer shows LYNXTOP_RUN_TOKEN. Seen on vLLM 0.32 (CPU): after a SIGKILL of
the API server, EngineCore and its Worker live on, re-parented, token-less; only multiprocessing's resource tracker
still carries the token. Once that one is gone too, neither the live agent's stop nor an adopting agent's leftover
search found them, and they kept the GPUs' memory. Here a child re-executes itself with another environment: same
pid, same start time, no token, as a retitled process shows.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
from support.waits import wait_for

from lynxtop.agent.serving import launcher, procs
from lynxtop.agent.serving.launcher import ServerRecord

CHILD = """
import os, sys, time
if os.environ.get("RETITLED") != "1":  # like setproctitle: same process, its token no longer readable
    os.execve(sys.executable, [sys.executable, __file__], {"RETITLED": "1"})
time.sleep(120)
"""

LEADER = """
import subprocess, sys, time
from pathlib import Path
child = subprocess.Popen([sys.executable, sys.argv[1]])
Path(sys.argv[2]).write_text(str(child.pid))
time.sleep(120)
"""


def _spawn_run(tmp_path: Path) -> tuple[launcher.ServerProcess, int]:
    (tmp_path / "child.py").write_text(CHILD)
    (tmp_path / "leader.py").write_text(LEADER)
    pidfile = tmp_path / "child.pid"
    proc = launcher.spawn([sys.executable, str(tmp_path / "leader.py"), str(tmp_path / "child.py"), str(pidfile)],
                          tmp_path / "logs" / "r.log", {}, "alpha")
    child = int(wait_for(lambda: pidfile.exists() and pidfile.read_text(), 20, what="the child's pid"))
    wait_for(lambda: procs.environ_has(child, "RETITLED", "1"), 20, what="the child's re-exec")
    assert not procs.environ_has(child, procs.RUN_TOKEN_ENV, proc.record.token)
    return proc, child


def _kill_all(proc: launcher.ServerProcess, child: int) -> None:
    proc.close()
    for pid in (proc.pid, child):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.popen is not None:
        proc.popen.wait(5)


def _leader_killed(proc: launcher.ServerProcess) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.popen.wait(5)
    proc._on_exit_now()  # what the pidfd's reader does on the loop


async def test_a_retitled_child_is_stopped_with_the_run_after_its_leader_died(tmp_path):
    proc, child = _spawn_run(tmp_path)
    try:
        assert child in proc.members()  # while the leader lives: its group and its descendants
        _leader_killed(proc)
        assert procs.alive(child)
        assert child in proc.members(), "the retitled child was lost once the leader was gone"
        res = await proc.stop(grace_s=2, kill_wait_s=5)
        assert child in res.pids and not res.survivors
        assert any(o.pid == child for o in res.orphans)
        wait_for(lambda: not procs.alive(child), 10, what="the child's end")
    finally:
        _kill_all(proc, child)


async def test_an_adopting_agent_kills_the_retitled_leftovers_it_reads_in_the_record(tmp_path):
    """The agent was down while the API server died: the next one reads serving.json and finds what is left."""
    proc, child = _spawn_run(tmp_path)
    try:
        proc.note_files()  # at readiness: the record is written with what the run holds
        record = ServerRecord.from_json(proc.record.to_json())
        assert [child, procs.stat(child).start_ticks] in [list(m) for m in record.members]
        _leader_killed(proc)
        assert child in launcher.leftovers(record)
        res = await launcher.kill_leftovers(record, wait_s=5)
        assert child in res.pids and not res.survivors
        wait_for(lambda: not procs.alive(child), 10, what="the child's end")
    finally:
        _kill_all(proc, child)


def test_a_known_pid_with_another_start_time_is_a_stranger():
    """pid and start time together name a process: a reused pid is never taken for the run's."""
    me = procs.stat(os.getppid())
    stats = {me.pid: me}
    none = procs.members_in(stats, None, None, (), 0, lambda s: False, known={me.pid: me.start_ticks + 1})
    assert none == []
    found = procs.members_in(stats, None, None, (), 0, lambda s: False, known={me.pid: me.start_ticks})
    assert found == [me.pid]


@pytest.mark.parametrize("value, words", [
    ("x", "not a list of [pid, start time] pairs"),
    ([[1]], "not a list of [pid, start time] pairs"),
    ([[0, 5]], "not a list of [pid, start time] pairs"),
    ([[5, True]], "not a list of [pid, start time] pairs"),
    ([[5, 1.5]], "not a list of [pid, start time] pairs"),
    ([[5, 6]] * 5000, "more than 4096"),
])
def test_a_bad_members_field_is_refused_naming_it(value, words):
    rec = ServerRecord(run_id=1, profile="a", pid=10, pgid=10, start_ticks=5, argv=["vllm"], token="0" * 16,
                       log_path="/x.log", started_ms=1)
    import json
    data = json.loads(rec.to_json())
    data["members"] = value
    with pytest.raises(ValueError, match=r'"members"') as err:
        ServerRecord.from_json(json.dumps(data))
    assert words in str(err.value)


def test_a_record_without_members_reads_as_before():
    rec = ServerRecord(run_id=1, profile="a", pid=10, pgid=10, start_ticks=5, argv=["vllm"], token="0" * 16,
                       log_path="/x.log", started_ms=1)
    import json
    data = json.loads(rec.to_json())
    data.pop("members", None)
    assert ServerRecord.from_json(json.dumps(data)).members == []
