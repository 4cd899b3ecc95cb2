"""`lynxtop agent` as a real process for end-to-end tests: its config, the process with the notify socket it
reports to (standing in for systemd's), and the simulated servers it leaves behind."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from lynxtop.agent.serving import procs
from lynxtop.sim.state import read_states
from support.agent_config import sim_profile, write_agent_config
from support.db import db_rows


def e2e_config(tmp: Path, autostart: bool = True, extra_agent: str = "", sock: Path | None = None,
               sim_args: tuple[str, ...] = ()) -> Path:
    """Two simulated 8- and 4-GPU profiles on fake NVML "sim", sampling every 0.2 s, quick backoff."""
    profiles = [sim_profile(name, tp=tp, startup_s=0.5, sim_args=("--sim-log-interval", "1", *sim_args),
                            stop_grace_s=5) for name, tp in (("v4-tp8", 8), ("v4-tp4", 4))]
    return write_agent_config(tmp / "config.toml", tmp / "state" / "lynxtop.db", sock or tmp / "run" / "agent.sock",
                              fake_nvml="sim", sample_interval_s=0.2, default_profile="v4-tp8", autostart=autostart,
                              backoff_initial_s=0.3, backoff_max_s=1, gpu_release_timeout_s=10, extra=extra_agent,
                              profiles=profiles)


def state_db(tmp: Path, sql: str, args: tuple | list = ()) -> list[dict]:
    """A read-only query on the history database of an agent made by `e2e_config(tmp)`."""
    return db_rows(tmp / "state" / "lynxtop.db", sql, args)


async def stored_events(tmp: Path, kind: str, after: int = 0, timeout: float = 30) -> list[dict]:
    """The stored events of `kind` with an id above `after`, once there is one: the agent's writer stores them a
    moment after the fact. Fails after `timeout` s naming the kind."""
    deadline = time.monotonic() + timeout
    while not (ev := state_db(tmp, "SELECT * FROM events WHERE kind = ? AND id > ? ORDER BY id", (kind, after))):
        assert time.monotonic() < deadline, f"no {kind} event"
        await asyncio.sleep(0.1)
    return ev


def run_processes(token: str) -> set[tuple[int, int]]:
    """Every live process carrying a run's token, with its start time: a signalled one would be gone, a reused
    pid reads as another pair."""
    out = set()
    for pid in procs.run_processes(token, None):
        st = procs.stat(pid)
        if st is not None:
            out.add((pid, st.start_ticks))
    return out


class Agent:
    """One agent process plus the notify socket it reports to."""

    def __init__(self, tmp: Path, cfg: Path, name: str = "agent", sock: Path | None = None,
                 prefix: tuple[str, ...] = (), env: dict[str, str] | None = None):
        """`prefix`: what the agent runs under (`ip netns exec NS` makes it another host)."""
        self.tmp, self.cfg = tmp, cfg
        self.sock_path = str(sock or tmp / "run" / "agent.sock")
        self.notify_path = str(tmp / f"{name}.notify")
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(self.notify_path)
        self.notify.setblocking(False)
        self.messages: list[str] = []
        env = dict(os.environ, NOTIFY_SOCKET=self.notify_path, WATCHDOG_USEC="1000000",
                   LYNXTOP_SIM_STATE_DIR=str(tmp / "sim-state"), **(env or {}))
        self.log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([*prefix, sys.executable, "-m", "lynxtop", "agent", "--config", str(cfg)],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def drain(self) -> list[str]:
        while True:
            try:
                self.messages.append(self.notify.recv(4096).decode())
            except BlockingIOError:
                return self.messages

    async def wait_notify(self, text: str, timeout: float = 60) -> None:
        """Until the agent has sent `text` (READY=1, ...). The default only bounds a failure: on a loaded 2-core
        machine an agent's start (the interpreter compiling lynxtop, no bytecode cache) took 8 s at load 12."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in m for m in self.drain()):
                return
            assert self.proc.poll() is None, f"agent exited {self.proc.returncode}: {self.output()}"
            await asyncio.sleep(0.05)
        raise AssertionError(f"no {text} from the agent in {timeout} s: {self.messages}\n{self.output()}")

    def output(self) -> str:
        self.log.flush()
        return (self.tmp / Path(self.log.name).name).read_text(errors="replace")[-3000:]

    async def api(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        conn = aiohttp.UnixConnector(path=self.sock_path)
        async with aiohttp.ClientSession(connector=conn) as s, \
                s.request(method, f"http://agent{path}", json=body) as r:
            return r.status, await r.json()

    async def status(self) -> dict:
        return (await self.api("GET", "/v1/status"))[1]

    async def wait_state(self, pred, timeout: float = 30, what: str = "state") -> dict:
        await self.wait_notify("READY=1")
        deadline = time.monotonic() + timeout
        st: dict = {}
        while time.monotonic() < deadline:
            st = await self.status()
            if pred(st["serving"]):
                return st
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}: {st.get('serving')}\n{self.output()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        rc = terminate(self.proc, sig, timeout)
        self.drain()
        self.notify.close()
        self.log.close()
        return rc


def terminate(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
    """Signal a process (SIGTERM: the agent's clean stop), kill it after `timeout`; its exit status."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(5)


def reap_sims(sim_dir: Path) -> None:
    """Kill the simulated servers a test's agent left serving: a stopped agent leaves its run up by design
    (live restore), so a test that stops only the agent must reap them."""
    for pid in sim_processes(sim_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def sim_processes(sim_dir: Path | None = None, runs_only: bool = True) -> list[int]:
    """Live processes of simulated servers of this test: this test's sim dir and (`runs_only`) an agent's run token.

    The simulated EngineCore and workers retitle themselves as vLLM's do (setproctitle: /proc/PID/environ reads all
    NULs), so they are found another way: an engine through its state file in `sim_dir` (it names the engine and
    its workers; only one still titled VLLM:: counts, never a recycled pid), anything else as a child of one found.
    With `runs_only`, an engine whose API server lives counts only when that server does."""
    found: set[int] = set()
    for pid in procs.all_pids():
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = f"LYNXTOP_SIM_STATE_DIR={sim_dir}".encode() in env
        run = not runs_only or any(e.startswith(b"LYNXTOP_RUN_TOKEN=") for e in env)
        if ours and run and procs.alive(pid):
            found.add(pid)
    if sim_dir is not None:
        for st in read_states(Path(sim_dir)):
            if runs_only and procs.alive(st.api_pid) and st.api_pid not in found:
                continue  # a server the test started itself, not an agent's run
            for pid in (st.engine_pid, *(h.pid for h in st.holders)):
                if procs.alive(pid) and procs.title(pid).startswith("VLLM::"):
                    found.add(pid)
    children: dict[int, list[int]] = {}
    for s in (procs.stat(p) for p in procs.all_pids()):
        if s is not None and s.state not in ("Z", "X"):
            children.setdefault(s.ppid, []).append(s.pid)
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return sorted(found)


def run_leaders(tmp_path: Path) -> list[int]:
    """Live process-group leaders of agent runs started under `tmp_path` (each one a vLLM server)."""
    out = []
    for pid in procs.all_pids():
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
            cwd = os.readlink(f"/proc/{pid}/cwd")
            # getpgid too: a process that exits after its look is gone (ProcessLookupError), not an error
            if procs.RUN_TOKEN_ENV.encode() in env and cwd.startswith(str(tmp_path)) and procs.alive(pid) \
                    and os.getpgid(pid) == pid:
                out.append(pid)
        except OSError:
            continue
    return out
