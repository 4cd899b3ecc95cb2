"""`lynxtop agent` as a real process: simulated vLLM (lynxtop-sim-vllm), fake NVML "sim", real socket and store.

sd_notify messages are read from a datagram socket standing in for systemd's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import pytest
from support.agent_proc import Agent, e2e_config, sim_processes, state_db

from lynxtop.agent.serving import procs

pytestmark = pytest.mark.timeout(90)

PEER_PYTHON = "/usr/bin/python3"  # stdlib only; the venv's interpreter may not be readable by 'nobody'


async def test_agent_ready_notify_then_sigkilled_agent_adopts_server(tmp_path, cleanup):
    cfg = e2e_config(tmp_path)
    a = Agent(tmp_path, cfg, "a1")
    cleanup.append(a)
    await a.wait_notify("READY=1")
    assert Path(a.sock_path).is_socket()  # READY only once the API listens
    assert oct(os.stat(a.sock_path).st_mode & 0o777) == "0o660"
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    assert st["agent"]["simulated"] is True and len(st["gpus"]) == 8
    srv = st["serving"]
    pid, run_id = srv["pid"], srv["run_id"]
    assert srv["phases"][-1]["phase"] == "api up"
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert not any(e.startswith((b"NOTIFY_SOCKET=", b"WATCHDOG_USEC=", b"WATCHDOG_PID=")) for e in env)
    await a.wait_notify("WATCHDOG=1", timeout=5)
    assert any(m.startswith("STATUS=") and "serving ready" in m for m in a.drain())
    # the agent dies hard: serving must go on, and the next agent adopts it without a restart
    a.stop(signal.SIGKILL)
    assert procs.alive(pid)
    b = Agent(tmp_path, cfg, "a2")
    cleanup.append(b)
    await b.wait_notify("READY=1")
    st = await b.wait_state(lambda s: s["state"] == "ready", what="adopted ready")
    assert st["serving"]["adopted"] is True
    assert st["serving"]["run_id"] == run_id and st["serving"]["pid"] == pid
    assert len(state_db(tmp_path, "SELECT id FROM runs")) == 1
    # history and logs through the API
    code, body = await b.api("GET", "/v1/runs?limit=5")
    assert code == 200 and [r["id"] for r in body["runs"]] == [run_id]
    code, body = await b.api("GET", "/v1/events?since=0&limit=500")
    assert code == 200 and "serving.adopted" in [e["kind"] for e in body["events"]]
    code, body = await b.api("GET", "/v1/logs?lines=200")
    assert code == 200 and body["run_id"] == run_id and any("startup complete" in x for x in body["lines"])
    code, body = await b.api("GET", "/v1/logs?run=999")
    assert code == 404 and "999" in body["message"]
    code, body = await b.api("GET", "/v1/profiles")
    assert code == 200 and body["current"] == "v4-tp8" and len(body["profiles"]) == 2
    # an explicit stop ends serving; the run row says why; nothing of it is left
    code, body = await b.api("POST", "/v1/stop", {})
    assert code == 202, body
    await b.wait_state(lambda s: s["state"] == "stopped", what="stopped")
    assert not sim_processes(tmp_path / "sim-state")
    assert state_db(tmp_path, "SELECT end_reason FROM runs WHERE id = ?", (run_id,))[0]["end_reason"] == \
        "stopped by operator"
    assert b.stop(signal.SIGTERM) == 0
    assert any("STOPPING=1" in m for m in b.messages)


async def test_sigkill_of_sim_server_restarts_and_leaves_no_engine(tmp_path, cleanup):
    a = Agent(tmp_path, e2e_config(tmp_path))
    cleanup.append(a)
    await a.wait_notify("READY=1")
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    pid, run_id = st["serving"]["pid"], st["serving"]["run_id"]
    old = procs.run_processes(None, pid)
    assert any("VLLM::EngineCore" in procs.title(p) for p in old)
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    await a.wait_state(lambda s: s["state"] in ("stopping", "backoff") or s["run_id"] != run_id, timeout=2,
                       what="crash detected within 2 s")
    assert time.monotonic() - t0 < 2.0
    st = await a.wait_state(lambda s: s["state"] == "ready" and s["run_id"] != run_id, what="restarted")
    assert all(not procs.alive(p) for p in old), "a process of the killed run survived (EngineCore?)"
    ev = [e for e in state_db(tmp_path, "SELECT * FROM events WHERE run_id = ?", (run_id,))
          if e["kind"] == "serving.crash"]
    assert ev and "SIGKILL" in ev[0]["message"]
    assert a.stop() == 0
    # live restore: the new server outlived the agent
    assert procs.alive(st["serving"]["pid"])


async def test_switch_frees_sim_gpu_memory_before_new_run(tmp_path, cleanup):
    a = Agent(tmp_path, e2e_config(tmp_path))
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    old_run, old_pid = st["serving"]["run_id"], st["serving"]["pid"]
    code, body = await a.api("POST", "/v1/switch", {"profile": "v4-tp4"})
    assert code == 202, body
    code, body = await a.api("POST", "/v1/restart", {})
    assert code == 409 and body["error"] == "busy" and "switch" in body["message"]
    st = await a.wait_state(lambda s: s["state"] == "ready" and s["profile"] == "v4-tp4", what="switched")
    new_run = st["serving"]["run_id"]
    assert new_run != old_run
    runs = {r["id"]: r for r in state_db(tmp_path, "SELECT * FROM runs")}
    assert runs[old_run]["end_reason"] == "switched to v4-tp4"
    started = runs[new_run]["started_ms"]
    # the last GPU sample before the new start shows no process of the old run holding memory
    exited = "FROM events WHERE kind = 'serving.exited' AND run_id = ?"
    old_pids = set(json.loads(state_db(tmp_path, f"SELECT details {exited}", (old_run,))[0]["details"])["pids"])
    assert old_pid in old_pids
    exited_ms = state_db(tmp_path, f"SELECT ts_ms {exited}", (old_run,))[0]
    last = state_db(tmp_path, "SELECT max(ts_ms) AS ts FROM gpu_samples WHERE ts_ms < ?", (started,))[0]["ts"]
    # a GPU sample was taken after the old run exited, before the new start (the same millisecond happens)
    assert last >= exited_ms["ts_ms"]
    # each GPU's process list in force then: its newest stored reading at or before (docs/store.md)
    newest = "SELECT max(ts_ms) FROM gpu_processes q WHERE q.gpu = p.gpu AND q.ts_ms <= ?"
    holders = {r["pid"] for r in state_db(tmp_path, f"SELECT pid FROM gpu_processes p WHERE ts_ms = ({newest})",
                                              (last,))}
    assert not holders & old_pids
    assert not [e for e in state_db(tmp_path, "SELECT kind FROM events") if e["kind"] == "serving.gpu_release_timeout"]
    # a profile that does not exist: 404, nothing changes
    code, body = await a.api("POST", "/v1/switch", {"profile": "nope"})
    assert code == 404
    assert (await a.status())["serving"]["run_id"] == new_run
    assert a.stop() == 0


async def test_peer_outside_group_gets_403_and_changes_nothing(tmp_path, cleanup):
    if os.geteuid() != 0 or not os.access(PEER_PYTHON, os.X_OK):
        pytest.skip("needs root (to connect as another uid) and /usr/bin/python3")
    sock_dir = Path(tempfile.mkdtemp(prefix="lynxtop-e2e-"))  # pytest's tmp dirs are 0700: 'nobody' can't enter
    sock_dir.chmod(0o755)
    sock = sock_dir / "agent.sock"
    a = Agent(tmp_path, e2e_config(tmp_path, autostart=False, sock=sock), sock=sock)
    cleanup.append(a)
    await a.wait_notify("READY=1")
    os.chmod(a.sock_path, 0o666)  # let 'nobody' reach the socket: the credential check must still hold
    script = (
        "import http.client, socket, json, sys\n"
        "class C(http.client.HTTPConnection):\n"
        "    def connect(self):\n"
        "        self.sock = socket.socket(socket.AF_UNIX); self.sock.connect(sys.argv[1])\n"
        "out = {}\n"
        "for m, p in (('POST', '/v1/start'), ('GET', '/v1/status')):\n"
        "    c = C('agent'); c.request(m, p, body=b'{}' if m == 'POST' else None,"
        " headers={'Content-Type': 'application/json'}); r = c.getresponse(); out[p] = [r.status, r.read().decode()]\n"
        "print(json.dumps(out))\n"
    )
    res = subprocess.run([PEER_PYTHON, "-c", script, a.sock_path], user=65534, group=65534, extra_groups=[],
                         capture_output=True, text=True, timeout=20)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["/v1/start"][0] == 403 and "uid 65534" in out["/v1/start"][1]
    assert out["/v1/status"][0] == 200
    assert (await a.status())["serving"]["state"] == "stopped"
    # bad requests from an allowed peer: a clear 4xx each, and nothing changes
    conn = aiohttp.UnixConnector(path=a.sock_path)
    async with aiohttp.ClientSession(connector=conn) as sess:
        for data, want in ((b"{not json", 400), (b'{"profile": "v4-tp8", "force": true}', 400),
                           (b'{"profile": 8}', 400), (b'{"profile": "nope"}', 404),
                           (b'{"profile": "' + b"x" * 70000 + b'"}', 413)):
            async with sess.post("http://agent/v1/start", data=data,
                                 headers={"Content-Type": "application/json"}) as r:
                body = await r.json()
                assert r.status == want, (data[:40], r.status, body)
                assert body["message"]
    assert not state_db(tmp_path, "SELECT id FROM runs")
    assert a.stop() == 0
    shutil.rmtree(sock_dir, ignore_errors=True)


async def test_second_agent_on_the_same_socket_refuses_and_touches_nothing(tmp_path, cleanup):
    cfg = e2e_config(tmp_path)
    a = Agent(tmp_path, cfg, "first")
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    r = subprocess.run([sys.executable, "-m", "lynxtop", "agent", "--config", str(cfg)], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 1 and "another agent is already running" in r.stderr and "Traceback" not in r.stderr
    st2 = await a.status()
    assert st2["serving"]["pid"] == st["serving"]["pid"] and st2["serving"]["state"] == "ready"
    assert not state_db(tmp_path, "SELECT id FROM events WHERE kind = 'serving.adopted'")
    assert a.stop() == 0


async def test_live_restore_off_stops_serving_with_the_agent(tmp_path, cleanup):
    a = Agent(tmp_path, e2e_config(tmp_path, extra_agent="live_restore = false"))
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    pid = st["serving"]["pid"]
    assert a.stop() == 0
    assert not procs.alive(pid)
    assert not sim_processes(tmp_path / "sim-state")
    run = state_db(tmp_path, "SELECT * FROM runs")[0]
    assert run["end_reason"] == "stopped with the agent" and run["ended_ms"]
    kinds = [e["kind"] for e in state_db(tmp_path, "SELECT kind FROM events")]
    assert "serving.exited" in kinds and "serving.gpu_release_timeout" not in kinds


def test_agent_bad_config_and_unusable_paths_exit_with_a_message(tmp_path):
    r = subprocess.run([sys.executable, "-m", "lynxtop", "agent", "--config", str(tmp_path / "nope.toml")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "nope.toml" in r.stderr and "Traceback" not in r.stderr
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cfg = e2e_config(tmp_path, autostart=False)
    r = subprocess.run([sys.executable, "-m", "lynxtop", "agent", "--config", str(cfg),
                        "--database", str(blocker / "sub" / "x.db")], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "cannot create directory" in r.stderr and str(blocker) in r.stderr
    assert "Traceback" not in r.stderr


async def test_hang_with_requests_running_marks_degraded_without_restart(tmp_path, cleanup):
    # the engine hangs 4 s after ready: the requests must be running by then (with 1 s, a loaded CI box sent them
    # after the hang, they stayed waiting with 0 running, and the detector, which watches running requests, saw
    # no hang); a failed scrape restarts the hang clock by design, so ticks of 0.5 s give the scrape 0.4 s
    cfg = e2e_config(tmp_path, extra_agent="hang_timeout_s = 5", sim_args=("--sim-fail", "hang-after=4"))
    cfg.write_text(cfg.read_text().replace("sample_interval_s = 0.2", "sample_interval_s = 0.5"))
    a = Agent(tmp_path, cfg)
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    pid = st["serving"]["pid"]
    url = st["serving"]["url"]

    async def request(session: aiohttp.ClientSession) -> None:
        body = {"model": "deepseek-ai/DeepSeek-V4.1", "prompt": "hello " * 50, "max_tokens": 4000, "stream": True}
        with contextlib.suppress(Exception):
            async with session.post(url + "/v1/completions", json=body) as r:
                async for _ in r.content:
                    pass

    async with aiohttp.ClientSession() as session:
        reqs = [asyncio.create_task(request(session)) for _ in range(4)]
        try:
            st = await a.wait_state(lambda s: s["state"] == "degraded", timeout=30, what="degraded by hang")
        finally:
            for r in reqs:
                r.cancel()
            await asyncio.gather(*reqs, return_exceptions=True)
    assert "hang" in st["serving"]["reason"] and "no token generated" in st["serving"]["reason"]
    assert st["serving"]["pid"] == pid and procs.alive(pid)  # restart_on_hang is off: nothing restarted
    ev: list = []
    deadline = time.monotonic() + 30  # the status shows the state at once; the event's row commits with the
    while time.monotonic() < deadline:  # writer's next batch (later on a loaded machine)
        ev = [e for e in state_db(tmp_path, "SELECT * FROM events") if e["kind"] == "serving.degraded.hang"]
        if ev:
            break
        await asyncio.sleep(0.1)
    assert ev and ev[0]["severity"] == "error"
    assert a.stop() == 0
