"""GPUs taken (agent/serving/gpu_holders.py), session 19.

- A second lynxtop agent started by hand with its own state directory (`lynxtop agent --socket /tmp/a.sock
  --database /tmp/a.db`, as docs/agent.md shows) shares the node's profiles. Its autostart found the GPUs taken by
  the service agent's run, waited, and loaded the model as soon as they freed: right after an operator's
  `lynxtop stop` on the service's agent, the model the operator stopped came back under the second agent. Now a
  holder that is another lynxtop agent's run (a process carrying a run token, or below one, not this agent's) holds
  the autostart or retry for good (state stopped, `agent.autostart_held`), and an operator's start is told whose it
  is (409 gpus_taken).
- A process NVML listed that exited before the look read /proc was counted as a foreign holder ("pid N (?)"), so a
  restart right after a spawn could be refused. A pid /proc does not show is now confirmed by a later GPU sample;
  one still listed counts (a container's processes are listed by NVML but invisible here).

Real agents (`lynxtop agent` processes) supervising the simulated vLLM on fake NVML "sim", whose GPUs list the
simulated engines of every agent sharing the sim state directory (as a node's NVML lists every process); and the
agent's own GPU view (node.NodeGpuView) fed samples as the sampler's ticks feed it, with real processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from support.agent_config import profile, sim_profile, write_agent_config
from support.agent_proc import Agent, run_leaders
from support.db import db_rows

from lynxtop.agent.node import NodeGpuView
from lynxtop.agent.serving import gpu_holders, procs
from lynxtop.contract.config import load_config

pytestmark = pytest.mark.timeout(180)


def two_configs(tmp_path, load_s: float):
    """The service agent's config and a second one with the same profiles (the same file but for --socket and
    --database): autostart of the default profile on both; a load of `load_s` (vLLM binds its port only once
    loaded: a start during the other's load passes the port check, and only the GPUs tell)."""
    profiles = [sim_profile("v4-tp8", tp=8, startup_s=load_s, stop_grace_s=5, readiness_timeout_s=120)]
    common = {"fake_nvml": "sim", "sample_interval_s": 0.2, "default_profile": "v4-tp8", "autostart": True,
              "backoff_initial_s": 0.3, "backoff_max_s": 1, "gpu_release_timeout_s": 10, "profiles": profiles}
    a = write_agent_config(tmp_path / "config.toml", tmp_path / "state" / "lynxtop.db", tmp_path / "run" / "agent.sock",
                           **common)
    b = write_agent_config(tmp_path / "b.toml", tmp_path / "b" / "lynxtop.db", tmp_path / "run" / "b.sock", **common)
    return a, b


def events(db, kind):
    return db_rows(db, "SELECT kind, message, details FROM events WHERE kind = ? ORDER BY id", (kind,))


async def wait_until(pred, timeout: float, what):
    """`pred()` once true; `what` (a text, or a coroutine function giving one) names what did not come."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what if isinstance(what, str) else await what()}")


async def test_a_second_agent_does_not_take_over_the_gpus_another_agents_run_frees(tmp_path, cleanup, reap):
    """The service agent autostarts (its model loading: GPUs held, the port not bound yet); a second agent started
    by hand with its own state directory autostarts the same default profile; the operator stops the model."""
    cfg_a, cfg_b = two_configs(tmp_path, load_s=25)
    a = Agent(tmp_path, cfg_a, "a")
    cleanup.append(a)
    await a.wait_state(lambda s: s["state"] == "starting", 40, "the service agent's autostart loading")
    await wait_until(lambda: list((tmp_path / "sim-state").glob("engine-*")), 30, "its engine on the GPUs")
    leaders = run_leaders(tmp_path)
    assert len(leaders) == 1, leaders
    server = leaders[0]

    b = Agent(tmp_path, cfg_b, "b", sock=tmp_path / "run" / "b.sock")
    cleanup.append(b)
    await b.wait_notify("READY=1", 40)
    db_b = tmp_path / "b" / "lynxtop.db"

    async def b_said() -> str:
        return f"{(await b.status())['serving']}\n{b.output()}\n{db_rows(db_b, 'SELECT kind, message FROM events')}"

    held = await wait_until(lambda: events(db_b, "agent.autostart_held"), 40, b_said)
    message, details = held[0]["message"], json.loads(held[0]["details"])
    assert "another lynxtop agent's run" in message and f"pid {server}" in message, message
    assert str(tmp_path / "state" / "logs") in message, message  # where that agent's runs start: its state dir
    assert details["reason"] == "other_agent_run", details
    st = (await b.status())["serving"]
    assert st["state"] == "stopped" and "another lynxtop agent's run" in st["reason"], st

    # an operator's start on the second agent: refused, saying whose run holds the GPUs
    code, body = await b.api("POST", "/v1/start", {"profile": "v4-tp8"})
    assert code == 409 and body["error"] == "gpus_taken", body
    assert "another lynxtop agent's run" in body["message"], body
    assert (await a.status())["serving"]["state"] == "starting", "loaded too soon for the test to mean anything"

    await a.wait_state(lambda s: s["state"] == "ready", 60, "the service agent's run ready")
    # the operator stops the model on the service's agent: the second agent must not load it again
    code, body = await a.api("POST", "/v1/stop", {})
    assert code == 202, body
    await a.wait_state(lambda s: s["state"] == "stopped", 40)
    await wait_until(lambda: not run_leaders(tmp_path), 30, "the service agent's run gone")
    t0 = time.monotonic()
    while time.monotonic() - t0 < 4:
        st = (await b.status())["serving"]
        assert st["state"] == "stopped", f"the second agent started the model the operator stopped: {st}"
        await asyncio.sleep(0.1)
    assert not db_rows(db_b, "SELECT id FROM runs"), "the second agent spawned a run"
    assert not run_leaders(tmp_path)

    # an operator's start there, the GPUs free: it serves
    code, body = await b.api("POST", "/v1/start", {"profile": "v4-tp8"})
    assert code == 202, body
    await b.wait_state(lambda s: s["state"] in ("starting", "ready"), 30, "the second agent's start under way")


# ---------------------------------------------------------------------------------------------- listed, then gone

class Ticks:
    """The sampler's ticks on a real NodeGpuView: every `every_s` a sample lists the rows of `listed` (pids)."""

    def __init__(self, view: NodeGpuView, listed: list[int], every_s: float = 0.25):
        self.view, self.listed, self.every_s = view, listed, every_s
        self._stop = threading.Event()
        self.sample()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        rows = [{"gpu": 0, "pid": p, "used_mem_bytes": 1 << 30} for p in list(self.listed)]
        self.view.update(time.monotonic(), rows, {"state": "ok"}, [{"idx": i, "name": "NVIDIA H200"} for i in range(8)])

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def __enter__(self) -> Ticks:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)


