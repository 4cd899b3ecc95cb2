"""`agent.started` says when the agent before it did not stop cleanly (session 22 store audit).

After a SIGKILL (the OOM killer, `kill -9`, a power cut) the history had a gap, its last seconds of samples and
events lost, and the next agent's `agent.started` read like any other start: nothing said why the gap was there.
agent.lock now says how its agent ended (`<pid> running` while it runs, `<pid> stopped` after a clean stop, a start
that failed included); the next start reads it before taking the lock: a warning naming the previous pid after a
kill, the usual info after a clean stop, nothing claimed for an older agent's bare pid.

Real agent processes (fake NVML, no autostart), real signals, the real history database.
"""

from __future__ import annotations

import json
import signal

import pytest
from support.agent_proc import Agent, e2e_config, state_db

pytestmark = pytest.mark.timeout(120)


def starts(tmp_path) -> list[dict]:
    return state_db(tmp_path, "SELECT severity, message, details FROM events WHERE kind = 'agent.started' "
                              "ORDER BY id")


async def test_a_start_after_a_kill_says_so_and_one_after_a_clean_stop_does_not(tmp_path, cleanup):
    cfg = e2e_config(tmp_path, autostart=False)
    lock = tmp_path / "state" / "agent.lock"
    a = Agent(tmp_path, cfg, "first")
    cleanup.append(a)
    await a.wait_notify("READY=1")
    assert lock.read_text() == f"{a.proc.pid} running\n"
    killed = a.proc.pid
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(30)

    b = Agent(tmp_path, cfg, "second")
    cleanup.append(b)
    await b.wait_notify("READY=1")
    assert b.stop() == 0
    assert lock.read_text() == f"{b.proc.pid} stopped\n"
    sev, msg, details = starts(tmp_path)[-1].values()
    assert sev == "warning", msg
    assert f"the previous agent (pid {killed}) did not stop cleanly" in msg
    assert json.loads(details)["previous_pid"] == killed

    c = Agent(tmp_path, cfg, "third")
    cleanup.append(c)
    await c.wait_notify("READY=1")
    assert c.stop() == 0
    sev, msg, _ = starts(tmp_path)[-1].values()
    assert sev == "info" and "did not stop cleanly" not in msg, msg


async def test_an_older_agents_bare_pid_claims_nothing(tmp_path, cleanup):
    cfg = e2e_config(tmp_path, autostart=False)
    (tmp_path / "state").mkdir(mode=0o750)
    (tmp_path / "state" / "agent.lock").write_text("4242\n")  # what agents before session 22 left, stopped or not
    a = Agent(tmp_path, cfg)
    cleanup.append(a)
    await a.wait_notify("READY=1")
    assert a.stop() == 0
    sev, msg, _ = starts(tmp_path)[-1].values()
    assert sev == "info" and "did not stop cleanly" not in msg, msg
