"""What the `lynxtop bench` tests share: one agent serving the simulator, the command as a subprocess, and a
small misbehaving OpenAI-compatible server for the error paths."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import aiohttp
from aiohttp import web

from support.agent_config import sim_profile, write_agent_config
from support.agent_proc import Agent, sim_processes
from support.ports import free_port

FAST_SPEED = 40.0  # a 138 ms step takes 3.5 ms: for the single long stream
PLATEAU_SPEED = 4.0  # at 40x HTTP overhead would count against a 3.5 ms step (tests/agent/sim/test_speed.py)
SLA = {"ttft_p99_ms": 2000.0, "tpot_p99_ms": 150.0, "window_s": 60.0}


def bench_config(tmp: Path) -> Path:
    """Two simulated profiles (a fast clock and a slower one for the plateau) on the simulated GPUs."""
    profiles = [sim_profile(name, tp=8, startup_s=0.3, max_model_len=131072,
                            sim_args=("--sim-speed", str(speed), "--sim-log-interval", "0"))
                for name, speed in (("fast", FAST_SPEED), ("plateau", PLATEAU_SPEED))]
    return write_agent_config(tmp / "config.toml", tmp / "state" / "lynxtop.db", tmp / "run" / "agent.sock",
                              fake_nvml="sim", sample_interval_s=0.5, default_profile="fast", autostart=True,
                              gpu_release_timeout_s=10, sla=SLA, profiles=profiles)


def start_agent(tmp: Path) -> Agent:
    agent = Agent(tmp, bench_config(tmp))
    asyncio.run(agent.wait_state(lambda s: s["state"] == "ready", 60, "ready"))
    return agent


def stop_agent(agent: Agent, tmp: Path) -> None:
    """Stop serving, then the agent (live restore would leave the simulated server running), then sweep."""
    async def stop_serving() -> None:
        await agent.api("POST", "/v1/stop")
        await agent.wait_state(lambda s: s["state"] == "stopped", 30, "stopped")

    with contextlib.suppress(OSError, AssertionError, aiohttp.ClientError):
        if agent.proc.poll() is None:
            asyncio.run(stop_serving())
    agent.stop()
    for pid in sim_processes(tmp / "sim-state", runs_only=False):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def switch(agent: Agent, profile: str) -> dict:
    async def go() -> dict:
        code, body = await agent.api("POST", "/v1/switch", {"profile": profile})
        assert code == 202, body
        return await agent.wait_state(lambda s: s["state"] == "ready" and s["profile"] == profile, 60, profile)

    return asyncio.run(go())


def bench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """`lynxtop bench ARGS` as a user runs it."""
    return subprocess.run([sys.executable, "-m", "lynxtop", "bench", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, COLUMNS="200"))


def bench_popen(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "lynxtop", "bench", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def levels(path: Path) -> list[dict]:
    return json.loads(path.read_text())


class FlakyServer:
    """An OpenAI-compatible server in a thread that fails on purpose: request k (1-based) answers HTTP 500 when
    k % 3 == 0 and cuts its stream after two tokens when k % 3 == 1 (k > 1); `stop()` makes it unreachable."""

    MODEL = "flaky-model"

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.count = 0
        self.loop = asyncio.new_event_loop()
        self.runner: web.AppRunner | None = None
        started = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(started,), daemon=True)
        self.thread.start()
        assert started.wait(10)

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completion)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        self.loop.run_until_complete(web.TCPSite(self.runner, "127.0.0.1", self.port).start())
        started.set()
        self.loop.run_forever()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.MODEL, "object": "model"}]})

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.count += 1
        k = self.count
        if k % 3 == 0:
            return web.json_response({"object": "error", "message": "simulated overload", "code": 500}, status=500)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = 2 if (k % 3 == 1 and k > 1) else body["max_tokens"]
        for i in range(n):
            chunk = {"choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await asyncio.sleep(0.002)
        if n < body["max_tokens"]:
            request.transport.close()  # cut mid-stream
            return resp
        usage = {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": n}}
        await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        await resp.write_eof()
        return resp

    def stop(self) -> None:
        if self.runner is not None:
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
            self.runner = None

    def close(self) -> None:
        self.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class DyingServer:
    """FlakyServer in a process of its own, for a test of the server going away: `stop()` SIGKILLs it, so the
    kernel resets every connection as a vLLM that dies does. Stopping the in-thread server stood in for that
    badly: aiohttp's shutdown left a connection accepted during it open and unread (1 run in ~50 on a loaded
    machine, CI of session 22), and the bench waited on it for its 600 s request timeout."""

    def __init__(self) -> None:
        code = ("import sys, threading; sys.path.insert(0, sys.argv[1]); from support.bench_env import FlakyServer; "
                "s = FlakyServer(); print(s.url, flush=True); threading.Event().wait()")
        self.proc = subprocess.Popen([sys.executable, "-c", code, str(Path(__file__).resolve().parent.parent)],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        assert self.url.startswith("http://"), f"the server did not start (exit {self.proc.poll()})"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)

    def close(self) -> None:
        self.stop()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