def gone_pid() -> int:
    """The pid of a process that ran and was reaped: /proc shows it no more."""
    p = subprocess.Popen(["true"])
    p.wait(10)
    assert procs.stat(p.pid) is None
    return p.pid


@pytest.fixture
def prof(h, tmp_path):
    return load_config(str(h.write_config(tmp_path))).profile("alpha")


def test_a_process_listed_then_gone_is_no_holder(prof):
    view = NodeGpuView()
    short = subprocess.Popen(["sleep", "300"])
    ticks = Ticks(view, [short.pid], every_s=0.5)  # the tick listed it while it ran
    short.kill()
    short.wait(5)  # exited and reaped before the look reads /proc
    ticks.listed.clear()  # the next tick's NVML list no longer has it
    with ticks:
        taken = gpu_holders.GpuGuard(view).look(prof, lambda: [])
    assert taken is not None and not taken, taken.what() if taken else taken


def test_a_pid_proc_does_not_show_but_nvml_lists_again_counts(prof):
    """A container's process: listed by NVML, invisible in this /proc; and a live foreign process, as before."""
    view = NodeGpuView()
    hidden = gone_pid()
    job = subprocess.Popen(["sleep", "300"])
    try:
        with Ticks(view, [hidden, job.pid]):
            taken = gpu_holders.GpuGuard(view).look(prof, lambda: [])
        assert taken and sorted(taken.pids()) == sorted([hidden, job.pid]), taken
        assert f"pid {hidden} (?" in taken.what() and f"pid {job.pid} (sleep" in taken.what()
    finally:
        job.kill()
        job.wait(5)


def test_a_look_with_no_later_sample_still_counts_the_unseen_pid(prof):
    """No later sample within the bound (a sampler stuck in NVML): the pid counts, as it did (the safe side)."""
    view = NodeGpuView()
    hidden = gone_pid()
    Ticks(view, [hidden])  # one sample, no ticks after it
    t0 = time.monotonic()
    taken = gpu_holders.GpuGuard(view).look(prof, lambda: [])
    assert taken and taken.pids() == [hidden]
    assert time.monotonic() - t0 < gpu_holders.CONFIRM_WAIT_S + 2


