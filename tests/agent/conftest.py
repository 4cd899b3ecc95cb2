"""Shared pieces for the agent tests: a real store, a config file with stand-in profiles, a GPU view."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest
from support.agent_config import agent_toml, profile, sim_profile
from support.agent_proc import reap_sims, run_leaders
from support.db import db_rows
from support.ports import free_port
from support.waits import wait_for_async as wait_for

from lynxtop.agent.serving import procs
from lynxtop.agent.serving.supervisor import Supervisor
from lynxtop.contract.config import load_config

HERE = Path(__file__).resolve().parent
STANDIN = HERE / "standin_vllm.py"


def standin_profile(name: str, port: int = 0, tp: int | None = None, readiness_s: float = 20,
                    model: str = "m", stop_grace_s: float = 3, **keys) -> str:
    """A [[profile]] running the stand-in vLLM (tests/agent/standin_vllm.py)."""
    return profile(name, STANDIN, model=model, port=port, tensor_parallel_size=tp, **keys,
                   readiness_timeout_s=readiness_s, stop_grace_s=stop_grace_s, shutdown_timeout_s=1)


def write_config(tmp_path: Path, agent: str = "", profiles: str | None = None, executable: Path = STANDIN) -> Path:
    """The supervisor tests' config: two stand-in profiles unless `profiles`; `agent`: more [agent] lines."""
    if profiles is None:
        timeouts = {"readiness_timeout_s": 20, "stop_grace_s": 3, "shutdown_timeout_s": 1}
        profiles = (profile("alpha", executable, tensor_parallel_size=8, env={"VLLM_LOGGING_LEVEL": "INFO"},
                            **timeouts)
                    + profile("beta", executable, tensor_parallel_size=4, **timeouts))
    path = tmp_path / "config.toml"
    path.write_text(agent_toml(tmp_path / "state" / "lynxtop.db", tmp_path / "run" / "agent.sock",
                               backoff_initial_s=0.2, backoff_max_s=1, crash_loop_failures=3, crash_loop_window_s=60,
                               gpu_release_timeout_s=5, extra=agent, profiles=profiles))
    return path


class ProcGpuView:
    """GPUs as a test sees them: 8 H200s, and every live process of any run 'holds GPU memory'.

    A process counts as on the GPU while /proc shows it, like NVML's compute-process list on a real node,
    so a supervisor that starts before the old run's processes are gone is caught. Only runs started under the
    test's own directory (`root`, set for every test: a run's working directory is its log directory) are this
    node's: a demo or another test session on the machine is not on the test's GPUs.
    """

    root: Path | None = None

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
            retitled = not env.strip(b"\0") and procs.title(pid).startswith("VLLM::")  # the token hidden (setproctitle)
            if (marker in env or retitled) and procs.alive(pid) and self._ours(pid):
                pids.add(pid)
        return ts, pids

    def _ours(self, pid: int) -> bool:
        if self.root is None:
            return True
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            return False
        return Path(cwd).is_relative_to(os.path.realpath(self.root))


@pytest.fixture(autouse=True)
def _gpu_view_root(tmp_path):
    """The fake GPUs hold only this test's runs (ProcGpuView.root)."""
    ProcGpuView.root = tmp_path
    yield
    ProcGpuView.root = None


@pytest.fixture
def store(tmp_path):
    from lynxtop.store.writer import StoreWriter

    w = StoreWriter(tmp_path / "state" / "lynxtop.db")
    w.start()
    yield w
    w.close()


@pytest.fixture
async def make_sup(tmp_path, store):
    made: list[Supervisor] = []

    def make(agent: str = "", gpus: ProcGpuView | None = None, cfg_path: Path | None = None,
             profiles: str | None = None, state_path: Path | None = None, cluster=None) -> Supervisor:
        cfg = load_config(str(cfg_path or write_config(tmp_path, agent, profiles)))
        state_path = state_path or tmp_path / "state" / "serving.json"
        sup = Supervisor(cfg, store, gpus or ProcGpuView(), state_path=state_path,
                         host="testnode", simulated=True, health_poll_s=0.05, stop_kill_wait_s=5, cluster=cluster)
        made.append(sup)
        return sup

    yield make
    # never leave a server behind, whatever the test did
    for sup in made:
        if not sup.http.closed:
            await sup.http.close()
        if sup.proc is not None:  # by identity too: a retitled EngineCore shows no token once its leader is gone
            for pid in procs.run_processes(sup.proc.record.token, sup.proc.record.pgid, known=sup.proc.known):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


class Helpers:
    """Helpers handed to tests as a fixture (test modules import only lynxtop.*)."""

    ProcGpuView = ProcGpuView
    STANDIN = STANDIN
    db_rows = staticmethod(db_rows)
    wait_for = staticmethod(wait_for)
    write_config = staticmethod(write_config)
    sim_profile = staticmethod(sim_profile)
    standin_profile = staticmethod(standin_profile)
    free_port = staticmethod(free_port)


@pytest.fixture
def h() -> type[Helpers]:
    return Helpers


@pytest.fixture
def cleanup(tmp_path):
    """End-to-end tests append their support.agent_proc.Agent here: killed, with their servers, at teardown."""
    agents: list = []
    yield agents
    for a in agents:
        if a.proc.poll() is None:
            a.proc.kill()
            a.proc.wait(5)
    reap_sims(tmp_path / "sim-state")


@pytest.fixture
def reap(tmp_path):
    """Servers a test's agents left running (a failure mid-load, live restore) are killed at teardown."""
    yield
    for pid in run_leaders(tmp_path):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
