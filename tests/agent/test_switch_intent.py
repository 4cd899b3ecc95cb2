"""SIGKILL of a real agent in the middle of a switch: the next agent finishes it and says it was interrupted
(issue 24.5). The target profile is persisted before the old run is stopped."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest
from support.agent_proc import Agent, e2e_config, sim_processes, state_db

from lynxtop.agent.serving import procs

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("kill_at", ["accepted", "stopping"])
async def test_agent_killed_mid_switch_is_finished_by_the_next_agent(tmp_path, cleanup, kill_at):
    """accepted: killed right after the 202 (the old run still serves and is adopted); stopping: killed while
    the old run stops (it ends, nothing is adopted). Before, the next agent kept the old profile or autostarted
    the default one, and no event said a switch had been asked."""
    cfg = e2e_config(tmp_path)
    a = Agent(tmp_path, cfg, "a1")
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    assert st["serving"]["profile"] == "v4-tp8"
    old_run, old_pid = st["serving"]["run_id"], st["serving"]["pid"]
    code, body = await a.api("POST", "/v1/switch", {"profile": "v4-tp4"})
    assert code == 202, body
    if kill_at == "stopping":
        await a.wait_state(lambda s: s["state"] == "stopping", timeout=20, what="the old run stopping")
    a.stop(signal.SIGKILL)
    b = Agent(tmp_path, cfg, "a2")
    cleanup.append(b)
    st = await b.wait_state(lambda s: s["profile"] == "v4-tp4" and s["state"] == "ready" and s["run_id"] != old_run,
                            timeout=60, what="the switch finished by the next agent")
    deadline = time.monotonic() + 10
    while not (ev := state_db(tmp_path, "SELECT * FROM events WHERE kind = 'action.switch.interrupted'")):
        assert time.monotonic() < deadline, "no action.switch.interrupted event"
        await asyncio.sleep(0.1)
    assert len(ev) == 1 and "v4-tp8 to v4-tp4" in ev[0]["message"] and "finishing it now" in ev[0]["message"]
    runs = state_db(tmp_path, "SELECT id, profile, ended_ms FROM runs ORDER BY id")
    assert runs[-1]["profile"] == "v4-tp4" and all(r["ended_ms"] for r in runs[:-1]), runs
    deadline = time.monotonic() + 10  # cleared when the action's steps end, just after the run is ready
    while (tmp_path / "state" / "switch.json").exists():  # the switch ended: nothing left to resume
        assert time.monotonic() < deadline, "switch.json left after the switch ended"
        await asyncio.sleep(0.1)
    assert not procs.alive(old_pid) and st["serving"]["pid"] in sim_processes(tmp_path / "sim-state")
    assert b.stop() == 0
