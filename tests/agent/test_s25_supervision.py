"""Session 25: supervision leftovers an operator could hit.

A server the agent holds (alive, carrying its run's token, but not provably the server, so never adopted) or one
whose record no agent can read kept serving while `lynxtop stop` answered "already stopped" (409, the CLI exits 0):
a runbook's `lynxtop stop && <maintenance>` went on with vLLM on the GPUs. An operator's stop now stops it.

Real agents, real simulated vLLM, real files and processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time

import pytest
from support.agent_proc import Agent, e2e_config, run_processes, state_db, stored_events
from support.serving_record import format_2, start_and_argv

from lynxtop.agent.serving import heldstop, procs

pytestmark = pytest.mark.timeout(150)


def _gone(pairs: set[tuple[int, int]]) -> bool:
    """Whether none of these processes (pid and start time: a reused pid is someone else) lives."""
    for pid, ticks in pairs:
        st = procs.stat(pid)
        if st is not None and st.start_ticks == ticks and st.state not in ("Z", "X"):
            return False
    return True


async def _ready_then_edited(tmp_path, cleanup, edit) -> tuple:
    """Agent A serves until ready and exits (live restore); serving.json is edited; agent B starts. Returns B, the
    server's pid, run id, token, every process of the run (with the engine, found by descent: it is retitled) and
    the last event id before B."""
    cfg = e2e_config(tmp_path)
    a = Agent(tmp_path, cfg, "a1")
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready", timeout=60)
    pid, run_id = st["serving"]["pid"], st["serving"]["run_id"]
    a.stop()  # live restore: the server keeps serving
    assert procs.alive(pid)
    state = tmp_path / "state" / "serving.json"
    rec = json.loads(state.read_text())
    token = rec["token"]
    family = {(p, s.start_ticks) for p in procs.run_processes(token, None, [pid]) if (s := procs.stat(p))}
    assert len(family) > 1, family  # the API server and its engine
    state.write_text(edit(rec))
    (tmp_path / "run" / "agent.serving.json").unlink()  # its copy gone too: the edited record is all there is
    since = state_db(tmp_path, "SELECT max(id) AS id FROM events")[0]["id"]
    b = Agent(tmp_path, cfg, "a2")
    cleanup.append(b)
    await b.wait_notify("READY=1", timeout=60)
    await stored_events(tmp_path, "agent.autostart_held", since)  # B decided: nothing adopted, the server left alone
    assert procs.alive(pid)
    return b, pid, run_id, token, family, since


async def _wait(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


async def _stopped(b: Agent, timeout: float = 30) -> None:
    """Serving stopped and no action under way (the stop's own slot given back)."""
    deadline = time.monotonic() + timeout
    while True:
        st = await b.status()
        if st["serving"]["state"] == "stopped" and st["agent"]["action"] is None:
            return
        assert time.monotonic() < deadline, f"not stopped: {st['serving']}, action {st['agent']['action']}"
        await asyncio.sleep(0.1)


async def test_an_operators_stop_stops_a_held_server_and_closes_its_run(tmp_path, cleanup):
    b, pid, run_id, token, family, since = await _ready_then_edited(tmp_path, cleanup, start_and_argv)
    held = await stored_events(tmp_path, "serving.not_adopted", since)
    assert json.loads(held[0]["details"])["held"] is True
    assert held[0]["run_id"] == run_id  # about the held run, listed with it (it carried no run)
    st = await b.status()
    assert st["serving"]["state"] == "stopped"
    assert f"pid {pid}" in st["serving"]["reason"] and "`lynxtop stop` ends it" in st["serving"]["reason"], st
    code, body = await b.api("POST", "/v1/stop", {})
    assert code == 202, body  # was 409 already_stopped: "nothing to do" while the model served on
    await _wait(lambda: _gone(family), 45, f"the held run's processes {family} still live after the stop")
    assert not run_processes(token)
    await _stopped(b)
    row = state_db(tmp_path, "SELECT ended_ms, end_reason FROM runs WHERE id = ?", (run_id,))[0]
    assert row["ended_ms"] and row["end_reason"] == "stopped by operator", row
    assert not (tmp_path / "state" / "serving.json").exists()  # the run is over: no agent is to look for it
    stopped = await stored_events(tmp_path, "serving.stopped", since)
    assert str(pid) in stopped[-1]["message"] and f"run {run_id}" in stopped[-1]["message"], stopped[-1]
    # and it is stopped for good: a second stop is the ask met
    code, body = await b.api("POST", "/v1/stop", {})
    assert code == 409 and body["error"] == "already_stopped", body
    assert b.stop() == 0


async def test_an_operators_stop_stops_a_server_whose_record_no_agent_reads(tmp_path, cleanup):
    b, pid, run_id, token, family, since = await _ready_then_edited(tmp_path, cleanup, format_2)
    code, body = await b.api("POST", "/v1/stop", {})
    assert code == 202, body
    await _wait(lambda: _gone(family), 45, f"the stray run's processes {family} still live after the stop")
    await _stopped(b)
    stopped = await stored_events(tmp_path, "serving.stopped", since)
    assert str(pid) in stopped[-1]["message"], stopped[-1]
    assert b.stop() == 0


async def test_a_start_after_a_stopped_run_is_not_told_as_that_runs(tmp_path, cleanup):
    """`action.start` was tagged with the last run (finished): a start after run 1's stop read as run 1's event."""
    b = Agent(tmp_path, e2e_config(tmp_path, autostart=False), "a1")
    cleanup.append(b)
    await b.wait_notify("READY=1", timeout=60)
    for n in (1, 2):
        code, body = await b.api("POST", "/v1/start", {})
        assert code == 202, body
        await _wait_state(b, "ready", 60)
        if n == 1:
            code, body = await b.api("POST", "/v1/stop", {})
            assert code == 202, body
            await _stopped(b, 60)
    starts = await stored_events(tmp_path, "action.start")
    told = [(e["run_id"], e["message"]) for e in starts]
    assert len(starts) == 2 and [e["run_id"] for e in starts] == [None, None], told
    assert b.stop() == 0


async def _wait_state(b: Agent, state: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (await b.status())["serving"]["state"] != state:
        assert time.monotonic() < deadline, f"not {state}"
        await asyncio.sleep(0.2)


async def test_a_stop_with_nothing_running_is_still_the_ask_met(tmp_path, cleanup):
    b = Agent(tmp_path, e2e_config(tmp_path, autostart=False), "a1")
    cleanup.append(b)
    await b.wait_notify("READY=1", timeout=60)
    code, body = await b.api("POST", "/v1/stop", {})
    assert code == 409 and body["error"] == "already_stopped", body
    assert b.stop() == 0


def _spawn(cmd: str, cwd, token: str | None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != procs.RUN_TOKEN_ENV}
    if token is not None:
        env[procs.RUN_TOKEN_ENV] = token
    return subprocess.Popen(["sh", "-c", cmd], cwd=cwd, env=env, start_new_session=True)


async def test_the_held_stop_ends_the_runs_processes_and_never_a_strangers(tmp_path):
    """A run's leader (token, started in the log dir, its own session) and its child that hides the token and
    ignores SIGTERM (vLLM's retitled EngineCore, stuck) are ended: SIGTERM, then SIGKILL after the grace. A process
    in the log dir without a token, and one with a token started elsewhere, are never signalled."""
    logs = tmp_path / "logs"
    logs.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    children = tmp_path / "child.pid"
    run = _spawn(f"env -u {procs.RUN_TOKEN_ENV} sh -c 'trap \"\" TERM; echo $$ > {children}; exec sleep 300' & "
                 "exec sleep 300", logs, "tok-run")
    stranger = _spawn("exec sleep 300", logs, None)
    elsewhere_run = _spawn("exec sleep 300", elsewhere, "tok-other")
    started = [run, stranger, elsewhere_run]
    try:
        await _wait(lambda: children.exists() and children.read_text().strip().isdigit(), 20, "the child's pid")
        child = int(children.read_text())
        await _wait(lambda: procs.title(child).startswith("sleep") and procs.title(run.pid).startswith("sleep"),
                    20, "both exec'd")
        held = await asyncio.to_thread(heldstop.look, os.path.realpath(logs))
        assert list(held.runs) == ["tok-run"] and set(held.pids()) == {run.pid, child}, held
        res = await heldstop.stop(held, grace_s=1.0, kill_wait_s=20)
        assert set(res.pids) == {run.pid, child} and res.killed == [child] and not res.survivors, res
        run.wait(10)
        assert not procs.alive(child)
        assert stranger.poll() is None and elsewhere_run.poll() is None
    finally:
        for p in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
        if children.exists() and children.read_text().strip().isdigit() and \
                procs.title(int(children.read_text())).startswith("sleep"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(children.read_text()), signal.SIGKILL)
