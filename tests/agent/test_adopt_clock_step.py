"""An adopted run still loading counts the readiness time it has used from its process's start on the boot clock:
a wall clock stepped forward while the agent was away (NTP) must not make the new agent kill a healthy loading
server at once as 'not ready within readiness_timeout_s' (it did, counting on the wall clock)."""

from __future__ import annotations

import time

import pytest

from lynxtop.agent.serving import procs

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("step_s", [0, 3600, -3600])
async def test_adopted_loading_run_survives_a_forward_clock_step(make_sup, store, h, monkeypatch, step_s):
    monkeypatch.setenv("STANDIN_STARTUP_S", "4")  # the stand-in takes ~4 s to become ready
    a = make_sup()
    await a.start("alpha", by="test")
    await h.wait_for(lambda: a.proc is not None and a.state == "starting", 10, what="starting")
    pid = a.proc.pid
    await a.shutdown(stop_serving=False)  # agent upgrade mid-load, live restore
    assert procs.alive(pid)

    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + step_s)  # NTP stepped the clock 1 h forward meanwhile
    b = make_sup()
    assert await b.adopt_previous()
    await h.wait_for(lambda: b.state in ("ready", "stopping", "stopped", "backoff", "crash_loop"), 20,
                     what="adopted run settles")
    state, reason = b.state, getattr(b, "reason", "")
    try:
        assert state == "ready", f"adopted loading run was {state}: {reason}"
        assert procs.alive(pid)
    finally:
        await b.shutdown(stop_serving=True)
