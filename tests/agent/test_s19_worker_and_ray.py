"""s19: a Ray worker serves nothing (restart and switch refused as start is); an adopted Ray keeps its own address
and dashboard until Ray next starts; a `ray start` not up in time says why, and goes on waiting.

Real agent processes and RayNodes running a stand-in `ray` script (the set-up of the s19 audit's scratch tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from support.agent_config import agent_toml, sim_profile
from support.agent_proc import Agent
from support.ports import free_port

from lynxtop.agent.cluster.raynode import RayNode
from lynxtop.contract.config import parse_config
from lynxtop.contract.events import EventKind, Severity
from lynxtop.contract.status import RayState

HEAD = "10.0.0.1:6379"

# `ray start --block` stand-in: says it started (the head's also serves a state API on its --dashboard-port,
# naming itself by its --port), then blocks; SIGTERM ends it
FAKE_RAY = textwrap.dedent("""\
    #!{python}
    import json, signal, sys, threading, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    args = sys.argv[1:]
    if "--head" in args:
        gcs = args[args.index("--port") + 1]
        node = {{"node_id": "gcs-" + gcs, "node_ip": "127.0.0.1", "is_head_node": True, "state": "ALIVE",
                 "resources_total": {{"GPU": 8.0}}}}
        body = json.dumps({{"result": True, "data": {{"result": {{"result": [node]}}}}}}).encode()

        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        srv = ThreadingHTTPServer(("127.0.0.1", int(args[args.index("--dashboard-port") + 1])), H)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    print("Ray runtime started.", flush=True)
    while True:
        time.sleep(1)
""")

# a worker's `ray start` whose head does not answer: it retries (and ignores SIGTERM meanwhile, as the audit saw
# Ray do) until the file named by its environment appears, then it is up
UNREACHABLE_RAY = textwrap.dedent("""\
    #!{python}
    import os, signal, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while not os.path.exists(os.environ["HEAD_BACK"]):
        print("Failed to connect to GCS at address 10.0.0.1:6379 within 5 seconds \\x1b[2J" + "x" * 400, flush=True)
        time.sleep(0.2)
    print("Ray runtime started.", flush=True)
    while True:
        time.sleep(1)
