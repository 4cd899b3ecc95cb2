"""A run's retitled EngineCore and workers are found even when its API server dies before any look.

The simulator retitles its processes as real vLLM does (setproctitle, sim/proctitle.py): /proc/PID/environ of
EngineCore and its workers reads all NULs, so the run's token is gone from them within moments of their start, and
they survive a SIGKILL of the API server holding their GPUs. The agent knows them only by identity (pid and start
time) from a look while their leader lived, or by its process group while the leader's pid is held. Here the API
server is SIGKILLed as soon as EngineCore and its workers are up, seconds into the load, with nothing else of the
run left carrying the token; and once after the agent itself was SIGKILLed mid-load, leaving the run to the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from support.agent_config import SIM, sim_profile, write_agent_config
from support.agent_proc import Agent
from support.ports import free_port
from support.waits import wait_for, wait_for_async

from lynxtop.agent.serving import launcher, procs, runtmp

pytestmark = pytest.mark.timeout(120)

TP = 8  # EngineCore and a worker per GPU (the simulated model needs 8)


def _engine_and_workers(api_pid: int, token: str, timeout: float = 30) -> tuple[int, list[int]]:
    """EngineCore (child of the API server) and its TP workers, once each is retitled: its token no longer shows."""

    def look() -> tuple[int, list[int]] | None:
        try:
            engines = [c for c in psutil.Process(api_pid).children() if c.name() == "VLLM::EngineCore"]
            if len(engines) != 1:
                return None
            workers = [c for c in engines[0].children() if c.name().startswith("VLLM::Worker_TP")]
        except psutil.Error:
            return None
        if len(workers) != TP:
            return None
        pids = [engines[0].pid, *(w.pid for w in workers)]
        if any(procs.environ_value(p, procs.RUN_TOKEN_ENV) == token for p in pids):
            return None  # not retitled yet
        return engines[0].pid, sorted(w.pid for w in workers)

    return wait_for(look, timeout, what="EngineCore and its workers retitled")


def _others_with_token(token: str, skip: set[int]) -> list[int]:
    """Live processes besides `skip` still carrying the run's token (none: only identity can find the run)."""
    return [p for p in procs.all_pids() if p not in skip and procs.alive(p)
            and procs.environ_value(p, procs.RUN_TOKEN_ENV) == token]


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def test_the_engine_of_a_leader_killed_before_any_look_is_known_from_the_leaders_exit(tmp_path, monkeypatch):
    """The agent is the API server's parent: until it reaps it, the zombie holds its pid and so its group."""
    monkeypatch.setenv("LYNXTOP_SIM_STATE_DIR", str(tmp_path / "sim-state"))
    argv = [str(SIM), "serve", "m", "--host", "127.0.0.1", "--port", str(free_port()),
            "--tensor-parallel-size", str(TP), "--sim-startup-seconds", "60"]
    proc = launcher.spawn(argv, tmp_path / "logs" / "r.log", {}, "slow")
    proc.watch()
    engine, workers = _engine_and_workers(proc.pid, proc.record.token)
    run = [engine, *workers]
    try:
        assert proc.known == {}  # nothing looked at the run yet
        assert _others_with_token(proc.record.token, {proc.pid}) == []
        os.kill(proc.pid, signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), 10)  # the pidfd's reader ran on the loop
        assert all(procs.alive(p) for p in run)  # EngineCore outlives its API server, holding the GPUs
        assert set(run) <= set(proc.members()), "the retitled engine was lost with its API server"
        res = await proc.stop(grace_s=2, kill_wait_s=5)
        assert set(run) <= {o.pid for o in res.orphans} and not res.survivors
        assert not any(procs.alive(p) for p in run)
    finally:
        proc.close()
        _kill(run)


async def test_a_crash_seconds_into_the_load_leaves_no_retitled_engine_running(make_sup, store, h, tmp_path,
                                                                               monkeypatch):
    monkeypatch.setenv("LYNXTOP_SIM_STATE_DIR", str(tmp_path / "sim-state"))
    sup = make_sup(profiles=h.sim_profile("slow", tp=TP, startup_s=60, readiness_timeout_s=120, stop_grace_s=2))
    run: list[int] = []
    try:
        await sup.start("slow", by="test")
        await h.wait_for(lambda: sup.proc is not None, 20, what="the run started")
        api = sup.proc.pid
        engine, workers = _engine_and_workers(api, sup.proc.record.token)
        run = [engine, *workers]
        os.kill(api, signal.SIGKILL)  # seconds into the load
        await h.wait_for(lambda: not any(procs.alive(p) for p in run), 20,
                         what="the crashed run's EngineCore and workers stopped")

        def named() -> set[int]:  # recorded a moment after the kill
            store.flush()
            rows = h.db_rows(store.path, "SELECT details FROM events WHERE kind = 'serving.orphans'")
            return {o["pid"] for r in rows for o in json.loads(r["details"])["orphans"]}

        await h.wait_for(lambda: set(run) <= named(), 10, what="the orphans event naming EngineCore and workers")
    finally:
        await sup.shutdown(stop_serving=True)
        _kill(run)


def _serving_json(state_dir: Path) -> dict:
    try:
        return json.loads((state_dir / "serving.json").read_text())
    except (OSError, ValueError):
        return {}


