"""s23: asking a node's Ray for what it already does is the ask met, not a refusal: `ray start` on a running Ray
answers 409 `already_running`, on a starting one `already_starting`, `ray stop` on a stopped one `already_stopped`;
the CLI exits 0 with a note, as `lynxtop stop` on a stopped node does (s22), so a runbook goes on. `ray start --wait`
on a starting Ray waits for that Ray, not for serving.

A real agent process (worker role) over its unix socket, running a stand-in `ray` script as the s19 tests do, and
the real `lynxtop` CLI as a subprocess.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

from support.agent_config import agent_toml
from support.agent_proc import Agent
from test_s19_worker_and_ray import FAKE_RAY, HEAD, UNREACHABLE_RAY, kill_group, until, write_exe


def lynxtop(agent: Agent, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lynxtop", *args, "--socket", agent.sock_path],
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def worker_agent(tmp_path: Path, exe: Path, env: dict[str, str] | None = None) -> Agent:
    text = agent_toml(tmp_path / "state" / "lynxtop.db", tmp_path / "run" / "agent.sock", role="worker",
                      fake_nvml="sim", sample_interval_s=0.5)
    text += f'\n[ray]\nexecutable = "{exe}"\nhead_address = "{HEAD}"\nnum_gpus = 8\nstop_grace_s = 1\n'
    cfg = tmp_path / "worker.toml"
    cfg.write_text(text)
    return Agent(tmp_path, cfg, name="worker", env=env)


async def ray_state(agent: Agent, state: str, timeout: float = 30) -> dict:
    async def got() -> dict | None:
        st = await agent.status()
        return st if st["cluster"]["ray_state"] == state else None

    return await until(got, timeout, f"the worker's Ray {state}")


async def test_start_on_a_running_ray_and_stop_on_a_stopped_one_are_the_ask_met(tmp_path, cleanup):
    agent = worker_agent(tmp_path, write_exe(tmp_path / "bin" / "ray", FAKE_RAY))
    cleanup.append(agent)
    ray_pid = None
    try:
        await agent.wait_notify("READY=1")
        ray_pid = (await ray_state(agent, "running"))["cluster"]["ray_pid"]

        code, answer = await agent.api("POST", "/v1/ray/start", {})
        assert code == 409 and answer["error"] == "already_running", (code, answer)
        assert "already running" in answer["message"], answer
        for args in (("ray", "start"), ("start",)):  # on a worker `lynxtop start` is its Ray's start
            r = lynxtop(agent, *args)
            assert r.returncode == 0, (args, r)
            assert "already running: nothing to do" in r.stderr, (args, r.stderr)
        st = await agent.status()
        assert st["cluster"]["ray_state"] == "running" and st["cluster"]["ray_pid"] == ray_pid  # untouched

        r = lynxtop(agent, "ray", "stop", "-y", "--wait")
        assert r.returncode == 0 and "Ray stopped" in r.stdout, r
        await ray_state(agent, "stopped")
        code, answer = await agent.api("POST", "/v1/ray/stop", {})
        assert code == 409 and answer["error"] == "already_stopped", (code, answer)
        for args in (("ray", "stop", "-y"), ("stop", "-y")):
            r = lynxtop(agent, *args)
            assert r.returncode == 0, (args, r)
            assert "already stopped: nothing to do" in r.stderr, (args, r.stderr)

        # a real refusal still exits non-zero: a worker serves nothing to restart
        r = lynxtop(agent, "restart")
        assert r.returncode == 1 and "role" in r.stderr, r
    finally:
        if agent.proc.poll() is None:
            agent.stop()
        kill_group(ray_pid)


async def test_start_on_a_starting_ray_is_already_starting_and_wait_waits_for_that_ray(tmp_path, cleanup):
    back = tmp_path / "head-back"  # the stand-in joins once this file exists
    agent = worker_agent(tmp_path, write_exe(tmp_path / "bin" / "ray", UNREACHABLE_RAY), env={"HEAD_BACK": str(back)})
    cleanup.append(agent)
    ray_pid = None
    try:
        await agent.wait_notify("READY=1")
        ray_pid = (await ray_state(agent, "starting"))["cluster"]["ray_pid"]
        code, answer = await agent.api("POST", "/v1/ray/start", {})
        assert code == 409 and answer["error"] == "already_starting", (code, answer)
        r = lynxtop(agent, "ray", "start")
        assert r.returncode == 0 and "already starting: nothing to do" in r.stderr, r

        # --wait on the start under way: waits for this Ray to run (not for serving, which a worker never does)
        proc = subprocess.Popen([sys.executable, "-m", "lynxtop", "ray", "start", "--wait", "--socket",
                                 agent.sock_path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and proc.poll() is None:
                await asyncio.sleep(0.1)
            assert proc.poll() is None, proc.communicate()  # still waiting: Ray is not up yet
            back.touch()
            out, err = await asyncio.to_thread(proc.communicate, timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
        assert proc.returncode == 0, (out, err)
        assert "already starting: nothing to do" in err and "Ray running" in out, (out, err)
        st = await agent.status()
        assert st["cluster"]["ray_state"] == "running" and st["cluster"]["ray_pid"] == ray_pid
    finally:
        if agent.proc.poll() is None:
            agent.stop()
        kill_group(ray_pid)