""")


def write_exe(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.format(python=sys.executable))
    path.chmod(0o755)
    return path


async def until(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = await pred()
        if got:
            return got
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def kill_group(pid: int | None) -> None:
    if pid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


# ------------------------------------------------------------------------------------------ H1, L3: a worker


async def test_worker_refuses_restart_and_switch_as_start_and_the_cli_says_why(tmp_path, cleanup):
    exe = write_exe(tmp_path / "bin" / "ray", FAKE_RAY)
    text = agent_toml(tmp_path / "state" / "lynxtop.db", tmp_path / "run" / "agent.sock", role="worker",
                      fake_nvml="sim", sample_interval_s=0.5, profiles=sim_profile("v4", tp=8, startup_s=0.3))
    text += f'\n[ray]\nexecutable = "{exe}"\nhead_address = "{HEAD}"\nnum_gpus = 8\n'
    cfg = tmp_path / "worker.toml"
    cfg.write_text(text)
    agent = Agent(tmp_path, cfg, name="worker")
    cleanup.append(agent)
    ray_pid = None
    try:
        await agent.wait_notify("READY=1")
        st = await until(lambda: _status_if(agent, lambda s: s["cluster"]["ray_state"] == "running"), 30,
                         "the worker's Ray running")
        ray_pid = st["cluster"]["ray_pid"]
        code, start = await agent.api("POST", "/v1/start", {"profile": "v4"})
        assert code == 409, start
        for path, body in (("/v1/restart", {}), ("/v1/switch", {"profile": "v4"})):
            code, answer = await agent.api("POST", path, body)
            assert code == 409 and answer["error"] == start["error"] == "role", (path, code, answer)
            assert "Ray worker" in answer["message"] and f"runs on the head, {HEAD}" in answer["message"], answer
        # `lynxtop restart` (no --yes, no terminal: a worker has nothing to confirm) shows the agent's refusal
        r = subprocess.run([sys.executable, "-m", "lynxtop", "restart", "--socket", agent.sock_path],
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert r.returncode != 0, r
        assert f"runs on the head, {HEAD}" in r.stderr and "no current or default profile" not in r.stderr, r.stderr
        await asyncio.sleep(1.0)  # nothing was started: give a wrongly accepted action time to show
        st = await agent.status()
        assert st["serving"]["state"] == "stopped" and st["serving"].get("pid") is None, st["serving"]
        assert st["cluster"]["ray_pid"] == ray_pid  # and its Ray untouched
    finally:
        pid = (await agent.status())["serving"].get("pid") if agent.proc.poll() is None else None
        agent.stop()
        kill_group(ray_pid)
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def _status_if(agent: Agent, pred) -> dict | None:
    st = await agent.status()
    return st if pred(st) else None


# ------------------------------------------------------------------------------------------ M1: adopted Ray drift


def head_text(tmp: Path, exe: Path, port: int, dash: int) -> str:
    text = agent_toml(tmp / "state" / "lynxtop.db", tmp / "run" / "agent.sock", role="head", fake_nvml="sim",
                      sample_interval_s=0.5,
                      profiles=sim_profile("pp", tp=8, distributed_executor_backend="ray", startup_s=0.3))
    return text + (f'\n[ray]\nexecutable = "{exe}"\nnode_ip_address = "127.0.0.1"\nport = {port}\n'
                   f"dashboard_port = {dash}\nview_interval_s = 0.3\n")


async def test_head_restarted_after_a_ray_edit_keeps_the_running_rays_address_and_says_so(tmp_path, cleanup):
    exe = write_exe(tmp_path / "bin" / "ray", FAKE_RAY)
    cfg = tmp_path / "head.toml"
    port, dash = free_port(), free_port()
    cfg.write_text(head_text(tmp_path, exe, port, dash))
    first = Agent(tmp_path, cfg, name="head1")
    cleanup.append(first)
    ray_pid = sim_pid = None
    try:
        await first.wait_notify("READY=1")
        st = await until(lambda: _status_if(first, lambda s: s["cluster"]["nodes"]), 30, "the first view")
        ray_pid = st["cluster"]["ray_pid"]
        assert first.stop() == 0  # an upgrade: live restore keeps Ray
        new_port, new_dash = free_port(), free_port()
        cfg.write_text(head_text(tmp_path, exe, new_port, new_dash))  # [ray] edited before the restart
        again = Agent(tmp_path, cfg, name="head2")
        cleanup.append(again)
        await again.wait_notify("READY=1")
        st = await until(lambda: _status_if(again, lambda s: s["cluster"]["nodes"] and s["cluster"]["view_error"]
                                            is None), 30, "the adopted Ray's view")
        cl = st["cluster"]
        assert cl["ray_pid"] == ray_pid and cl["ray_state"] == "running"
        assert cl["address"] == f"127.0.0.1:{port}", cl  # the Ray that runs, not the config's new port
        assert [n["node_id"] for n in cl["nodes"]] == [f"gcs-{port}"]  # read on the running Ray's dashboard
        _, evs = await again.api("GET", "/v1/events?limit=200")
        adopted = [e for e in evs["events"] if e["kind"] == "ray.adopted"]
        assert adopted and adopted[-1]["severity"] == "warning", adopted
        msg = adopted[-1]["message"]
        assert f"ray.port: {port} running, {new_port} in the config" in msg, msg
        assert f"ray.dashboard_port: {dash} running, {new_dash} in the config" in msg, msg
        assert "next Ray start" in msg and "lynxtop stop --cluster" in msg, msg
        # vLLM is handed the running Ray's address (the simulator then joins that Ray, which this stand-in is
        # not: its environment is what is looked at, and the run stopped)
        code, body = await again.api("POST", "/v1/start", {"profile": "pp"})
        assert code == 202, body
        st = await again.wait_state(lambda s: s["state"] == "starting" and s.get("pid"), 60, "the run spawned")
        sim_pid = st["serving"]["pid"]
        env = Path(f"/proc/{sim_pid}/environ").read_bytes().split(b"\0")
        assert f"RAY_ADDRESS=127.0.0.1:{port}".encode() in env
        code, body = await again.api("POST", "/v1/stop", {})
        assert code == 202, body
        await again.wait_state(lambda s: s["state"] == "stopped", 60, "stopped")
        sim_pid = None
        again.stop()
    finally:
        kill_group(ray_pid)
        if sim_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(sim_pid, signal.SIGKILL)


async def test_a_ray_started_by_this_agent_uses_the_config_and_an_unchanged_one_is_adopted_quietly(tmp_path):
    exe = write_exe(tmp_path / "bin" / "ray", FAKE_RAY)
    (tmp_path / "state").mkdir()
    port, dash = free_port(), free_port()
    events: list = []
    rn = RayNode(parse_config(head_text(tmp_path, exe, port, dash)), events.append, state_dir=tmp_path / "state")
    again = rn
    try:
        await rn.boot()
        assert rn.address == f"127.0.0.1:{port}" and rn.dashboard_port == dash
        await until(lambda: _true(rn.state == RayState.RUNNING), 20, "running")
        await rn.shutdown(stop_ray=False)
        again = RayNode(parse_config(head_text(tmp_path, exe, port, dash)), events.append,
                        state_dir=tmp_path / "state")
        await again.boot()
        assert again.proc.pid == rn.proc.pid and events[-1].kind == EventKind.RAY_ADOPTED
        assert events[-1].severity == Severity.INFO and "other settings" not in events[-1].message
        # once that Ray is stopped, the next start is the config's (here: edited)
        await again.stop("test")
        new_port = free_port()
        again.cfg = parse_config(head_text(tmp_path, exe, new_port, dash))
        await again.start("test")
        assert again.address == f"127.0.0.1:{new_port}"
    finally:
        for r in (rn, again):
            if r.proc is not None and not r.proc.exited:
                r.proc.signal_group(signal.SIGKILL)


async def _true(value: bool) -> bool:
    return value


# ------------------------------------------------------------------------------------------ M3: a head unreachable


async def test_a_worker_not_up_in_time_says_why_keeps_waiting_and_stops_within_its_grace(tmp_path, monkeypatch):
    exe = write_exe(tmp_path / "bin" / "ray", UNREACHABLE_RAY)
    back = tmp_path / "head-back"
    monkeypatch.setenv("HEAD_BACK", str(back))
    (tmp_path / "state").mkdir()
    text = agent_toml(tmp_path / "state" / "lynxtop.db", tmp_path / "run" / "agent.sock", role="worker")
    text += f'\n[ray]\nexecutable = "{exe}"\nhead_address = "{HEAD}"\nstop_grace_s = 1\n'
    events: list = []
    rn = RayNode(parse_config(text), events.append, state_dir=tmp_path / "state", start_timeout_s=1.0)
    try:
        await rn.boot()
        warned = await until(lambda: _true([e for e in events if e.severity == Severity.WARNING]), 30,
                             "the not-up warning")
        ev = warned[0]
        assert ev.kind == EventKind.RAY_STARTING and f"cannot reach the head {HEAD}" in ev.message, ev.message
        assert "not up after 1 s" in ev.message and "Failed to connect to GCS" in ev.message
        tail = ev.details["log_tail"]
        assert 0 < len(tail) <= 10 and all(len(line) <= 240 and "\x1b" not in line for line in tail), tail
        assert "\\x1b[2J" in tail[-1]
        assert rn.state == RayState.STARTING and "not up after 1 s" in rn.reason and "\x1b" not in rn.reason
        assert "Failed to connect to GCS" in rn.reason and len(rn.reason) < 600, rn.reason
        # the head comes back: joined, no restart, no failure counted
        pid = rn.proc.pid
        back.touch()
        await until(lambda: _true(rn.state == RayState.RUNNING), 30, "running once the head answers")
        assert rn.proc.pid == pid and len(rn.failures) == 0
        assert len([e for e in events if e.severity == Severity.WARNING]) == 1
        # a `ray start` deaf to SIGTERM is killed once [ray] stop_grace_s has passed
        t0 = time.monotonic()
        await rn.stop("test")
        assert rn.state == RayState.STOPPED and rn.proc.exited and time.monotonic() - t0 < 15
    finally:
        if rn.proc is not None and not rn.proc.exited:
            rn.proc.signal_group(signal.SIGKILL)


def test_the_settings_of_a_ray_command_line_are_read_in_either_flag_form_and_secrets_stay_masked():
    from lynxtop.agent.cluster.raynode import argv_settings, settings_address

    head = argv_settings(["/opt/ray", "start", "--block", "--head", "--port=6380", "--node-ip-address", "10.0.0.1",
                          "--dashboard-port", "8266", "--object-store-memory", "1000", "--token=hunter2"])
    assert head["agent.role"] == "head" and head["ray.port"] == "6380" and head["ray.dashboard_port"] == "8266"
    assert settings_address(head) == "10.0.0.1:6380"
    assert "--object-store-memory 1000" in head["ray.extra_args"] and "hunter2" not in head["ray.extra_args"]
    worker = argv_settings(["/opt/ray", "start", "--block", "--address", "10.0.0.1:6379", "--num-gpus", "8"])
    assert worker["agent.role"] == "worker" and settings_address(worker) == "10.0.0.1:6379"