async def test_an_agent_killed_mid_load_leaves_the_retitled_engine_to_the_next_one(tmp_path, cleanup):
    """SIGKILL of the agent mid-load, then of the API server: the next agent finds EngineCore and workers from the
    record serving.json kept of the run while it loaded, and stops them."""
    state = tmp_path / "state"
    prof = sim_profile("slow", tp=TP, startup_s=60, readiness_timeout_s=120)
    common = dict(fake_nvml="sim", sample_interval_s=0.2, default_profile="slow", gpu_release_timeout_s=10,
                  profiles=[prof])
    first = write_agent_config(tmp_path / "first.toml", state / "lynxtop.db", tmp_path / "run" / "agent.sock",
                               autostart=True, **common)
    a = Agent(tmp_path, first, "a1")
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "starting" and s["pid"], what="loading")
    api = st["serving"]["pid"]
    engine, workers = _engine_and_workers(api, _serving_json(state)["token"])
    run = [engine, *workers]
    try:
        ids = {p: procs.stat(p).start_ticks for p in run}
        # what the record says while the run loads: the retitled processes, by pid and start time
        wait_for(lambda: all([p, t] in _serving_json(state).get("members", []) for p, t in ids.items()), 15,
                 what=f"serving.json naming EngineCore and its workers {ids} while the run loads")
        a.stop(signal.SIGKILL)
        os.kill(api, signal.SIGKILL)
        wait_for(lambda: not procs.alive(api), 10, what="the API server's end")
        assert all(procs.alive(p) for p in run)
        second = write_agent_config(tmp_path / "second.toml", state / "lynxtop.db", tmp_path / "run" / "agent.sock",
                                    autostart=False, **common)
        b = Agent(tmp_path, second, "a2")
        cleanup.append(b)
        await b.wait_notify("READY=1")
        await wait_for_async(lambda: not any(procs.alive(p) for p in run), 20,
                             what="the previous run's EngineCore and workers stopped by the next agent")
        evs = (await b.api("GET", "/v1/events?since=0&limit=1000"))[1].get("events", [])
        told = [e for e in evs if e["kind"] == "serving.not_adopted"]
        assert told and set(run) <= set(told[0]["details"]["pids"]), told
        assert b.stop(signal.SIGTERM) == 0
    finally:
        _kill(run)


def test_a_retitled_process_of_an_earlier_run_keeps_the_stale_run_tmpdirs(tmp_path):
    """Its TMPDIR cannot be read (setproctitle leaves /proc/PID/environ all NULs, not empty): it may be in any."""
    root = tmp_path / "run-tmp"
    logs = tmp_path / "logs"
    stale = root / "deadbeef"
    for d in (stale, logs):
        d.mkdir(parents=True, mode=0o700)
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); from lynxtop.sim.proctitle import set_title; "
            "set_title('VLLM::EngineCore'); print('ok', flush=True); time.sleep(60)")
    engine = subprocess.Popen([sys.executable, "-c", code, "."], cwd=logs, stdout=subprocess.PIPE,
                              env={**os.environ, "TMPDIR": str(stale)})
    try:
        assert engine.stdout is not None and engine.stdout.readline() == b"ok\n"
        raw = procs.environ_raw(engine.pid)
        assert raw and not raw.strip(b"\0")  # what a retitled vLLM process shows
        removed, kept = runtmp.sweep(root, ["deadbeef"], logs, set())
        assert removed == [] and stale.is_dir(), kept
        assert any(str(engine.pid) in k for k in kept), kept
    finally:
        engine.kill()
        engine.wait()
    removed, _ = runtmp.sweep(root, ["deadbeef"], logs, set())
    assert removed == [str(stale)] and not stale.exists()  # once it is gone


def test_a_zombie_leader_with_the_recorded_start_holds_its_group_for_the_run():
    """Only the leader's own zombie (its start time) vouches for the group; a stranger's group of that number
    without a token or a known process is nobody's to signal."""
    me = os.getpid()
    leader = procs.ProcStat(pid=900001, comm="vllm", state="Z", ppid=me, pgid=900001, start_ticks=500)
    engine = procs.ProcStat(pid=900002, comm="VLLM::EngineCor", state="S", ppid=1, pgid=900001, start_ticks=510)
    table = {s.pid: s for s in (leader, engine)}
    no_token = lambda s: False  # noqa: E731 - retitled: nothing carries the token
    assert procs.members_in(table, "t" * 16, 900001, (), 500, no_token) == [900002]
    assert procs.members_in(table, "t" * 16, 900001, (), 499, no_token) == []  # another process on that pid
    assert procs.members_in({900002: engine}, "t" * 16, 900001, (), 500, no_token) == []  # reaped: unknown


def test_a_loading_run_is_looked_at_each_second_only_while_young(tmp_path):
    proc = launcher.spawn([sys.executable, "-c", "import time; time.sleep(30)"], tmp_path / "r.log", {}, "p")
    try:
        assert proc.look_due()  # never looked at
        proc.members()
        assert not proc.look_due()  # looked a moment ago
        wait_for(lambda: proc.look_due(), 30, what="the next look of a young run")
        proc.members()
        proc.record.start_ticks -= int((launcher.YOUNG_S + 1) * os.sysconf("SC_CLK_TCK"))  # as if a minute old
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2 * launcher.YOUNG_LOOK_S:
            assert not proc.look_due()  # past its first minute: the node's look every 5 s is enough
            time.sleep(0.1)
        assert proc.members_changed() and proc.record.members == [(proc.pid, procs.stat(proc.pid).start_ticks)]
        assert not proc.members_changed()  # the same processes: the record is not written again
    finally:
        proc.close()
        proc.popen.kill()
        proc.popen.wait()
