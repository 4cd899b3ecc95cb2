"""A frozen server (SIGSTOP: /health never answers, no counters) is a hang for `restart_on_hang` (issue 24.5)."""

from __future__ import annotations

import contextlib
import os
import signal

import pytest
from support.agent_proc import Agent, e2e_config, state_db

from lynxtop.agent.serving import procs

wait_for = db_rows = None  # bound from the `h` fixture (tests import only lynxtop.*)


@pytest.fixture(autouse=True)
def _helpers(h):
    global wait_for, db_rows
    wait_for, db_rows = h.wait_for, h.db_rows


@pytest.mark.timeout(90)
async def test_frozen_server_is_restarted_with_restart_on_hang(make_sup, store):
    """The stand-in vLLM is SIGSTOPped while ready: /health goes unanswered. After hang_timeout_s of silence
    the run is hung (degraded, condition hang) and, with restart_on_hang, restarted; before, nothing happened
    but 'degraded: /health failing' for as long as it stayed frozen."""
    sup = make_sup("hang_timeout_s = 5\nrestart_on_hang = true")
    await sup.start("alpha", by="uid 0 (root)")
    await wait_for(lambda: sup.state == "ready" and sup.action is None, 15, what="ready")
    first, pid = sup.run_id, sup.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        await wait_for(lambda: sup.run_id != first and sup.state == "ready" and sup.action is None, 60,
                       what="a new run after the frozen one")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    store.flush()
    hangs = db_rows(store.path, "SELECT * FROM events WHERE kind = 'serving.degraded.hang' AND run_id = ?", (first,))
    assert len(hangs) == 1 and "GET /health unanswered" in hangs[0]["message"], hangs
    old = db_rows(store.path, "SELECT * FROM runs WHERE id = ?", (first,))[0]
    assert old["end_reason"] == "restarted"
    assert not procs.alive(pid)
    await sup.shutdown(stop_serving=True)


@pytest.mark.timeout(120)
async def test_agent_restarts_a_frozen_simulated_vllm(tmp_path, cleanup):
    """The same on a real agent and the project's simulated vLLM: the SIGSTOPped server is replaced by a new
    run, and the hang event says /health went unanswered."""
    a = Agent(tmp_path, e2e_config(tmp_path, extra_agent="hang_timeout_s = 5\nrestart_on_hang = true"), "a1")
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    first, pid = st["serving"]["run_id"], st["serving"]["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        await a.wait_state(lambda s: s["state"] == "ready" and s["run_id"] != first, timeout=60,
                           what="a new run after the frozen one")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    hangs = state_db(tmp_path, "SELECT message FROM events WHERE kind = 'serving.degraded.hang' AND run_id = ?",
                     (first,))
    assert len(hangs) == 1 and "GET /health unanswered" in hangs[0]["message"], hangs
    assert state_db(tmp_path, "SELECT end_reason FROM runs WHERE id = ?", (first,))[0]["end_reason"] == "restarted"
    assert not procs.alive(pid)
    assert a.stop() == 0
