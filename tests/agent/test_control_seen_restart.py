"""An agent restarted during an operator's restart finishes that restart (same profile), like a switch.

Before, `switch` left its target in switch.json for the next agent, `restart` left nothing: an agent restarted
(systemctl restart, an upgrade) while the old run drained came back to find no run, and either left the node
stopped (autostart off) or started the DEFAULT profile (autostart on). Real agent processes; the stand-in vLLM
drains for a few seconds on SIGTERM, so the agent's SIGTERM lands in the restart's stop phase.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time

import pytest
from support.agent_config import agent_toml, profile
from support.agent_proc import Agent, state_db

from lynxtop.agent.serving import procs

pytestmark = pytest.mark.timeout(120)

STANDIN = os.path.join(os.path.dirname(__file__), "standin_vllm.py")
DRAIN = {"STANDIN_MODE": "drain", "STANDIN_DRAIN_S": "3"}  # inherited by the servers the agents start


def _config(tmp_path, autostart: bool):
    profiles = "".join(profile(name, STANDIN, model="m", readiness_timeout_s=20, stop_grace_s=10,
                               shutdown_timeout_s=1) for name in ("alpha", "beta"))
    path = tmp_path / "config.toml"
    path.write_text(agent_toml(tmp_path / "state" / "lynxtop.db", tmp_path / "run" / "agent.sock", fake_nvml="sim",
                               sample_interval_s=0.2, default_profile="alpha", autostart=autostart,
                               backoff_initial_s=0.3, backoff_max_s=1, gpu_release_timeout_s=5, profiles=profiles))
    return path


def _kill_runs(tmp_path) -> None:
    """The stand-in servers the agents left (live restore keeps them up by design)."""
    logs = os.path.realpath(tmp_path / "state" / "logs")
    for pid in procs.runs_started_in(logs):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(("autostart", "old_gone"), [(False, True), (True, True), (False, False)])
async def test_agent_restarted_during_a_restart_finishes_it(tmp_path, cleanup, autostart, old_gone):
    """old_gone: the next agent comes once the old server has drained (nothing to adopt; before, it stayed stopped
    or started the default profile); else while it still drains (adopted, then its exit was a crash)."""
    cfg = _config(tmp_path, autostart)
    a = Agent(tmp_path, cfg, "a1", env=DRAIN)
    cleanup.append(a)
    try:
        if not autostart:
            await a.wait_notify("READY=1")
            code, body = await a.api("POST", "/v1/start", {"profile": "beta"})
            assert code == 202, body
        else:
            await a.wait_state(lambda s: s["state"] == "ready", what="autostart")
            code, body = await a.api("POST", "/v1/switch", {"profile": "beta"})
            assert code == 202, body
        st = await a.wait_state(lambda s: s["state"] == "ready" and s["profile"] == "beta", what="beta ready")
        old_run, old_pid = st["serving"]["run_id"], st["serving"]["pid"]
        code, body = await a.api("POST", "/v1/restart", {})
        assert code == 202, body
        await a.wait_state(lambda s: s["state"] == "stopping", what="the restart's stop phase")
        await asyncio.sleep(0.3)  # SIGTERM is out, the server drains (3 s)
        intent = json.loads((tmp_path / "state" / "switch.json").read_text())
        assert intent["action"] == "restart" and intent["profile"] == "beta" and intent["run"] == old_run, intent
        assert a.stop() == 0  # the agent goes away mid-restart (live restore: serving is left alone)
        deadline = time.monotonic() + 30  # a 3 s drain, then its exit: seconds more on a loaded machine
        while old_gone and procs.alive(old_pid):
            assert time.monotonic() < deadline, "the old server did not drain"
            await asyncio.sleep(0.05)
        b = Agent(tmp_path, cfg, "a2", env=DRAIN)
        cleanup.append(b)
        st = await b.wait_state(lambda s: s["state"] == "ready" and s["run_id"] not in (None, old_run),
                                timeout=60, what="the restart finished by the next agent")
        assert st["serving"]["profile"] == "beta", st["serving"]  # not stopped, not the default profile
        assert not procs.alive(old_pid)
        deadline = time.monotonic() + 10
        while not (ev := state_db(tmp_path, "SELECT * FROM events WHERE kind = 'action.switch.interrupted'")):
            assert time.monotonic() < deadline, "no interrupted event"
            await asyncio.sleep(0.1)
        assert len(ev) == 1 and "restart of beta" in ev[0]["message"] and "finishing it now" in ev[0]["message"]
        assert json.loads(ev[0]["details"])["action"] == "restart"
        runs = state_db(tmp_path, "SELECT id, profile, end_reason FROM runs ORDER BY id")
        assert [r["profile"] for r in runs if r["id"] > old_run] == ["beta"], runs
        assert not (tmp_path / "state" / "switch.json").exists()  # done: nothing left to resume
        code, body = await b.api("POST", "/v1/stop", {})
        assert code == 202, body
        await b.wait_state(lambda s: s["state"] == "stopped", what="stopped")
        assert b.stop() == 0
    finally:
        _kill_runs(tmp_path)


async def test_a_restart_that_ends_leaves_no_intent(tmp_path, cleanup):
    cfg = _config(tmp_path, True)
    a = Agent(tmp_path, cfg, env=DRAIN)
    cleanup.append(a)
    try:
        st = await a.wait_state(lambda s: s["state"] == "ready", what="autostart")
        code, body = await a.api("POST", "/v1/restart", {})
        assert code == 202, body
        await a.wait_state(lambda s: s["state"] == "ready" and s["run_id"] != st["serving"]["run_id"],
                           what="restarted")
        # the intent ends with the restart's steps, a turn after the status says ready: waited for, not slept on
        # (0.3 s is not a turn of a loaded machine's agent)
        deadline = time.monotonic() + 30
        while (tmp_path / "state" / "switch.json").exists():
            assert time.monotonic() < deadline, "the finished restart left its intent (switch.json)"
            await asyncio.sleep(0.05)
        assert a.stop() == 0
        b = Agent(tmp_path, cfg, "a2", env=DRAIN)  # adopts the run; nothing is restarted again
        cleanup.append(b)
        st2 = await b.wait_state(lambda s: s["state"] == "ready" and s["adopted"], what="adopted")
        assert st2["serving"]["run_id"] != st["serving"]["run_id"]
        assert not state_db(tmp_path, "SELECT * FROM events WHERE kind = 'action.switch.interrupted'")
        assert b.stop() == 0
    finally:
        _kill_runs(tmp_path)


async def test_agent_restarted_once_the_new_run_started_adopts_it_and_restarts_nothing(tmp_path, cleanup):
    """The restart got as far as its new run: the next agent adopts that run (a load perhaps minutes in) and does
    not restart it again; the note says which run was being replaced, since both runs have the same profile."""
    cfg = _config(tmp_path, True)
    env = DRAIN | {"STANDIN_STARTUP_S": "3", "STANDIN_DRAIN_S": "0.5"}
    a = Agent(tmp_path, cfg, "a1", env=env)
    cleanup.append(a)
    try:
        st = await a.wait_state(lambda s: s["state"] == "ready", what="autostart")
        old_run = st["serving"]["run_id"]
        code, body = await a.api("POST", "/v1/restart", {"expect_run": old_run})
        assert code == 202, body
        st = await a.wait_state(lambda s: s["state"] == "starting" and s["run_id"] not in (None, old_run),
                                what="the new run loading")
        new_run, new_pid = st["serving"]["run_id"], st["serving"]["pid"]
        assert a.stop() == 0
        b = Agent(tmp_path, cfg, "a2", env=env)
        cleanup.append(b)
        st = await b.wait_state(lambda s: s["state"] == "ready", timeout=30, what="the adopted run ready")
        assert st["serving"]["run_id"] == new_run and st["serving"]["pid"] == new_pid and st["serving"]["adopted"]
        ev = state_db(tmp_path, "SELECT * FROM events WHERE kind = 'action.switch.interrupted'")
        assert len(ev) == 1 and f"after its new run {new_run} started; that run was adopted" in ev[0]["message"]
        assert [r["id"] for r in state_db(tmp_path, "SELECT id FROM runs ORDER BY id")][-1] == new_run
        assert not (tmp_path / "state" / "switch.json").exists()
        assert b.stop() == 0
    finally:
        _kill_runs(tmp_path)
