"""A control confirmed against one run must not act on another: `expect_run` (the run id the caller saw).

Alice reads "profile v4-tp8, run 1" and confirms a stop; meanwhile Bob switched to v4-tp4, a load of many
minutes. Before, her stop aborted Bob's load: the API took no run id and the CLI posted without looking again.
Now every mutating body may name the run the caller saw, the agent refuses (409 run_changed) when another run
is current, and the CLI sends the run of its "Now:" line, bounds its prompt and looks again after the answer.
Real agent process, simulated vLLM, real CLI code path.
"""

from __future__ import annotations

import asyncio
import builtins
import os
import sys
from argparse import Namespace

import pytest
from support.agent_config import sim_profile, write_agent_config
from support.agent_proc import Agent, state_db

from lynxtop.cli import ctl
from lynxtop.contract.client import AgentClient

pytestmark = pytest.mark.timeout(120)


def _config(tmp_path, slow_s: float = 120):
    profiles = [sim_profile("v4-tp8", tp=8, startup_s=0.5, stop_grace_s=5),
                sim_profile("v4-tp4", tp=4, startup_s=slow_s, readiness_timeout_s=600, stop_grace_s=5)]
    return write_agent_config(tmp_path / "config.toml", tmp_path / "state" / "lynxtop.db",
                              tmp_path / "run" / "agent.sock", fake_nvml="sim", sample_interval_s=0.2,
                              default_profile="v4-tp8", autostart=True, backoff_initial_s=0.3, backoff_max_s=1,
                              gpu_release_timeout_s=10, profiles=profiles)


async def _bob_switches(a: Agent) -> int:
    """Bob, from another terminal: a switch to the slow v4-tp4; the id of its loading run."""
    code, body = await a.api("POST", "/v1/switch", {"profile": "v4-tp4"})
    assert code == 202, body
    st = await a.wait_state(lambda s: s["state"] == "starting" and s["profile"] == "v4-tp4" and s["run_id"],
                            what="bob's load")
    return st["serving"]["run_id"]


def _actions(tmp_path, kind: str) -> list[dict]:
    return state_db(tmp_path, "SELECT * FROM events WHERE kind = ?", (kind,))


async def test_expect_run_is_checked_like_every_other_field(tmp_path, cleanup):
    a = Agent(tmp_path, _config(tmp_path, 0.5))
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    run = st["serving"]["run_id"]
    for action, base in (("stop", {}), ("restart", {}), ("switch", {"profile": "v4-tp8"}), ("start", {})):
        for bad, code in (("1", "wrong_type"), (True, "wrong_type"), (1.0, "wrong_type"), ([run], "wrong_type"),
                          (0, "out_of_range"), (-1, "out_of_range"), (2**70, "out_of_range")):
            status, body = await a.api("POST", f"/v1/{action}", base | {"expect_run": bad})
            assert status == 400 and body["error"] == code, (action, bad, status, body)
            assert "expect_run" in body["message"]
    st = await a.status()
    assert st["serving"]["run_id"] == run and st["serving"]["state"] == "ready"
    a.stop()


async def test_actions_on_a_run_the_caller_did_not_see_are_refused_and_change_nothing(tmp_path, cleanup):
    a = Agent(tmp_path, _config(tmp_path))
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    run1 = st["serving"]["run_id"]
    run2 = await _bob_switches(a)
    assert run2 != run1
    # Alice confirms what she saw: run 1
    for action, body in (("stop", {}), ("restart", {}), ("switch", {"profile": "v4-tp8"}),
                         ("stop", {"cluster": False})):
        code, answer = await a.api("POST", f"/v1/{action}", body | {"expect_run": run1})
        assert code == 409 and answer["error"] == "run_changed", (action, code, answer)
        msg = answer["message"]
        assert f"you saw run {run1}" in msg and f"now run {run2}" in msg and "v4-tp4" in msg, msg
        assert "starting" in msg and msg.endswith("nothing done"), msg
        assert answer["details"]["expected_run"] == run1 and answer["details"]["run_id"] == run2
    # null: "I saw no run"; refused while one exists
    code, answer = await a.api("POST", "/v1/stop", {"expect_run": None})
    assert code == 409 and answer["error"] == "run_changed" and "you saw no run" in answer["message"], answer
    await asyncio.sleep(0.5)
    st = await a.status()
    assert st["serving"]["state"] == "starting" and st["serving"]["run_id"] == run2  # Bob's load goes on
    assert st["agent"]["action"]["action"] == "switch"
    assert not _actions(tmp_path, "action.stop") and not _actions(tmp_path, "action.restart")
    # the run she sees now: acted on
    code, answer = await a.api("POST", "/v1/stop", {"expect_run": run2})
    assert code == 202, answer
    await a.wait_state(lambda s: s["state"] == "stopped", what="stopped")
    # a stopped node: its last run is what a caller saw; a start against an older one is refused
    code, answer = await a.api("POST", "/v1/start", {"expect_run": run1})
    assert code == 409 and answer["error"] == "run_changed", answer
    code, answer = await a.api("POST", "/v1/start", {"profile": "v4-tp8", "expect_run": run2})
    assert code == 202, answer
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready again")
    run3 = st["serving"]["run_id"]
    code, answer = await a.api("POST", "/v1/restart", {"expect_run": run3})  # the field matches: acted on
    assert code == 202, answer
    await a.wait_state(lambda s: s["state"] == "ready" and s["run_id"] != run3, what="restarted")
    runs = {r["id"]: r for r in state_db(tmp_path, "SELECT * FROM runs")}
    assert runs[run2]["end_reason"] == "stopped by operator"  # only by the stop that named it
    a.stop()


