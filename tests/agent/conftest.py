"""Shared pieces for the agent tests: a real store, a config file with stand-in profiles, a GPU view."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from lynxtop.agent import procs
from lynxtop.agent.supervisor import Supervisor
from lynxtop.contract.config import load_config

HERE = Path(__file__).resolve().parent
STANDIN = HERE / "standin_vllm.py"
SIM = Path(sys.executable).parent / "lynxtop-sim-vllm"  # the project's simulated vLLM


def sim_profile(name: str, sim_args: str = "", tp: int = 8) -> str:
    """A [[profile]] running the simulated vLLM; `sim_args` is a TOML list tail like ', "--sim-fail", "oom"'."""
    return f"""
[[profile]]
name = "{name}"
executable = "{SIM}"
model = "deepseek-ai/DeepSeek-V4.1"
port = {free_port()}
tensor_parallel_size = {tp}
extra_args = ["--sim-startup-seconds", "0.3"{sim_args}]
readiness_timeout_s = 30
stop_grace_s = 3
shutdown_timeout_s = 1
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(tmp_path: Path, agent: str = "", profiles: str | None = None, executable: Path = STANDIN) -> Path:
    if profiles is None:
        p1, p2 = free_port(), free_port()
        profiles = f"""
[[profile]]
name = "alpha"
executable = "{executable}"
model = "deepseek-ai/DeepSeek-V4.1"
port = {p1}
tensor_parallel_size = 8
env = {{ VLLM_LOGGING_LEVEL = "INFO" }}
readiness_timeout_s = 20
stop_grace_s = 3
shutdown_timeout_s = 1

[[profile]]
name = "beta"
executable = "{executable}"
model = "deepseek-ai/DeepSeek-V4.1"
port = {p2}
tensor_parallel_size = 4
readiness_timeout_s = 20
stop_grace_s = 3
shutdown_timeout_s = 1
"""
    text = f"""
[agent]
database = "{tmp_path / 'state' / 'lynxtop.db'}"
socket = "{tmp_path / 'run' / 'agent.sock'}"
backoff_initial_s = 0.2
backoff_max_s = 1
crash_loop_failures = 3
crash_loop_window_s = 60
gpu_release_timeout_s = 5
{agent}
{profiles}
"""
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


class ProcGpuView:
    """GPUs as a test sees them: 8 H200s, and every live process of any run 'holds GPU memory'.

    A process counts as on the GPU while /proc shows it, like NVML's compute-process list on a real node,
    so a supervisor that starts before the old run's processes are gone is caught.
    """

    def __init__(self, count: int = 8, cc: tuple[int, int] = (9, 0), name: str = "NVIDIA H200"):
        self.count, self.cc, self.name = count, cc, name
        self.nvml_ok = True

    def gpu_info(self):
        if not self.nvml_ok:
            return None
        return [{"index": i, "name": self.name, "cc_major": self.cc[0], "cc_minor": self.cc[1]}
                for i in range(self.count)]

    def compute_pids(self):
        if not self.nvml_ok:
            return None
        ts = time.monotonic()
        marker = f"{procs.RUN_TOKEN_ENV}=".encode()
        pids = set()
        for pid in procs.all_pids():
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            if marker in env and procs.alive(pid):
                pids.add(pid)
        return ts, pids


@pytest.fixture
def store(tmp_path):
    from lynxtop.store.writer import StoreWriter

    w = StoreWriter(tmp_path / "state" / "lynxtop.db")
    w.start()
    yield w
    w.close()


def db_rows(path: Path, sql: str, args=()) -> list[dict]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql, args)]
    finally:
        conn.close()


@pytest.fixture
async def make_sup(tmp_path, store):
    made: list[Supervisor] = []

    def make(agent: str = "", gpus: ProcGpuView | None = None, cfg_path: Path | None = None,
             profiles: str | None = None) -> Supervisor:
        cfg = load_config(str(cfg_path or write_config(tmp_path, agent, profiles)))
        sup = Supervisor(cfg, store, gpus or ProcGpuView(), state_path=tmp_path / "state" / "serving.json",
                         host="testnode", simulated=True, health_poll_s=0.05, stop_kill_wait_s=5)
        made.append(sup)
        return sup

    yield make
    # never leave a server behind, whatever the test did
    for sup in made:
        if sup._session is not None and not sup._session.closed:
            await sup._session.close()
        if sup.proc is not None:
            for pid in procs.run_processes(sup.proc.record.token, sup.proc.record.pgid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


async def wait_for(pred, timeout: float = 10.0, step: float = 0.02, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        await asyncio.sleep(step)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Helpers:
    """Helpers handed to tests as a fixture (test modules import only lynxtop.*)."""

    ProcGpuView = ProcGpuView
    STANDIN = STANDIN
    db_rows = staticmethod(db_rows)
    wait_for = staticmethod(wait_for)
    write_config = staticmethod(write_config)
    sim_profile = staticmethod(sim_profile)
    free_port = staticmethod(free_port)


@pytest.fixture
def h() -> type[Helpers]:
    return Helpers