# ---------------------------------------------------------------------------------- a retry, and retitled workers

DIES = f"#!{sys.executable}\nimport sys, time\ntime.sleep(0.5)\nsys.exit(1)\n"


@pytest.fixture
def other_run(tmp_path_factory):
    """Another agent's run as /proc shows it: a session leader carrying a run token (its API server), started in
    that agent's run-log directory and not below this process (double-forked: an agent is no ancestor of another's
    run), and below it a GPU worker whose environ names nothing (`env -i`: as vLLM's retitled workers read).
    Yields (server, worker, its directory)."""
    where = tmp_path_factory.mktemp("other-agent") / "logs"  # not under the test's own directory (ProcGpuView)
    where.mkdir()
    token = "0123456789abcdef"
    subprocess.run(["sh", "-c", "setsid sh -c 'env -i sleep 300 & wait' </dev/null >/dev/null 2>&1 &"], cwd=where,
                   env={"PATH": "/usr/bin:/bin", procs.RUN_TOKEN_ENV: token}, check=True, timeout=20)

    def find() -> tuple[int, int] | None:
        for pid in procs.all_pids():
            try:
                here = os.readlink(f"/proc/{pid}/cwd") == str(where)
            except OSError:
                continue
            if here and procs.environ_value(pid, procs.RUN_TOKEN_ENV) == token:
                for child in procs.all_pids():
                    st = procs.stat(child)
                    if st is not None and st.ppid == pid and procs.environ_blank(procs.environ_raw(child)):
                        return pid, child
        return None

    deadline = time.monotonic() + 20
    while (found := find()) is None:
        assert time.monotonic() < deadline, "the other agent's run did not start"
        time.sleep(0.05)
    server, worker = found
    assert procs.stat(server).ppid != os.getpid()
    yield server, worker, str(where)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server, signal.SIGKILL)


def test_a_retitled_worker_is_told_by_its_servers_token(prof, other_run):
    server, worker, where = other_run
    view = NodeGpuView()
    with Ticks(view, [worker]):
        guard = gpu_holders.GpuGuard(view)
        taken = guard.look(prof, lambda: [])
        assert taken and taken.pids() == [worker]
        assert [(r.pid, r.cwd) for r in taken.other_runs()] == [(server, where)]
        assert "they are another lynxtop agent's run (its server pid" in taken.what()
        assert "through the agent that supervises it" in taken.refusal(prof)
        guard.own_tokens = lambda: {"0123456789abcdef"}  # this agent's own run's token: not another agent's
        assert not guard.look(prof, lambda: []).other_runs()


async def test_a_retry_is_held_when_another_agents_run_took_the_gpus(make_sup, h, store, tmp_path, other_run):
    server, worker, _ = other_run
    exe = tmp_path / "dies"
    exe.write_text(DIES)
    exe.chmod(0o755)
    foreign: list[int] = []

    class Crowded(h.ProcGpuView):
        def compute_pids(self):
            seen = super().compute_pids()
            return None if seen is None else (seen[0], seen[1] | {p for p in foreign if procs.alive(p)})

    sup = make_sup(gpus=Crowded(), profiles=profile("load", exe, readiness_timeout_s=20, stop_grace_s=2,
                                                     shutdown_timeout_s=1))
    await sup.start("load", by="test")
    await h.wait_for(lambda: sup.proc is not None, 20, what="the load started")
    foreign.append(worker)  # another agent's run takes the GPUs while this one's load dies
    await h.wait_for(lambda: events_of(h, store, "serving.crash"), 20, what="the crash")
    await h.wait_for(lambda: sup.state == "stopped" and sup.action is None, 30, what="the retry held")
    assert "another lynxtop agent's run" in sup.reason and f"pid {server}" in sup.reason, sup.reason
    held = [e for e in events_of(h, store, "serving.backoff") if json.loads(e["details"]).get("reason")
            == gpu_holders.OTHER_AGENT]
    assert len(held) == 1 and held[0]["severity"] == "error", held
    os.killpg(server, signal.SIGKILL)  # that run ends: the GPUs free
    await asyncio.sleep(1.5)  # several backoff_initial_s (0.2 here)
    assert sup.state == "stopped" and len(h.db_rows(store.path, "SELECT id FROM runs")) == 1


def events_of(h, store, kind: str) -> list[dict]:
    store.flush()
    return h.db_rows(store.path, "SELECT * FROM events WHERE kind = ? ORDER BY id", (kind,))