def _args(a: Agent, cfg, yes: bool = False) -> Namespace:
    return Namespace(socket=a.sock_path, yes=yes, wait=False, cluster=False, config=str(cfg))


async def test_cli_prompt_answered_after_another_operators_switch_refuses(tmp_path, cleanup, monkeypatch, capsys):
    """The auditor's sequence: 'Now: ... profile v4-tp8, run 1', Bob switches while the prompt waits, Alice types
    y. The CLI looks again after the answer and refuses; Bob's load goes on."""
    cfg = _config(tmp_path)
    a = Agent(tmp_path, cfg)
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    run1 = st["serving"]["run_id"]
    loop = asyncio.get_running_loop()
    box: dict[str, int] = {}

    def answer(prompt: str) -> str:
        box["run2"] = asyncio.run_coroutine_threadsafe(_bob_switches(a), loop).result(30)
        return "y"

    monkeypatch.setattr(builtins, "input", answer)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    rc = await asyncio.to_thread(ctl.stop, _args(a, cfg))
    out, err = capsys.readouterr()
    assert rc == ctl.EXIT_RUN_CHANGED, (rc, out, err)
    assert f"run {run1}" in out and "v4-tp8" in out
    assert "run changed" in err and f"you saw run {run1} (v4-tp8)" in err and f"now run {box['run2']}" in err, err
    assert "nothing done" in err
    await asyncio.sleep(0.5)
    st = await a.status()
    assert st["serving"]["state"] == "starting" and st["serving"]["run_id"] == box["run2"]
    assert not _actions(tmp_path, "action.stop")
    a.stop()


async def test_cli_yes_sends_the_run_it_read_and_the_agent_refuses_a_change(tmp_path, cleanup, monkeypatch, capsys):
    """--yes asks nothing, but still sends the run it read: a switch landing between the read and the post is
    caught by the agent (the race the local look cannot close)."""
    cfg = _config(tmp_path)
    a = Agent(tmp_path, cfg)
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    run1 = st["serving"]["run_id"]
    loop = asyncio.get_running_loop()
    real = AgentClient.action
    box: dict[str, int] = {}
    sent: list[dict] = []

    def late(self, action, profile=None, **kw):
        box["run2"] = asyncio.run_coroutine_threadsafe(_bob_switches(a), loop).result(30)
        sent.append(dict(kw))
        return real(self, action, profile, **kw)

    monkeypatch.setattr(AgentClient, "action", late)
    rc = await asyncio.to_thread(ctl.restart, _args(a, cfg, yes=True))
    out, err = capsys.readouterr()
    assert sent and sent[0].get("expect_run") == run1
    assert rc == ctl.EXIT_RUN_CHANGED, (rc, out, err)
    assert "run_changed" in err and f"you saw run {run1}" in err and f"now run {box['run2']}" in err, err
    st = await a.status()
    assert st["serving"]["state"] == "starting" and st["serving"]["run_id"] == box["run2"]
    assert not _actions(tmp_path, "action.restart")
    a.stop()


async def test_cli_prompt_has_a_time_limit(tmp_path, cleanup, monkeypatch, capsys):
    """A prompt left open on a terminal must not act hours later: no answer in the limit, nothing done. On a real
    terminal (a pty here) a timely 'y' still stops, with the run it showed."""
    cfg = _config(tmp_path, 0.5)
    a = Agent(tmp_path, cfg)
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    run1 = st["serving"]["run_id"]
    master, slave = os.openpty()
    tty = open(slave, encoding="utf-8")  # noqa: SIM115 - closed below
    try:
        monkeypatch.setattr(sys, "stdin", tty)
        monkeypatch.setattr(ctl, "CONFIRM_TIMEOUT_S", 0.5)
        rc = await asyncio.to_thread(ctl.stop, _args(a, cfg))
        out, err = capsys.readouterr()
        assert rc == ctl.EXIT_FAILED and "no answer" in err and "nothing done" in err, (rc, out, err)
        st = await a.status()
        assert st["serving"]["state"] == "ready" and st["serving"]["run_id"] == run1
        monkeypatch.setattr(ctl, "CONFIRM_TIMEOUT_S", 20)
        os.write(master, b"y\n")
        rc = await asyncio.to_thread(ctl.stop, _args(a, cfg))
        out, err = capsys.readouterr()
        assert rc == 0, (out, err)
    finally:
        tty.close()
        os.close(master)
    await a.wait_state(lambda s: s["state"] == "stopped", what="stopped")
    runs = {r["id"]: r for r in state_db(tmp_path, "SELECT * FROM runs")}
    assert runs[run1]["end_reason"] == "stopped by operator"
    a.stop()
