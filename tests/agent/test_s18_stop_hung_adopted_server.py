"""An adopted server that was ready but no longer answers is not watched as "starting" for ever, unsaid (session 18).

A run adopted after it had become ready under the previous agent has no readiness deadline (so that a slow
`/health` right after an agent restart does not kill a healthy model). A vLLM hung in its shutdown (SIGTERMed by
someone while no agent ran, its drain stuck) then sat in "starting" for ever: the GPUs held, no event, no reason.
Now its silence is told once after `hang_timeout_s` (`serving.degraded.hang`, condition `unresponsive`, and the
status's reason), and it is treated as a hung server is: restarted only with `restart_on_hang`, never stopped as a
slow load.

Real Supervisors (one after the other, live restore between them) and a stand-in server stuck in its drain.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest

from lynxtop.agent.serving import procs

pytestmark = pytest.mark.timeout(120)


async def adopt_hung(make_sup, h, monkeypatch, agent: str):
    """A ready stand-in left by a first supervisor (live restore), SIGTERMed and stuck in its drain, adopted by a
    second one. (the second supervisor, the run id, the server's pid)."""
    monkeypatch.setenv("STANDIN_MODE", "drain")
    monkeypatch.setenv("STANDIN_DRAIN_S", "600")  # its SIGTERM handler blocks the server: /health never answers
    profiles = h.standin_profile("alpha", tp=8, readiness_s=4, stop_grace_s=2)
    first = make_sup(agent=agent, profiles=profiles)
    await first.start("alpha", by="test")
    await h.wait_for(lambda: first.state == "ready", 30, what="ready")
    run_id, pid = first.run_id, first.proc.pid
    await first.shutdown(stop_serving=False)  # live restore: the server stays, its record too
    os.kill(pid, signal.SIGTERM)  # someone else's SIGTERM: the server drains, and its drain hangs
    second = make_sup(agent=agent, profiles=profiles)
    await second.take_over(None)
    assert second.run_id == run_id and second.state == "starting", (second.run_id, second.state)
    return second, run_id, pid


def hang_events(h, store, run_id):
    store.flush()
    return [e for e in h.db_rows(store.path, "SELECT * FROM events WHERE kind = 'serving.degraded.hang'")
            if e["run_id"] == run_id]


async def test_an_adopted_ready_server_that_never_answers_is_told_not_killed(make_sup, h, monkeypatch, store):
    second, run_id, pid = await adopt_hung(make_sup, h, monkeypatch, "hang_timeout_s = 5\n")
    try:
        t0 = time.monotonic()
        await h.wait_for(lambda: hang_events(h, store, run_id), 30, what="the silence told")
        told_s = time.monotonic() - t0
        ev = hang_events(h, store, run_id)
        assert len(ev) == 1, ev
        assert json.loads(ev[0]["details"])["condition"] == "unresponsive", ev
        assert "since its adoption" in ev[0]["message"] and f"ps -fp {pid}" in ev[0]["message"], ev[0]["message"]
        assert 4 < told_s < 20, told_s
        assert "has not answered GET /health" in second.reason, second.reason
        await asyncio.sleep(3)
        assert procs.alive(pid) and second.run_id == run_id, "a ready model is not stopped on a guess"
        assert len(hang_events(h, store, run_id)) == 1
    finally:
        await second.shutdown(stop_serving=True)


async def test_with_restart_on_hang_it_is_restarted(make_sup, h, monkeypatch, store):
    second, run_id, pid = await adopt_hung(make_sup, h, monkeypatch, "hang_timeout_s = 5\nrestart_on_hang = true\n")
    try:
        await h.wait_for(lambda: second.run_id != run_id and second.state == "ready", 40, what="restarted")
        store.flush()
        rows = h.db_rows(store.path, "SELECT id, end_reason FROM runs WHERE id = ?", (run_id,))
        assert rows and rows[0]["end_reason"] == "restarted", rows
        assert not procs.alive(pid)
    finally:
        await second.shutdown(stop_serving=True)
