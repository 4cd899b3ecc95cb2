"""s19: a Ray worker's GPUs taken by a process that is not Ray's (another team's job, a notebook, a leftover vLLM).

Nothing looked: gpu_holders.py skips Ray profiles, the worker runs no gate, and the head's gate counts the GPUs Ray
declares. vLLM's ranks on that worker then ran out of memory, and the head logged crash -> backoff -> crash with
nothing naming the foreign pid. Now the worker's agent lists it in its status (`cluster.gpus_taken`) and tells it
once per episode (`preflight.warning`, ended by an info one when it is gone); Ray's own processes (below its
`ray start`, or left in its session) never count.

Real parts: the worker's ClusterPart with its RayNode running a stand-in `ray start` (a real process tree: a child
standing for a Ray worker, and one orphaned in Ray's session), the agent's GPU sampler on fake NVML (the scripted
H200 node, whose process list the test edits as NVML's would change) feeding the agent's own NodeGpuView, and a
real `sleep` standing for the foreign job. Then the same through a whole agent (`Node.main`).
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
from collections.abc import Callable
from pathlib import Path

import pytest
from support.agent_config import agent_toml
from support.waits import wait_for_async

from lynxtop.agent.cluster.roles import ClusterPart
from lynxtop.agent.gpu import backend
from lynxtop.agent.gpu.fake import GIB, FakeNvml
from lynxtop.agent.gpu.sampler import GpuSampler
from lynxtop.agent.gpu.scripted import ScriptedNode, scripted_scenario
from lynxtop.agent.node import Node, NodeGpuView
from lynxtop.agent.notify import Notifier
from lynxtop.contract.client import AgentUnreachable, AsyncAgentClient
from lynxtop.contract.config import load_config, parse_config
from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.contract.records import RecordError
from lynxtop.contract.status import ClusterStatus, RayState, Status

pytestmark = pytest.mark.timeout(120)

# `ray start --block` stand-in: a child standing for a Ray worker (raylet's child), and a process left in Ray's
# session by a parent that exited; their pids written to $RAY_KIDS; SIGTERM ends it
FAKE_RAY = textwrap.dedent("""\
    #!{python}
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    worker = subprocess.Popen(["sleep", "300"])
    orphan = subprocess.run(["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True)
    with open(os.environ["RAY_KIDS"] + ".tmp", "w") as f:
        f.write(f"{{worker.pid}} {{orphan.stdout.strip()}}")
    os.rename(os.environ["RAY_KIDS"] + ".tmp", os.environ["RAY_KIDS"])
    print("Ray runtime started.", flush=True)
    while True:
        time.sleep(1)
""")


@pytest.fixture
def ray_exe(tmp_path, monkeypatch):
    exe = tmp_path / "bin" / "ray"
    exe.parent.mkdir()
    exe.write_text(FAKE_RAY.format(python=sys.executable))
    exe.chmod(0o755)
    kids = tmp_path / "ray-kids.txt"
    monkeypatch.setenv("RAY_KIDS", str(kids))
    yield exe, kids
    if kids.exists():  # Ray's stand-in processes, whatever the test left
        for pid in map(int, kids.read_text().split()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def foreign_job():
    """A real process standing for another team's job on the worker's GPUs (not below Ray, not in its session)."""
    p = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield p
    if p.poll() is None:
        p.kill()
    p.wait(5)


def worker_toml(tmp_path: Path, exe: Path, sock: Path) -> str:
    text = agent_toml(tmp_path / "state" / "lynxtop.db", sock, role="worker", sample_interval_s=0.2,
                      fake_nvml="h200x8", live_restore=False)
    return text + (f'\n[ray]\nexecutable = "{exe}"\nhead_address = "10.0.0.1:6379"\n'
                   'node_ip_address = "10.0.0.2"\nnum_gpus = 8\nview_interval_s = 0.2\n')


class SampleClock:
    """The samples' clock (the time the feeder stamps each tick with, that CONFIRM_S is measured on): real
    monotonic time, or, after `hold(span)`, one that steps 0.2 s a sample and stops `span` after it began. A slow
    machine then stretches how long a pid is listed in wall time, never on the samples' clock."""

    def __init__(self) -> None:
        self.last = 0.0
        self.until: float | None = None

    def __call__(self) -> float:
        if self.until is None:
            t = max(time.monotonic(), self.last + 0.001)  # never back, after a hold
        else:
            t = min(self.last + 0.2, self.until)
        self.last = t
        return t

    def hold(self, span_s: float) -> None:
        self.until = self.last + span_s

    def release(self) -> None:
        self.until = None


async def feed(sampler: GpuSampler, view: NodeGpuView, clock: Callable[[], float] = time.monotonic) -> None:
    """The agent's tick, as far as the GPU view goes (agent/sampling.py GpuSource): sample, then update the view."""
    await asyncio.to_thread(sampler.open)
    while True:
        t = clock()
        tick = await asyncio.to_thread(sampler.sample)
        view.update(t, tick.process_rows, sampler.status(), sampler.static())
        await asyncio.sleep(0.2)


def taken_events(events: list[Event]) -> list[Event]:
    return [e for e in events if e.kind == EventKind.PREFLIGHT_WARNING
            and (e.details or {}).get("reason") in ("gpus_taken", "gpus_free")]


async def test_a_foreign_process_on_a_workers_gpus_is_in_its_status_and_told_once_until_gone(
        tmp_path, ray_exe, foreign_job):
    exe, kids = ray_exe
    (tmp_path / "state").mkdir()
    node = scripted_scenario("h200x8")
    sampler = GpuSampler(lambda: FakeNvml(node))
    view = NodeGpuView()
    events: list[Event] = []
    cfg = parse_config(worker_toml(tmp_path, exe, tmp_path / "run" / "agent.sock"))
    part = ClusterPart(cfg, events.append, state_dir=tmp_path / "state", session=lambda: None, gpus=view)
    feeder = asyncio.create_task(feed(sampler, view))
    try:
        await part.boot()
        await wait_for_async(lambda: part.ray.state == RayState.RUNNING and kids.exists(), 30, what="Ray running")
        worker, orphan = map(int, kids.read_text().split())
        # NVML lists Ray's worker, the process Ray left in its session, and the foreign job
        node.processes.update({0: [(worker, 20 * GIB)], 1: [(orphan, 10 * GIB)], 3: [(foreign_job.pid, 14 * GIB)]})
        await wait_for_async(lambda: part.status(None).gpus_taken, 30, what="the foreign process in the status")
        st = part.status(None)
        assert [(t.pid, t.name, t.gpus, t.used_mem_bytes) for t in st.gpus_taken] == [
            (foreign_job.pid, "sleep", (3,), 14 * GIB)], st.gpus_taken
        assert st.gpus_taken_since_ms is not None
        # what a client reads of it (an older client: the field ignored; this one: read back as sent)
        back = Status.from_json(Status(cluster=st).to_json()).cluster
        assert back.gpus_taken == st.gpus_taken and back.gpus_taken_since_ms == st.gpus_taken_since_ms
        await asyncio.sleep(1.5)  # several looks (every 0.2 s): still one event
        told = taken_events(events)
        assert len(told) == 1, told
        ev = told[0]
        assert ev.severity == Severity.WARNING and ev.details["reason"] == "gpus_taken"
        assert f"pid {foreign_job.pid} (sleep, 14.0 GiB, on GPU 3)" in ev.message and "10.0.0.2" in ev.message
        assert "not Ray's" in ev.message and "ps -fp PID" in ev.message
        assert ev.details["pids"] == [foreign_job.pid] and ev.details["node"] == "10.0.0.2"
        assert str(worker) not in ev.message and str(orphan) not in ev.message
        # the job ends: NVML stops listing it
        foreign_job.kill()
        foreign_job.wait(5)
        node.processes.pop(3)
        await wait_for_async(lambda: not part.status(None).gpus_taken, 30, what="the GPUs free again")
        told = taken_events(events)
        assert len(told) == 2 and told[1].severity == Severity.INFO and told[1].details["reason"] == "gpus_free"
        assert str(foreign_job.pid) in told[1].message and part.status(None).gpus_taken_since_ms is None
    finally:
        feeder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await feeder
        await part.shutdown(stop_ray=True)


async def test_with_ray_stopped_every_process_on_the_gpus_counts_and_a_short_lived_one_never_does(
        tmp_path, ray_exe, foreign_job):
    """No Ray: nothing on the GPUs is Ray's. A pid NVML lists only briefly (exited between its list and the look)
    is no episode."""
    exe, _ = ray_exe
    (tmp_path / "state").mkdir()
    node = scripted_scenario("h200x8")
    view = NodeGpuView()
    events: list[Event] = []
    cfg = parse_config(worker_toml(tmp_path, exe, tmp_path / "run" / "agent.sock"))
    part = ClusterPart(cfg, events.append, state_dir=tmp_path / "state", session=lambda: None, gpus=view)
    part.ray.held_path.write_text('{"reason": "stopped by test"}')  # kept stopped, as an operator's stop keeps it
    clock = SampleClock()
    feeder = asyncio.create_task(feed(GpuSampler(lambda: FakeNvml(node)), view, clock))
    blip = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        await part.boot()
        assert part.ray.state == RayState.STOPPED
        # listed for 1 s of the samples' clock (less than CONFIRM_S) however slowly this machine runs, then gone;
        # the watch looks at it while listed and after it is gone (conditions, not fixed sleeps)
        clock.hold(1.0)
        node.processes[5] = [(blip.pid, GIB)]
        await wait_for_async(lambda: blip.pid in part.gpus._first, 30, what="the watch sees the short-lived pid")
        await wait_for_async(lambda: clock.last >= clock.until, 30, what="1 s of samples with the pid listed")
        node.processes.pop(5)
        await wait_for_async(lambda: blip.pid not in part.gpus._first, 30, what="the watch sees it gone")
        clock.release()
        assert not part.status(None).gpus_taken and not taken_events(events)
        node.processes[2] = [(foreign_job.pid, 2 * GIB)]
        await wait_for_async(lambda: part.status(None).gpus_taken, 30, what="the process counted")
        told = taken_events(events)
        assert len(told) == 1 and "this node's Ray is not running" in told[0].message, told
    finally:
        blip.kill()
        blip.wait(5)
        feeder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await feeder
        await part.shutdown(stop_ray=True)


def test_an_older_agents_cluster_status_reads_with_no_gpus_taken_and_a_bad_one_is_refused():
    old = ClusterStatus.from_json({"role": "worker", "ray_state": "running", "address": "10.0.0.1:6379"})
    assert old.gpus_taken == () and old.gpus_taken_since_ms is None
    with pytest.raises(RecordError):
        ClusterStatus.from_json({"role": "worker", "gpus_taken": "pid 7"})
    with pytest.raises(RecordError):
        ClusterStatus.from_json({"role": "worker", "gpus_taken": [{"pid": "7"}]})


# ------------------------------------------------------------------------------------------ a whole agent


@contextlib.asynccontextmanager
async def running_agent(cfg_path: Path):
    node = Node(load_config(str(cfg_path)), Notifier(None))
    task = asyncio.create_task(node.main())
    client = AsyncAgentClient(node.cfg.agent.socket)

    async def answers() -> bool:
        if task.done():
            task.result()
        try:
            await client.status_json()
            return True
        except AgentUnreachable:
            return False

    try:
        deadline = time.monotonic() + 30
        while not await answers():
            assert time.monotonic() < deadline, "the agent's socket never answered"
            await asyncio.sleep(0.05)
        yield node, client
    finally:
        node._stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 30)


async def test_a_worker_agent_shows_the_foreign_process_in_its_status_and_events(
        tmp_path, sock_dir, ray_exe, foreign_job, monkeypatch):
    exe, _ = ray_exe
    scripted: list[ScriptedNode] = []

    def open_backend(fake: str = "", sim_state_dir: str | None = None, scenario=None):
        scripted.append(scripted_scenario("h200x8", processes={4: [(foreign_job.pid, 30 * GIB)]}))
        return FakeNvml(scripted[-1])

    monkeypatch.setattr(backend, "open_backend", open_backend)
    path = tmp_path / "worker.toml"
    path.write_text(worker_toml(tmp_path, exe, sock_dir / "agent.sock"))
    async with running_agent(path) as (node, client):
        assert node.cluster is not None and node.cluster.gpus is not None, "the worker does not look at its GPUs"
        got: list[Event] = []
        assert node.event_sink is not None
        node.event_sink.subscribe(got.append)

        deadline = time.monotonic() + 30
        while not (taken := (await client.status_json())["cluster"].get("gpus_taken")):
            assert time.monotonic() < deadline, "gpus_taken never in the worker's status"
            await asyncio.sleep(0.1)
        assert [t["pid"] for t in taken] == [foreign_job.pid]
        await wait_for_async(lambda: taken_events(got), 10, what="the event")
        assert f"pid {foreign_job.pid} (sleep" in taken_events(got)[0].message
        assert f"pid {foreign_job.pid} (sleep)" in node.status_line()
