"""A `start` during a backoff never spawns a second vLLM beside the agent's own retry (session 18).

Serving backs off after a crash; a raw API caller (no `expect_run`) asks for a start. Its checks (free disk,
strays, the port, the GPUs) await; the backoff's retry fired in that window and spawned run N+1, then the start
took the slot the retry had already freed and spawned run N+2 on the same GPUs. `stop` then stopped only the
current run, leaving the other loading, unsupervised. Now the start re-checks serving's state and the slot with no
await before it takes the slot, `launch` refuses while the current run is unfinished (never replaces it), the retry
holds the action slot until its run is ready or failed (a stop, restart or switch may replace it while it only
waits), and the refusal says the agent is loading its own retry rather than calling it a stray to be stopped.

Real Supervisor, real stand-in servers (tests/agent/standin_vllm.py), real /proc scans.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from support.agent_proc import run_leaders

from lynxtop.agent.api.control import ActionError
from lynxtop.agent.serving import diskspace, procs

pytestmark = pytest.mark.timeout(120)


def nvml_like(h):
    class NvmlLike(h.ProcGpuView):
        """As NVML lists them: a process shows on the GPUs once it has opened its CUDA context, seconds after its
        spawn (vLLM imports torch first), not at once."""

        def compute_pids(self):
            seen = super().compute_pids()
            if seen is None:
                return None
            ts, pids = seen
            return ts, {p for p in pids if procs.stat(p) is not None and (procs.age_s(procs.stat(p).start_ticks) or 0)
                        > 2.0}

    return NvmlLike()


async def crash_into_backoff(sup, h):
    await sup.start("alpha", by="test")
    await h.wait_for(lambda: sup.state == "ready", 30, what="ready")
    crashed = sup.run_id
    os.kill(sup.proc.pid, signal.SIGKILL)
    await h.wait_for(lambda: sup.state == "backoff", 20, what="backoff")
    return crashed


async def test_start_during_backoff_never_spawns_a_second_server(make_sup, h, tmp_path, monkeypatch, reap):
    monkeypatch.setenv("STANDIN_STARTUP_S", "2.5")  # each load takes 2.5 s (a 20-minute load, scaled)
    sup = make_sup(profiles=h.standin_profile("alpha", tp=8, readiness_s=30), gpus=nvml_like(h))
    await crash_into_backoff(sup, h)
    real = procs.port_holders
    calls = []

    def slow_scan(*a):  # a busy node: the first /proc/net + fd scan takes 1.5 s, the retry fires meanwhile
        calls.append(a)
        if len(calls) == 1:
            time.sleep(1.5)
        return real(*a)

    monkeypatch.setattr(procs, "port_holders", slow_scan)
    # a script (curl on the socket, an older client) asks for a start without expect_run while serving backs off
    with pytest.raises(ActionError) as refused:
        await sup.start("alpha", by="uid 1000 (alice) pid 4242")
    msg = refused.value.message
    await asyncio.sleep(1.0)
    leaders = run_leaders(tmp_path)
    await sup.stop(by="test")
    await h.wait_for(lambda: sup.state == "stopped", 30, what="stopped")
    left = run_leaders(tmp_path)
    assert len(leaders) <= 1, f"two vLLM servers at once: {leaders}"
    assert not left, f"servers left running after `lynxtop stop` (unsupervised): {left}"
    # the refusal names the agent's own retry, never advice to stop it as a stray
    assert "could not be adopted" not in msg and "stop them" not in msg, msg
    assert "the agent" in msg and "retry after a crash" in msg, msg
    await sup.shutdown(stop_serving=True)


async def test_launch_refuses_while_the_current_run_is_unfinished(make_sup, h, tmp_path, reap):
    sup = make_sup(profiles=h.standin_profile("alpha", tp=8, readiness_s=30))
    await sup.start("alpha", by="test")
    await h.wait_for(lambda: sup.state == "ready", 30, what="ready")
    run, pid = sup.run, sup.proc.pid
    with pytest.raises(RuntimeError) as refused:  # lifecycle.LiveRunError
        await sup.runs.launch(sup.profile, "a bug's second launch")
    assert f"run {run.run_id}" in str(refused.value), refused.value
    assert sup.run is run and sup.state == "ready"
    assert run_leaders(tmp_path) == [pid]
    await sup.shutdown(stop_serving=True)
    assert not run_leaders(tmp_path)


async def test_the_retry_holds_the_slot_until_its_run_is_ready(make_sup, h, tmp_path, monkeypatch, reap):
    monkeypatch.setenv("STANDIN_STARTUP_S", "2.0")
    sup = make_sup(profiles=h.standin_profile("alpha", tp=8, readiness_s=30))
    crashed = await crash_into_backoff(sup, h)
    await h.wait_for(lambda: sup.state == "starting" and sup.run_id not in (None, crashed), 20, what="retry loads")
    assert sup.action is not None and sup.action["action"] == "retry", sup.action
    with pytest.raises(ActionError) as refused:
        await sup.start("alpha", by="uid 1000 (alice)")
    msg = refused.value.message
    assert f"the agent is loading run {sup.run_id}" in msg and "retry after a crash" in msg, msg
    assert "could not be adopted" not in msg
    await h.wait_for(lambda: sup.state == "ready", 30, what="ready")
    await h.wait_for(lambda: sup.action is None, 5, what="slot freed at readiness")
    assert len(run_leaders(tmp_path)) == 1
    await sup.shutdown(stop_serving=True)


async def test_a_restart_replaces_a_retry_that_only_waits_for_its_load(make_sup, h, tmp_path, monkeypatch, reap,
                                                                       store):
    monkeypatch.setenv("STANDIN_STARTUP_S", "3.0")
    # as NVML lists them (a process shows once it has a CUDA context): the interpreter's launcher shims of a load
    # that just spawned, gone a moment later, are not on the GPUs
    sup = make_sup(profiles=h.standin_profile("alpha", tp=8, readiness_s=30), gpus=nvml_like(h))
    crashed = await crash_into_backoff(sup, h)
    await h.wait_for(lambda: sup.state == "starting" and sup.run_id not in (None, crashed), 20, what="retry loads")
    retry_run = sup.run_id
    await sup.restart(by="uid 1000 (alice)")
    await h.wait_for(lambda: sup.state == "ready" and sup.run_id not in (crashed, retry_run), 40, what="restarted")
    assert len(run_leaders(tmp_path)) == 1
    store.flush()
    rows = h.db_rows(tmp_path / "state" / "lynxtop.db", "SELECT id, end_reason FROM runs ORDER BY id")
    assert [r["end_reason"] for r in rows if r["id"] == retry_run] == ["restarted"], rows
    await sup.shutdown(stop_serving=True)


async def test_a_start_whose_stray_check_finds_the_retrys_load_names_the_retry(make_sup, h, tmp_path, monkeypatch,
                                                                               reap):
    """The retry spawns while the start checks the free disk; its processes are then found by the strays scan.
    That refusal told the operator to stop "processes of an earlier run that could not be adopted": the load."""
    monkeypatch.setenv("STANDIN_STARTUP_S", "3.0")
    sup = make_sup(profiles=h.standin_profile("alpha", tp=8, readiness_s=30), gpus=nvml_like(h))
    crashed = await crash_into_backoff(sup, h)
    real = diskspace.refuse_if_short

    async def slow_disk_check(*a, **kw):  # a slow statvfs (an NFS log directory): the retry fires meanwhile
        await h.wait_for(lambda: sup.run_id not in (None, crashed) and sup.state == "starting", 20,
                         what="the retry's spawn")
        return await real(*a, **kw)

    monkeypatch.setattr(diskspace, "refuse_if_short", slow_disk_check)
    with pytest.raises(ActionError) as refused:
        await sup.start("alpha", by="uid 1000 (alice)")
    msg = refused.value.message
    assert "could not be adopted" not in msg and "stop them" not in msg, msg
    assert f"the agent is loading run {sup.run_id}" in msg and "retry after a crash" in msg, msg
    assert len(run_leaders(tmp_path)) == 1
    await sup.shutdown(stop_serving=True)
