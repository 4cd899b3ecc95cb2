"""vLLM's process shape and failure modes on real processes and signals: orphan, drain, exit 0, hang, OOM."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import psutil
from support.waits import holds, wait_for

from lynxtop.sim.gpus import SimScenario
from lynxtop.sim.state import load_state

STARTUP_LINES = ["Loading weights took", "Available KV cache memory", "GPU KV cache size",
                 "Maximum concurrency for", "Graph capturing finished", "init engine (profile, create kv cache",
                 "Starting vLLM server on http://127.0.0.1:", "Available routes are:",
                 "Route: /v1/completions, Methods: POST", "Application startup complete."]


def running(kit, sp) -> float:
    """vllm:num_requests_running as the page says it now."""
    for line in kit.http(sp.url + "/metrics")[1].decode().splitlines():
        if line.startswith("vllm:num_requests_running{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no vllm:num_requests_running on the page")


def gone(p: psutil.Process) -> bool:
    """The process has exited (a zombie counts): an orphan's exit is reaped by init at any moment, so a status read
    after is_running() may find no process at all."""
    try:
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def refused(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_startup_refuses_connections_until_ready_and_logs_vllms_milestones(start_sim):
    sp = start_sim(startup=1.5)
    wait_for(lambda: sp.engine_states(), what="engine state file")
    assert refused(sp.port)  # loading weights: nothing listens yet
    phases = {sp.engine_states()[0]["phase"]}
    sp.wait_ready()
    text = sp.text()
    positions = [text.find(m) for m in STARTUP_LINES]
    assert -1 not in positions and positions == sorted(positions), text
    assert "SIMULATED" in text.split("Loading weights")[0]  # the banner comes first
    assert "(EngineCore_DP0 pid=" in text
    assert "Starting vLLM API server" not in text  # 0.32 no longer prints the old wording
    assert phases <= {"loading weights", "kv cache", "cuda graphs", "ready"}


def test_old_version_logs_the_old_api_server_line_and_the_agent_reads_both(start_sim, tmp_path):
    from lynxtop.agent.serving import startup

    old = start_sim("--sim-vllm-version", "0.10")
    new = start_sim(state_dir=tmp_path / "other-node")  # its own GPUs: on shared ones the later load finds them full
    old.wait_ready()
    new.wait_ready()
    assert f"Starting vLLM API server 0 on http://127.0.0.1:{old.port}" in old.text()
    assert "Starting vLLM server on" not in old.text() and "Available routes are:" not in old.text()
    assert f"Starting vLLM server on http://127.0.0.1:{new.port}" in new.text()
    for sp in (old, new):  # the agent's phase parser reaches "api up" on either wording
        tracker = startup.PhaseTracker(sp.log_path, started_ms=0)
        tracker.poll(1)
        assert [m.phase for m in tracker.marks] == list(startup.PHASES), sp.text()


def test_sigkill_of_api_server_orphans_enginecore_holding_memory(start_sim):
    sp = start_sim(workers=True)
    sp.wait_ready()
    api = psutil.Process(sp.proc.pid)
    (engine,) = [c for c in api.children() if c.name() == "VLLM::EngineCore"]
    args = engine.cmdline()  # what setproctitle leaves: the title, NULs to the end of argv, no environment
    assert args[0] == "VLLM::EngineCore" and not any(args[1:]) and engine.environ() == {}
    workers = sorted(c.name() for c in engine.children())
    assert workers == [f"VLLM::Worker_TP{k}" for k in range(8)]
    scen = SimScenario(sp.state_dir)
    before = scen.state(0, time.monotonic())
    assert before.mem_used_bytes > 100 * 2**30 and len(before.processes) == 1
    assert before.processes[0][0] in {c.pid for c in engine.children()}  # worker k holds GPU k

    os.kill(sp.proc.pid, signal.SIGKILL)
    sp.proc.wait(timeout=5)
    holds(lambda: engine.is_running() and engine.status() != psutil.STATUS_ZOMBIE, 0.5,
          what="the EngineCore outliving its killed API server")
    held = SimScenario(sp.state_dir).state(3, time.monotonic() + 1)
    assert held.mem_used_bytes == before.mem_used_bytes  # the orphan still holds its memory
    assert load_state(next(sp.state_dir.glob("engine-*.state"))).phase == "orphaned"

    os.killpg(sp.pgid, signal.SIGTERM)  # what a supervisor must do: signal the whole group
    wait_for(lambda: gone(engine), what="engine exit")
    released = SimScenario(sp.state_dir).state(3, time.monotonic() + 2)
    assert released.mem_used_bytes == 0 and released.processes == []


def test_sigterm_drains_in_flight_requests_within_shutdown_timeout(start_sim, kit):
    sp = start_sim("--shutdown-timeout", "10", speed=10.0)
    sp.wait_ready()
    result = {}

    def request():
        result["r"] = kit.http(sp.url + "/v1/completions", {"prompt": "drain me", "max_tokens": 40}, timeout=20)

    t = threading.Thread(target=request)
    t.start()
    wait_for(lambda: running(kit, sp) >= 1, what="request running")
    os.kill(sp.proc.pid, signal.SIGTERM)
    code = sp.wait_exit(20)
    t.join(10)
    status, body = result["r"]
    assert code == 0
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 40  # finished, not aborted
    assert "Draining 1 in-flight requests" in sp.text()
    assert kit.group_members(sp.pgid) == []  # EngineCore went with it


def test_sigterm_without_shutdown_timeout_aborts_at_once(start_sim, kit):
    sp = start_sim(speed=1.0)
    sp.wait_ready()
    result = {}
    t = threading.Thread(target=lambda: result.update(r=kit.http(sp.url + "/v1/completions",
                                                                 {"prompt": "x", "max_tokens": 500}, timeout=20)))
    t.start()
    wait_for(lambda: running(kit, sp) >= 1, what="request running")
    os.kill(sp.proc.pid, signal.SIGTERM)
    assert sp.wait_exit(10) == 0
    t.join(10)
    status, body = result["r"]
    assert status == 200 and json.loads(body)["choices"][0]["finish_reason"] == "abort"


def test_engine_death_after_ready_exits_with_status_0(start_sim, kit):
    sp = start_sim("--sim-fail", "exit0-after=0.8")
    sp.wait_ready()
    assert sp.wait_exit(15) == 0  # vLLM's open bug: an unrequested exit with status 0
    text = sp.text()
    assert "EngineCore encountered a fatal error" in text and "EngineDeadError" in text
    assert kit.group_members(sp.pgid) == []
    assert SimScenario(sp.state_dir).state(0, time.monotonic()).mem_used_bytes == 0


def test_hang_keeps_health_200_but_produces_no_tokens(start_sim, kit):
    sp = start_sim("--sim-fail", "hang-after=0.3", env={"LYNXTOP_SIM_SPEED": "5"})
    sp.wait_ready()
    time.sleep(0.5)  # the scenario: the hang begins 0.3 s after start, so the request below comes after it
    def stuck_request():
        try:
            kit.http(sp.url + "/v1/completions", {"prompt": "x", "max_tokens": 50}, timeout=8)
        except OSError:
            pass  # the server is killed at teardown while this request still waits: that is the point

    threading.Thread(target=stuck_request, daemon=True).start()

    def gen_tokens() -> tuple[float, float]:
        text = kit.http(sp.url + "/metrics")[1].decode()
        vals = {}
        for line in text.splitlines():
            for key in ("vllm:generation_tokens_total{", "vllm:num_requests_running{", "vllm:num_requests_waiting{"):
                if line.startswith(key):
                    vals[key] = float(line.rsplit(" ", 1)[1])
        return vals["vllm:generation_tokens_total{"], (vals["vllm:num_requests_running{"]
                                                       + vals["vllm:num_requests_waiting{"])

    wait_for(lambda: gen_tokens()[1] >= 1, what="request queued")
    first = gen_tokens()
    holds(lambda: gen_tokens() == first, 1.0, what="tokens flat while requests are in flight")
    assert kit.http(sp.url + "/health")[0] == 200
    assert gen_tokens() == first  # requests in flight, tokens flat: only a progress check can tell
    st = SimScenario(sp.state_dir).state(0, time.monotonic())
    assert st.util_gpu_pct == 100 and st.tensor_active_pct == 0  # NCCL spin look


def test_oom_at_startup_exits_1_with_vllms_text_and_releases_memory(start_sim):
    sp = start_sim("--sim-fail", "oom", workers=True)
    assert sp.wait_exit(20) == 1
    text = sp.text()
    assert "torch.OutOfMemoryError: CUDA out of memory" in text
    assert "RuntimeError: Engine core initialization failed. See root cause above." in text
    assert "Application startup complete." not in text
    assert SimScenario(sp.state_dir).state(0, time.monotonic()).mem_used_bytes == 0


def test_leftover_orphan_memory_makes_the_next_start_fail(start_sim, tmp_path):
    first = start_sim()
    first.wait_ready()
    os.kill(first.proc.pid, signal.SIGKILL)  # leaves an orphaned EngineCore holding ~126 GiB per GPU
    first.proc.wait(5)
    second = start_sim(state_dir=first.state_dir)
    assert second.wait_exit(20) == 1
    assert "Free memory on device cuda:0" in second.text()
    assert "less than desired GPU memory utilization" in second.text()


def test_too_long_max_model_len_for_the_kv_cache_fails_startup(start_sim):
    sp = start_sim("--gpu-memory-utilization", "0.35", max_model_len=163840)
    assert sp.wait_exit(20) == 1
    assert "estimated maximum model length is" in sp.text()


async def test_sigterm_to_the_whole_group_with_streams_in_flight_exits_promptly(start_sim):
    """What a supervisor does: EngineCore dies at once too; open streams must still end, not hang the exit."""
    import asyncio

    import aiohttp

    sp = start_sim("--shutdown-timeout", "30", speed=1.0)
    sp.wait_ready()
    body = {"prompt": "x" * 40, "max_tokens": 2000, "stream": True}
    async with aiohttp.ClientSession() as s:
        responses = [await s.post(sp.url + "/v1/completions", json=body) for _ in range(3)]
        for r in responses:
            await r.content.readline()
        t0 = time.monotonic()
        os.killpg(sp.pgid, signal.SIGTERM)
        code = await asyncio.to_thread(sp.wait_exit, 15)
        for r in responses:
            r.close()
    assert code == 0
    assert time.monotonic() - t0 < 5  # not the 30 s drain: the engine is gone, nothing can finish
    assert kit_members(sp.pgid) == []


def kit_members(pgid: int) -> list[int]:
    alive = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p.pid)
        except (OSError, psutil.Error):
            continue
    return alive


def test_group_sigterm_ends_enginecore_and_all_workers_like_vllm(start_sim, kit):
    """A supervisor's SIGTERM to the whole group: the EngineCore logs vLLM's shutdown trigger and exits, its
    8 workers exit too, nothing of the tree is left and the GPU memory is released."""
    sp = start_sim(workers=True)
    sp.wait_ready()
    api = psutil.Process(sp.proc.pid)
    (engine,) = api.children()
    tree = [engine, *engine.children()]
    assert len(tree) == 9
    os.killpg(sp.pgid, signal.SIGTERM)
    assert sp.wait_exit(15) == 0
    gone, alive = psutil.wait_procs(tree, timeout=5)
    assert alive == [] and kit.group_members(sp.pgid) == []
    assert "[shutdown] EngineCore: trigger received signal=SIGTERM" in sp.text()
    assert SimScenario(sp.state_dir).state(0, time.monotonic()).mem_used_bytes == 0
    assert list(sp.state_dir.glob("engine-*.state")) == []


def test_group_sigterm_during_weight_loading_is_a_shutdown_not_a_failure(start_sim, kit):
    sp = start_sim(workers=True, startup=30.0)
    wait_for(lambda: any(s["phase"] == "loading weights" and len(s["holders"]) == 8 for s in sp.engine_states()),
             timeout=20, what="workers loading weights")
    (engine,) = psutil.Process(sp.proc.pid).children()
    tree = [engine, *engine.children()]
    os.killpg(sp.pgid, signal.SIGTERM)
    assert sp.wait_exit(15) == 0
    assert psutil.wait_procs(tree, timeout=5)[1] == [] and kit.group_members(sp.pgid) == []
    assert "Engine core initialization failed" not in sp.text()


def test_api_server_exit_without_sigkill_takes_the_enginecore_with_it(start_sim, kit):
    """Only a SIGKILL orphans the EngineCore. Any other end of the API server (here SIGINT, and the
    engine is told nothing else) leaves no process behind."""
    sp = start_sim(workers=True)
    sp.wait_ready()
    (engine,) = psutil.Process(sp.proc.pid).children()
    tree = [engine, *engine.children()]
    os.kill(sp.proc.pid, signal.SIGINT)
    assert sp.wait_exit(15) == 0
    assert psutil.wait_procs(tree, timeout=5)[1] == [] and kit.group_members(sp.pgid) == []


def test_tp1_deepseek_fails_with_vllms_message_and_a_simulator_hint(start_sim):
    sp = start_sim(tp=1)
    assert sp.wait_exit(20) == 1
    text = sp.text()
    assert "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`" in text
    assert "[SIMULATED] the weights take 275.67 GiB per GPU with TP=1" in text
    assert "RuntimeError: Engine core initialization failed" in text
    assert "Application startup complete." not in text


def test_no_sim_orphan_makes_the_engine_follow_its_api_server(start_sim):
    sp = start_sim("--no-sim-orphan", workers=True)
    sp.wait_ready()
    (engine,) = psutil.Process(sp.proc.pid).children()
    os.kill(sp.proc.pid, signal.SIGKILL)
    sp.proc.wait(5)
    wait_for(lambda: gone(engine), what="engine exit")
    wait_for(lambda: SimScenario(sp.state_dir).state(0, time.monotonic()).mem_used_bytes == 0, what="release")


def test_straggler_slows_the_engine_and_shows_on_its_gpu(start_sim, kit):
    sp = start_sim("--sim-fail", "straggler=2", env={"LYNXTOP_SIM_SPEED": "5"})
    sp.wait_ready()
    assert "GPU 2 is a straggler" in sp.text()
    assert kit.http(sp.url + "/v1/completions", {"prompt": "slow rank", "max_tokens": 20})[0] == 200
    state = sp.engine_states()[0]
    assert state["straggler_gpu"] == 2 and abs(state["straggler_slowdown"] - 1.3) < 1e-9
    scen = SimScenario(sp.state_dir)
    slow, other = scen.state(2, time.monotonic()), scen.state(5, time.monotonic())
    assert slow.throttle_reasons & 0x20 and slow.sm_clock_mhz < other.sm_clock_mhz
