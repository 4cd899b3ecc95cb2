"""An operator's start in the agent's first second, before its first GPU sample, decides on a real process list.

At its start the agent's GPU view holds the GPUs without their processes (node.py publishes NVML's open before the
sampler's first tick): a start sent then found "no process" and could start a second vLLM on a live model's GPUs.
Now the start waits (bounded) for the first sample and is refused (409 gpus_taken) when a foreign process is on
the GPUs; with no sample within the bound it is refused (503 gpus_unknown), nothing spawned either way.

A real agent (`Node.main`, its control socket) on fake NVML (the scripted H200 node, with a real `sleep` process
listed on GPU 0), whose first sample is held back as a slow NVML would hold it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import threading
from pathlib import Path

import pytest
from support.agent_config import agent_toml
from support.waits import wait_for_async

from lynxtop.agent.gpu import backend
from lynxtop.agent.gpu.fake import GIB, FakeNvml, scripted_scenario
from lynxtop.agent.gpu.sampler import GpuSampler
from lynxtop.agent.node import Node
from lynxtop.agent.notify import Notifier
from lynxtop.agent.serving import gpu_holders
from lynxtop.contract.client import AgentRefused, AgentUnreachable, AsyncAgentClient
from lynxtop.contract.config import load_config

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def foreign_job():
    """A real process standing for another team's model on GPU 0."""
    p = subprocess.Popen(["sleep", "300"])
    yield p
    p.kill()
    p.wait(5)


@pytest.fixture
def gpus_with(monkeypatch):
    """The scripted H200 node with `pids` listed by NVML on GPU 0 (14 GiB each)."""

    def put(pids: list[int]) -> None:
        real = backend.open_backend

        def open_backend(fake: str = "", sim_state_dir: str | None = None, scenario=None):
            if fake == "h200x8":
                return FakeNvml(scripted_scenario("h200x8", processes={0: [(p, 14 * GIB) for p in pids]}))
            return real(fake, sim_state_dir, scenario)

        monkeypatch.setattr(backend, "open_backend", open_backend)

    return put


@pytest.fixture
def first_sample_held(monkeypatch):
    """Every GPU sample waits until the test releases them: NVML slow to answer at the agent's start."""
    release = threading.Event()
    real = GpuSampler.sample

    def sample(self, vllm_pids=frozenset()):
        release.wait(60)
        return real(self, vllm_pids)

    monkeypatch.setattr(GpuSampler, "sample", sample)
    yield release
    release.set()


def _config(tmp_path: Path, sock_dir: Path, h) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(agent_toml(tmp_path / "state" / "lynxtop.db", sock_dir / "agent.sock", fake_nvml="h200x8",
                               sample_interval_s=0.2, backoff_initial_s=0.2, live_restore=False,
                               profiles=h.standin_profile("alpha", tp=8)))
    return path


@contextlib.asynccontextmanager
async def running_agent(cfg_path: Path):
    """`Node.main` as the agent runs it; yields the node once its control socket answers."""
    node = Node(load_config(str(cfg_path)), Notifier(None))
    task = asyncio.create_task(node.main())
    client = AsyncAgentClient(node.cfg.agent.socket)

    async def answers() -> bool:
        if task.done():
            task.result()  # the agent failed to start: its error, not a timeout
        try:
            await client.status_json()
            return True
        except AgentUnreachable:
            return False

    try:
        deadline = asyncio.get_running_loop().time() + 30
        while not await answers():
            assert asyncio.get_running_loop().time() < deadline, "the agent's socket never answered"
            await asyncio.sleep(0.05)
        yield node
    finally:
        node._stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 30)


def _run_logs(tmp_path: Path) -> list[Path]:
    logs = tmp_path / "state" / "logs"
    return sorted(logs.glob("*.log")) if logs.exists() else []


async def _start(node: Node) -> AgentRefused | dict:
    """POST /v1/start of profile alpha, as `lynxtop start alpha` sends it; the refusal or the answer."""
    client = AsyncAgentClient(node.cfg.agent.socket, timeout_s=30)
    try:
        return await client.request("POST", "/v1/start", body={"profile": "alpha"})
    except AgentRefused as exc:
        return exc


async def test_a_start_before_the_first_sample_is_refused_when_a_foreign_process_holds_the_gpus(
        tmp_path, sock_dir, h, foreign_job, gpus_with, first_sample_held):
    gpus_with([foreign_job.pid])
    async with running_agent(_config(tmp_path, sock_dir, h)) as node:
        assert node.gpu_view.nvml["state"] == "ok" and not node.gpu_view.process_rows  # NVML open, no sample yet
        start = asyncio.create_task(_start(node))
        await asyncio.sleep(0.5)
        assert not start.done(), f"decided before any GPU sample: {start.result()}"
        first_sample_held.set()  # NVML answers: the first sample lists the foreign process
        answer = await asyncio.wait_for(start, 20)
        assert isinstance(answer, AgentRefused), f"started on GPUs a foreign process holds: {answer}"
        assert answer.status == 409 and answer.code == "gpus_taken", answer
        assert f"pid {foreign_job.pid} (sleep" in answer.message and "GPU" in answer.message
        assert list(answer.details["pids"]) == [foreign_job.pid]
        sup = node.supervisor
        assert sup is not None and sup.state == "stopped" and sup.run is None and sup.action is None
        assert not _run_logs(tmp_path)


