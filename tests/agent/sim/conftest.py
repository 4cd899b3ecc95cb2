"""Real simulated servers for the simulator's tests: each in its own session, killed by group at teardown."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict
from pathlib import Path

import pytest
from support.ports import free_port

from lynxtop.sim.state import load_state

MODEL = "deepseek-ai/DeepSeek-V4.1"


def sim_exe() -> list[str]:
    script = Path(sys.executable).parent / "lynxtop-sim-vllm"
    return [str(script)] if script.exists() else [sys.executable, "-m", "lynxtop.sim"]


def http(url: str, body: dict | None = None, headers: dict | None = None, timeout: float = 10.0
         ) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def group_members(pgid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read().decode("ascii", "replace")
        except OSError:
            continue
        rest = raw[raw.rfind(")") + 2:].split()
        if rest and rest[0] not in ("Z", "X") and int(rest[2]) == pgid:
            out.append(int(name))
    return out


class SimProc:
    """One `lynxtop-sim-vllm serve` process tree started the way the agent starts vLLM (own session)."""

    def __init__(self, tmp: Path, *flags: str, startup: float = 0.3, speed: float = 20.0, tp: int = 8,
                 workers: bool = False, max_model_len: int = 32768, env: dict | None = None,
                 state_dir: Path | None = None):
        self.port = free_port()
        self.state_dir = state_dir or tmp / "simstate"
        self.log_path = tmp / f"sim-{self.port}.log"
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [*sim_exe(), "serve", MODEL, "--host", "127.0.0.1", "--port", str(self.port), "-tp", str(tp),
                     "--max-model-len", str(max_model_len), "--sim-startup-seconds", str(startup),
                     "--sim-speed", str(speed), "--sim-state-dir", str(self.state_dir),
                     "--sim-workers" if workers else "--no-sim-workers", "--sim-log-interval", "1", *flags]
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, **(env or {})})
        self.pgid = self.proc.pid

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"simulator exited {self.proc.returncode} before ready:\n{self.text()}")
            try:
                status, _ = http(self.url + "/health", timeout=1.0)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"simulator not ready after {timeout} s:\n{self.text()}")

    def wait_exit(self, timeout: float = 20.0) -> int:
        return self.proc.wait(timeout=timeout)

    def engine_states(self) -> list[dict]:
        out = []
        for f in sorted(self.state_dir.glob("engine-*.state")):
            try:
                out.append(asdict(load_state(f)))
            except (OSError, ValueError, struct.error):
                pass
        return out

    def stop(self) -> None:
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except OSError:
            pass
        for st in self.engine_states():
            for pid in [st["engine_pid"]] + [h["pid"] for h in st["holders"]]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.log.close()


@pytest.fixture(scope="module")
def shared_sim(tmp_path_factory):
    """One ready server (speed 20) shared by a module's read-mostly tests."""
    sp = SimProc(tmp_path_factory.mktemp("sim"))
    try:
        sp.wait_ready()
        yield sp
    finally:
        sp.stop()


class Kit:
    """Helpers handed to tests as a fixture (tests import only lynxtop.*)."""

    MODEL = MODEL
    http = staticmethod(http)
    free_port = staticmethod(free_port)
    group_members = staticmethod(group_members)
    SimProc = SimProc


@pytest.fixture
def kit() -> type[Kit]:
    return Kit


@pytest.fixture
def sim_argv0() -> list[str]:
    """How to run the simulator: the console script next to this Python, else `python -m`."""
    return sim_exe()


@pytest.fixture
def start_sim(tmp_path):
    started: list[SimProc] = []

    def start(*flags: str, **kw) -> SimProc:
        sp = SimProc(tmp_path, *flags, **kw)
        started.append(sp)
        return sp

    yield start
    for sp in started:
        sp.stop()
