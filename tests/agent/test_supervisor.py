"""The supervisor against a real process tree (stand-in server with an engine child) and a real SQLite store."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from lynxtop.agent.api.control import ActionError
from lynxtop.agent.serving import procs
from lynxtop.agent.serving.health import HangDetector

pytestmark = pytest.mark.timeout(60)

ProcGpuView = db_rows = wait_for = None  # bound from the `h` fixture (tests import only lynxtop.*)


@pytest.fixture(autouse=True)
def _helpers(h):
    global ProcGpuView, db_rows, wait_for
    ProcGpuView, db_rows, wait_for = h.ProcGpuView, h.db_rows, h.wait_for


def events(store, kind_prefix: str = "") -> list[dict]:
    store.flush()
    return [e for e in db_rows(store.path, "SELECT * FROM events ORDER BY id") if e["kind"].startswith(kind_prefix)]


def run_row(store, run_id: int) -> dict:
    store.flush()
    return db_rows(store.path, "SELECT * FROM runs WHERE id = ?", (run_id,))[0]


async def start_ready(sup, profile="alpha"):
    seen: list[tuple[str, object]] = []

    async def observe():  # what an API request could see between two awaits of the agent
        while sup.state != "ready" or sup.action is not None:
            seen.append((sup.state, sup.action))
            # 0.5 ms, not sleep(0): a loop that never sleeps keeps the GIL, and the watch's member look in a worker
            # thread then waits up to 5 ms for it at each /proc read: readiness came 6-9 s late, after a simulator
            # set to exit 6 s after ready had exited (CI)
            await asyncio.sleep(0.0005)

    watcher = asyncio.create_task(observe())
    msg = await sup.start(profile, by="uid 0 (root) pid 1")
    assert profile in msg
    # 30 s: the start itself waits up to 5 s for a first GPU sample here (CI failed at 15 s)
    await wait_for(lambda: sup.state == "ready", 30, what="ready")
    await asyncio.wait_for(watcher, 5)
    # "ready" is never shown together with a busy action slot (a switch right after ready must be accepted)
    assert not [x for x in seen if x[0] == "ready"], [x for x in seen if x[0] == "ready"][:3]


async def test_start_ready_records_run_phases_and_clean_env(make_sup, store, monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    sup = make_sup()
    await start_ready(sup)
    run = run_row(store, sup.run_id)
    assert run["profile"] == "alpha" and run["pid"] == sup.proc.pid
    assert run["ready_ms"] >= run["started_ms"]
    assert run["vllm_version"] == "0.0.0-standin"
    assert json.loads(run["argv"])[1:3] == ["serve", "deepseek-ai/DeepSeek-V4.1"]
    assert run["gpu_count"] == 8 and json.loads(run["gpu_names"]) == ["NVIDIA H200"]
    phases = [m.phase for m in sup.serving_status().phases]
    assert phases == ["loading weights", "kv cache", "cuda graphs", "api up"]
    # the log is a file (0640), not a pipe; the child's environment has the profile's env and no systemd vars
    log_path = sup.proc.record.log_path
    assert stat.S_IMODE(os.stat(log_path).st_mode) == 0o640
    assert "Application startup complete" in Path(log_path).read_text()
    env = Path(f"/proc/{sup.proc.pid}/environ").read_bytes().split(b"\0")
    assert b"VLLM_LOGGING_LEVEL=INFO" in env
    assert not any(e.startswith((b"NOTIFY_SOCKET=", b"WATCHDOG_USEC=")) for e in env)
    assert os.getpgid(sup.proc.pid) == sup.proc.pid  # own process group
    assert len(sup.proc.members()) == 2  # server + engine
    # a second start is refused while serving
    with pytest.raises(ActionError) as exc:
        await sup.start(None, by="test")
    assert exc.value.http_status == 409
    await sup.stop(by="test")
    await wait_for(lambda: sup.state == "stopped" and sup.action is None, 15, what="stopped")
    assert run_row(store, sup.run_id)["end_reason"] == "stopped by operator"
    assert not sup.proc.members()
    assert not sup.state_path.exists()
    await sup.shutdown(stop_serving=True)


async def test_sigkill_crash_detected_restarted_no_orphans(make_sup, store):
    sup = make_sup()
    await start_ready(sup)
    old = sup.proc
    old_run = sup.run_id
    old_members = old.members()
    assert len(old_members) == 2
    t0 = time.monotonic()
    os.kill(old.pid, signal.SIGKILL)
    await wait_for(lambda: sup.state in ("stopping", "backoff"), 2.0, step=0.01, what="crash detected")
    detect = time.monotonic() - t0
    assert detect < 2.0
    await wait_for(lambda: sup.state == "ready" and sup.run_id != old_run, 15, what="restarted")
    for pid in old_members:  # the engine child of the killed server is gone too
        assert not procs.alive(pid), f"old run process {pid} still alive"
    row = run_row(store, old_run)
    assert row["exit_signal"] == signal.SIGKILL and row["end_reason"].startswith("crashed")
    crash = events(store, "serving.crash")[0]
    assert "SIGKILL" in crash["message"] and json.loads(crash["details"])["log_tail"]
    assert events(store, "serving.backoff")
    await sup.shutdown(stop_serving=True)


async def test_exit_zero_unasked_is_a_crash(make_sup, store, h, tmp_path, monkeypatch):
    # the real simulator: its engine "dies" and the API server exits 0, as vLLM can. 6 s after it is ready: the
    # agent must have seen it ready first (1.5 s was missed on CI's loaded machine, and the run never read ready)
    monkeypatch.setenv("LYNXTOP_SIM_STATE_DIR", str(tmp_path / "sim"))
    sup = make_sup(profiles=h.sim_profile("alpha", sim_args=("--sim-fail", "exit0-after=6")))
    await start_ready(sup)
    run_id = sup.run_id
    members = sup.proc.members()
    await wait_for(lambda: sup.state == "backoff", 30, what="backoff after exit 0")
    row = run_row(store, run_id)
    assert row["exit_code"] == 0 and "crashed" in row["end_reason"] and "exited with code 0" in row["end_reason"]
    assert all(not procs.alive(p) for p in members)
    await sup.stop(by="test")
    await wait_for(lambda: sup.state == "stopped", 10)
    await sup.shutdown(stop_serving=True)


async def test_crash_loop_gives_up_and_operator_can_start_again(make_sup, store, h, tmp_path, monkeypatch):
    monkeypatch.setenv("LYNXTOP_SIM_STATE_DIR", str(tmp_path / "sim"))
    sup = make_sup(profiles=h.sim_profile("oom", sim_args=("--sim-fail", "oom")) + h.sim_profile("good"))
    await sup.start("oom", by="test")
    await wait_for(lambda: sup.state == "crash-loop", 40, what="crash loop")
    assert sup.serving_status().failures_in_window == 3
    assert sup.next_retry_ms is None
    assert len(db_rows(store.path, "SELECT id FROM runs")) == 3
    time_in_loop = time.monotonic()
    await wait_for(lambda: time.monotonic() - time_in_loop > 1.0, 2)
    assert sup.state == "crash-loop"  # no retries while waiting for an operator
    assert len(db_rows(store.path, "SELECT id FROM runs")) == 3
    ev = events(store, "serving.crash_loop")[0]
    assert ev["severity"] == "critical" and "CUDA out of memory" in ev["details"]
    # an agent restart does not autostart the same failure again
    again = make_sup(profiles=h.sim_profile("oom", sim_args=("--sim-fail", "oom")) + h.sim_profile("good"))
    assert not await again.adopt_previous() and again.restore_crash_loop()
    assert again.state == "crash-loop" and again.profile_name == "oom"
    await again.shutdown(stop_serving=True)
    await sup.switch("good", by="operator")  # an operator acts: the count starts over
    await wait_for(lambda: sup.state == "ready", 20, what="ready after switch")
    assert sup.serving_status().failures_in_window == 0
    assert not sup.restore_crash_loop()  # acknowledged by the switch: nothing held over any more
    await sup.shutdown(stop_serving=True)


def progress(sup, hang: HangDetector, running, tokens, now, waiting=None) -> None:
    """What the agent's tick does with the scraper's counters: a verdict, if any, goes to the supervisor."""
    verdict = hang.observe(running, tokens, waiting, now=now)
    if verdict is not None:
        sup.on_verdict(verdict)


async def test_hang_marks_degraded_and_recovers(make_sup, store):
    sup = make_sup('hang_timeout_s = 5')
    await start_ready(sup)
    hang = HangDetector(sup.cfg.agent.hang_timeout_s)
    t = 1000.0
    progress(sup, hang, 3, 100, now=t)
    progress(sup, hang, 3, 100, now=t + 4)
    assert sup.state == "ready"
    progress(sup, hang, 3, 100, now=t + 5.5)
    assert sup.state == "degraded" and "hang" in sup.reason
    assert sup.serving_status().degraded == ("hang",)  # what the hang alert reads (lynxtop_serving_degraded)
    assert events(store, "serving.degraded.hang")
    progress(sup, hang, 3, 150, now=t + 6)
    assert sup.state == "ready" and sup.serving_status().degraded == ()
    assert events(store, "serving.recovered.hang")
    # restart_on_hang is off by default: nothing restarted, nor scheduled (a restart begins after the verdict)
    assert sup.action is None and sup.restarts == 0 and sup.proc.leader_alive()
    await sup.shutdown(stop_serving=True)


async def test_hang_with_requests_only_waiting(make_sup, store):
    """An engine hung before it scheduled anything: 0 running, requests waiting, no token."""
    sup = make_sup('hang_timeout_s = 5')
    await start_ready(sup)
    hang = HangDetector(sup.cfg.agent.hang_timeout_s)
    progress(sup, hang, 0, 100, waiting=4, now=0)
    progress(sup, hang, 0, 100, waiting=4, now=4)
    assert sup.state == "ready"
    progress(sup, hang, 0, 100, waiting=4, now=5.5)
    assert sup.state == "degraded" and "0 requests running, 4 waiting" in sup.reason
    progress(sup, hang, 0, 100, waiting=0, now=6)  # nothing asked any more: not hung
    assert sup.state == "ready"
    await sup.shutdown(stop_serving=True)


async def test_hang_restart_when_enabled(make_sup, store):
    sup = make_sup('hang_timeout_s = 5\nrestart_on_hang = true')
    await start_ready(sup)
    hang = HangDetector(sup.cfg.agent.hang_timeout_s)
    first = sup.run_id
    progress(sup, hang, 2, 10, now=0)
    progress(sup, hang, 2, 10, now=6)
    await wait_for(lambda: sup.run_id != first and sup.state == "ready", 15, what="restart after hang")
    assert run_row(store, first)["end_reason"] == "restarted"
    await sup.shutdown(stop_serving=True)


async def test_switch_frees_gpus_before_new_start(make_sup, store):
    gpus = ProcGpuView()
    sup = make_sup(gpus=gpus)
    await start_ready(sup, "alpha")
    old_run, old_pids = sup.run_id, sup.proc.members()
    msg = await sup.switch("beta", by="uid 1000 (alice)")
    assert "alpha" in msg and "beta" in msg
    with pytest.raises(ActionError) as exc:  # one action at a time
        await sup.restart(by="uid 1001 (bob)")
    assert exc.value.code == "busy" and "switch" in exc.value.message and "alice" in exc.value.message
    await wait_for(lambda: sup.action is None and sup.state == "ready", 20, what="switch done")
    assert sup.profile_name == "beta" and sup.run_id != old_run
    new_run = run_row(store, sup.run_id)
    assert new_run["profile"] == "beta"
    assert run_row(store, old_run)["end_reason"] == "switched to beta"
    # the new server started only after no old process held the (fake) GPUs
    started = new_run["started_ms"]
    exited = [e for e in events(store, "serving.exited") if e["run_id"] == old_run][0]
    assert exited["ts_ms"] <= started
    assert all(not procs.alive(p) for p in old_pids)
    # the slot frees as the run turns ready; the action's task writes its event on its next turn
    await wait_for(lambda: events(store, "action.switch.done"), 30, what="the switch's done event")
    await sup.shutdown(stop_serving=True)


async def test_switch_preflight_failures_change_nothing(make_sup, store, tmp_path):
    sup = make_sup(gpus=ProcGpuView(count=2))
    with pytest.raises(ActionError) as exc:
        await sup.switch("alpha", by="test")
    assert exc.value.http_status == 422 and "needs 8 GPUs" in exc.value.message and "2 visible" in exc.value.message
    with pytest.raises(ActionError) as exc:
        await sup.switch("nope", by="test")
    assert exc.value.http_status == 404 and "alpha" in exc.value.message
    assert sup.state == "stopped" and sup.proc is None and sup.action is None


async def test_stop_preempts_a_start_waiting_for_readiness(make_sup, store, monkeypatch):
    monkeypatch.setenv("STANDIN_STARTUP_S", "30")
    sup = make_sup()
    await sup.start("alpha", by="test")
    await wait_for(lambda: sup.state == "starting", 30)
    with pytest.raises(ActionError):
        await sup.restart(by="other")  # busy
    await sup.stop(by="operator")
    assert sup.action is not None and sup.action["action"] == "stop"  # the stop holds the slot now
    with pytest.raises(ActionError) as exc:
        await sup.start("beta", by="other")
    assert exc.value.http_status == 409
    await wait_for(lambda: sup.state == "stopped" and sup.action is None, 15, what="stopped")
    assert not sup.proc.members()
    await sup.shutdown(stop_serving=True)


async def test_sigterm_ignored_gets_sigkill_after_grace(make_sup, store, monkeypatch):
    monkeypatch.setenv("STANDIN_MODE", "ignore_term")
    sup = make_sup()
    await start_ready(sup)
    members = sup.proc.members()
    t0 = time.monotonic()
    await sup.stop(by="test")
    await wait_for(lambda: sup.state == "stopped", 15)
    assert time.monotonic() - t0 >= 2.5  # waited the profile's grace (3 s) before SIGKILL
    assert all(not procs.alive(p) for p in members)
    assert run_row(store, sup.run_id)["exit_signal"] == signal.SIGKILL
    await sup.shutdown(stop_serving=True)


async def test_adopt_after_agent_dies_keeps_run_without_restart(make_sup, store):
    a = make_sup()
    await start_ready(a)
    pid, run_id = a.proc.pid, a.run_id
    await a.shutdown(stop_serving=False)  # the agent goes away, serving stays (live restore)
    assert procs.alive(pid)
    b = make_sup()
    assert await b.adopt_previous()
    await wait_for(lambda: b.state == "ready", 10, what="adopted ready")
    assert b.run_id == run_id and b.proc.pid == pid and b.adopted
    assert len(db_rows(store.path, "SELECT id FROM runs")) == 1
    assert events(store, "serving.adopted")
    os.kill(pid, signal.SIGKILL)  # exits of an adopted server are seen through the pidfd
    await wait_for(lambda: b.state in ("stopping", "backoff"), 3, what="adopted crash seen")
    await b.shutdown(stop_serving=True)


async def test_stale_record_is_not_adopted_and_leftovers_are_killed(make_sup, store):
    """The recorded pid now belongs to a stranger (no run token): the run's leftovers are killed, never the
    stranger."""
    a = make_sup()
    await start_ready(a)
    members = a.proc.members()
    rec = json.loads(a.state_path.read_text())
    await a.shutdown(stop_serving=False)
    stranger = subprocess.Popen(["sleep", "60"])  # noqa: S603, S607 - as if the pid had been reused
    try:
        rec["pid"] = stranger.pid
        a.state_path.write_text(json.dumps(rec))
        b = make_sup()
        assert not await b.adopt_previous()
        await wait_for(lambda: all(not procs.alive(p) for p in members), 10, what="the run's leftovers killed")
        assert stranger.poll() is None  # never signalled
        ev = events(store, "serving.not_adopted")[0]
        assert "start time differs" in ev["message"]
        assert "lost while the agent was down" in run_row(store, rec["run_id"])["end_reason"]
        await b.shutdown(stop_serving=True)
    finally:
        stranger.kill()
        stranger.wait()


async def test_a_record_whose_start_time_alone_is_wrong_is_adopted_not_killed(make_sup, store):
    """The pid carries the run's token, runs the recorded argv and leads its group: the start time in the record is
    what is wrong (a hand edit, another version), and the live server is adopted, never signalled."""
    a = make_sup()
    await start_ready(a)
    members = a.proc.members()
    rec = json.loads(a.state_path.read_text())
    await a.shutdown(stop_serving=False)
    rec["start_ticks"] += 1
    a.state_path.write_text(json.dumps(rec))
    b = make_sup()
    assert await b.adopt_previous()
    assert b.proc is not None and b.proc.pid == rec["pid"]
    assert all(procs.alive(p) for p in members)
    await b.shutdown(stop_serving=True)


async def test_failed_switch_says_how_to_switch_back(make_sup, store, h, tmp_path, monkeypatch):
    monkeypatch.setenv("LYNXTOP_SIM_STATE_DIR", str(tmp_path / "sim"))
    sup = make_sup(profiles=h.sim_profile("good") + h.sim_profile("bad", sim_args=("--sim-fail", "oom")))
    await start_ready(sup, "good")
    await sup.switch("bad", by="uid 1000 (alice)")
    await wait_for(lambda: sup.action is None, 30, what="switch finished")
    ev = await wait_for(lambda: events(store, "action.switch.failed"), 30, what="the switch's failed event")
    assert ev and "switch back with `lynxtop switch good`" in ev[0]["message"]
    assert sup.state in ("backoff", "starting", "stopping")  # the new profile keeps retrying until told otherwise
    for _ in range(50):  # switching back is allowed (a retry being spawned right now is "busy" for a moment)
        try:
            await sup.switch("good", by="uid 1000 (alice)")
            break
        except ActionError as exc:
            assert exc.code == "busy" and "retry" in exc.message
            await asyncio.sleep(0.05)
    await wait_for(lambda: sup.state == "ready" and sup.profile_name == "good", 30, what="switched back")
    await sup.shutdown(stop_serving=True)


async def test_readiness_timeout_stops_the_run_and_backs_off(make_sup, store, h, monkeypatch):
    monkeypatch.setenv("STANDIN_STARTUP_S", "30")  # the port stays closed: "loading" forever
    sup = make_sup(profiles=h.standin_profile("slow", readiness_s=1, stop_grace_s=2))
    await sup.start("slow", by="test")
    await wait_for(lambda: sup.state == "starting" and sup.run_id is not None, 10, what="spawned")
    run_id = sup.run_id
    members = sup.proc.members()
    await wait_for(lambda: sup.state == "backoff", 15, what="backoff after readiness timeout")
    assert all(not procs.alive(p) for p in members)
    assert run_row(store, run_id)["end_reason"] == "not ready within 1 s"
    ev = events(store, "serving.readiness_timeout")[0]
    assert "phase: loading weights" in ev["message"]
    await sup.stop(by="test")
    await wait_for(lambda: sup.state == "stopped", 10)
    await sup.shutdown(stop_serving=True)