async def test_a_start_with_no_sample_within_the_bound_is_refused_saying_why(
        tmp_path, sock_dir, h, foreign_job, gpus_with, first_sample_held, monkeypatch):
    monkeypatch.setattr(gpu_holders, "FIRST_SAMPLE_S", 0.5)
    gpus_with([foreign_job.pid])
    async with running_agent(_config(tmp_path, sock_dir, h)) as node:
        answer = await asyncio.wait_for(_start(node), 20)
        assert isinstance(answer, AgentRefused), f"started with no GPU sample: {answer}"
        assert answer.status == 503 and answer.code == "gpus_unknown", answer
        assert "no GPU sample" in answer.message and "try again" in answer.message.lower(), answer.message
        sup = node.supervisor
        assert sup is not None and sup.state == "stopped" and sup.run is None and sup.action is None
        first_sample_held.set()  # sampled now: the same start is refused for the process it finds
        await wait_for_async(lambda: node.gpu_view.process_rows, 10, what="the first sample")
        answer = await asyncio.wait_for(_start(node), 20)
        assert isinstance(answer, AgentRefused) and answer.code == "gpus_taken", answer
        assert not _run_logs(tmp_path)


async def test_a_start_once_sampled_on_free_gpus_goes_ahead(tmp_path, sock_dir, h, gpus_with):
    """The wait is for the first sample only: with it taken, a start on free GPUs is accepted at once."""
    gpus_with([])
    async with running_agent(_config(tmp_path, sock_dir, h)) as node:
        await wait_for_async(lambda: node.ticker.ticks >= 2, 10, what="ticks")
        answer = await asyncio.wait_for(_start(node), 10)
        assert isinstance(answer, dict) and answer.get("accepted"), answer
        await wait_for_async(lambda: node.supervisor.state == "ready", 20, what="ready")
        await AsyncAgentClient(node.cfg.agent.socket, timeout_s=30).request("POST", "/v1/stop", body={})
        await wait_for_async(lambda: node.supervisor.state == "stopped", 20, what="stopped")


async def test_nvml_unavailable_lets_a_start_go_ahead_with_a_warning_event(tmp_path, sock_dir, h, monkeypatch):
    """No process list can be had: the start is not refused (as with NVML down the agent still serves), but the
    operator is told, by an event, that the GPUs were not checked for other processes."""
    path = tmp_path / "config.toml"
    path.write_text(agent_toml(tmp_path / "state" / "lynxtop.db", sock_dir / "agent.sock", fake_nvml="nodriver",
                               sample_interval_s=0.2, live_restore=False, profiles=h.standin_profile("alpha", tp=8)))
    async with running_agent(path) as node:
        got: list = []
        assert node.event_sink is not None
        node.event_sink.subscribe(got.append)
        answer = await asyncio.wait_for(_start(node), 10)
        assert isinstance(answer, dict) and answer.get("accepted"), answer
        said = [e for e in got if str(e.kind) == "preflight.warning" and "other processes" in e.message]
        assert len(said) == 1 and "NVML" in said[0].message and "not checked" in said[0].message, got
        await wait_for_async(lambda: node.supervisor.state == "ready", 20, what="ready")
        await AsyncAgentClient(node.cfg.agent.socket, timeout_s=30).request("POST", "/v1/stop", body={})
        await wait_for_async(lambda: node.supervisor.state == "stopped", 20, what="stopped")


async def test_an_autostart_whose_first_sample_is_late_waits_for_it_and_launches_nothing_on_taken_gpus(
        tmp_path, sock_dir, h, foreign_job, gpus_with, first_sample_held, monkeypatch):
    """The autostart waits FRESH_SAMPLE_S for a sample, then looked at the view as it was: NVML's open, no process,
    and launched. Now it keeps waiting (state `waiting`, saying why) until a sample tells."""
    monkeypatch.setattr(gpu_holders, "FRESH_SAMPLE_S", 0.3)
    gpus_with([foreign_job.pid])
    path = tmp_path / "config.toml"
    path.write_text(agent_toml(tmp_path / "state" / "lynxtop.db", sock_dir / "agent.sock", fake_nvml="h200x8",
                               sample_interval_s=0.2, backoff_initial_s=0.2, live_restore=False,
                               default_profile="alpha", autostart=True,
                               profiles=h.standin_profile("alpha", tp=8)))
    async with running_agent(path) as node:
        sup = node.supervisor
        assert sup is not None
        await wait_for_async(lambda: sup.state == "waiting", 10, what="the autostart waiting")
        assert "no GPU sample" in (sup.reason or "") and sup.run is None and not _run_logs(tmp_path)
        first_sample_held.set()
        await wait_for_async(lambda: str(foreign_job.pid) in (sup.reason or ""), 10, what="the holder named")
        await asyncio.sleep(0.6)  # several re-checks: still waiting, nothing launched
        assert sup.state == "waiting" and sup.run is None and not _run_logs(tmp_path)
        node.writer.flush(2.0)
        held = [r for r in h.db_rows(node.cfg.agent.database, "SELECT * FROM events WHERE kind = ? ORDER BY id",
                                     ("agent.autostart_held",))]
        assert [json.loads(r["details"])["reason"] for r in held] == ["gpus_unknown", "gpus_taken"], held
        assert str(foreign_job.pid) in held[1]["message"]
