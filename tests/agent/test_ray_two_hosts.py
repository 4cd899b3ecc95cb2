"""Two hosts, real Ray: a head agent and a worker agent in their own network namespaces (tests/support/netns.py).

The head's agent runs `ray start --head` and the simulated vLLM with `--distributed-executor-backend ray`
(TP 2 x PP 2: four GPUs, two per node, declared to Ray with --num-gpus); the worker's agent runs
`ray start --address HEAD`. The test waits for the cluster, serves, kills the worker's raylet (Ray dying on
that node) and checks what each side records and that serving comes back by itself; then a plain stop on
the head leaves the worker's Ray up and `stop --cluster` stops everything. Where namespaces cannot be made,
the same runs on loopback and the test says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import signal
import sys
import time
import warnings
from pathlib import Path

import pytest
from support.agent_config import agent_toml, sim_profile
from support.agent_proc import Agent
from support.netns import two_hosts
from support.ports import free_port, short_dir
from support.real import unavailable
from support.waits import holds_async

from lynxtop.agent.serving import procs

pytestmark = [pytest.mark.timeout(420)]


@pytest.fixture(autouse=True)
def _ray_present() -> None:
    """Ray is a test dependency: absent, this real stage skips here and fails in CI (support/real.py)."""
    if importlib.util.find_spec("ray") is None:
        unavailable("Ray is not installed (pip install 'lynxtop[ray]'): this test runs Ray")

RAY_ENV = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}
SIM_ARGS = ("--sim-param", "weights_bytes_total=40000000000", "--sim-log-interval", "1")


def _ray_table(**keys) -> str:
    lines = []
    for k, v in keys.items():
        if isinstance(v, dict):
            lines.append(f"{k} = {{ " + ", ".join(f'{a} = "{b}"' for a, b in v.items()) + " }")
        elif isinstance(v, str):
            lines.append(f'{k} = "{v}"')
        else:
            lines.append(f"{k} = {v}")
    return "\n[ray]\n" + "\n".join(lines) + "\n"


def configs(tmp: Path, run: Path, hosts) -> tuple[Path, Path]:
    common = {"fake_nvml": "sim", "sample_interval_s": 0.5, "backoff_initial_s": 1, "backoff_max_s": 2,
              "crash_loop_failures": 10, "gpu_release_timeout_s": 10}
    port, dash = free_port(), free_port()
    head = agent_toml(tmp / "head" / "lynxtop.db", run / "head.sock", role="head", default_profile="pp2",
                      autostart=True, **common,
                      profiles=sim_profile("pp2", tp=2, pipeline_parallel_size=2, distributed_executor_backend="ray",
                                           startup_s=1, sim_args=SIM_ARGS, readiness_timeout_s=180, stop_grace_s=10))
    head += _ray_table(port=port, dashboard_port=dash, node_ip_address=hosts.addrs[0], num_gpus=2, num_cpus=2,
                       temp_dir=str(run / "rh"), view_interval_s=0.5, env=RAY_ENV)
    worker = agent_toml(tmp / "worker" / "lynxtop.db", run / "worker.sock", role="worker", **common)
    worker += _ray_table(head_address=f"{hosts.addrs[0]}:{port}", node_ip_address=hosts.addrs[1], num_gpus=2,
                         num_cpus=2, temp_dir=str(run / "rw"), env=RAY_ENV)
    (tmp / "head.toml").write_text(head)
    (tmp / "worker.toml").write_text(worker)
    return tmp / "head.toml", tmp / "worker.toml"


async def wait_status(agent: Agent, pred, timeout: float, what: str) -> dict:
    deadline = time.monotonic() + timeout
    st: dict = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, asyncio.TimeoutError, ValueError):
            st = await agent.status()
            if pred(st):
                return st
        assert agent.proc.poll() is None, f"agent exited: {agent.output()}"
        await asyncio.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}: serving {st.get('serving', {}).get('state')} "
                         f"({st.get('serving', {}).get('reason')}); cluster {st.get('cluster')}\n{agent.output()}")


async def events(agent: Agent, *kinds: str, timeout: float = 30) -> list[dict]:
    """The agent's events, once every one of `kinds` is among them (events reach the store with the next tick)."""
    deadline = time.monotonic() + timeout
    while True:
        got = (await agent.api("GET", "/v1/events?limit=2000"))[1]["events"]
        missing = set(kinds) - {e["kind"] for e in got}
        if not missing:
            return got
        assert time.monotonic() < deadline, f"no {sorted(missing)} in {[e['kind'] for e in got]}"
        await asyncio.sleep(0.25)


def ray_pids(temp_dir: Path, name: str = "") -> list[int]:
    """Live processes of one Ray node (its temp dir is in every command line of the node's daemons)."""
    out = []
    for pid in procs.all_pids():
        args = procs.cmdline(pid) or []
        if any(str(temp_dir) in a for a in args) and (not name or name in " ".join(args)) and procs.alive(pid):
            out.append(pid)
    return out


def serving(st: dict) -> dict:
    return st["serving"]


async def test_two_hosts_serve_lose_a_worker_recover_and_stop_the_cluster(tmp_path):
    with two_hosts() as hosts, short_dir("lxray") as run:
        if hosts.fallback:
            warnings.warn(f"two-host Ray test on loopback: {hosts.fallback}", stacklevel=1)
        head_cfg, worker_cfg = configs(tmp_path, run, hosts)
        env = {"RAY_USAGE_STATS_ENABLED": "0"}
        head = Agent(tmp_path, head_cfg, name="head", sock=run / "head.sock", prefix=hosts.prefix(0), env=env)
        worker = None
        try:
            # the head alone: Ray up, serving held back, saying what is missing
            st = await wait_status(head, lambda s: serving(s)["state"] == "waiting" and "2 missing"
                                   in serving(s)["reason"], 90, "the head waiting for GPUs")
            assert "it has 2 on 1 node(s)" in serving(st)["reason"] and st["cluster"]["role"] == "head"
            assert st["cluster"]["ray_state"] == "running" and st["cluster"]["gpus_needed"] == 4
            worker = Agent(tmp_path, worker_cfg, name="worker", sock=run / "worker.sock", prefix=hosts.prefix(1),
                           env=env)
            st = await wait_status(head, lambda s: serving(s)["state"] == "ready", 180, "serving across two nodes")
            nodes = [n for n in st["cluster"]["nodes"] if n["alive"]]
            assert sorted(n["ip"] for n in nodes) == sorted(hosts.addrs) or hosts.fallback
            assert sum(n["gpus"] for n in nodes) == 4
            first_run = serving(st)["run_id"]
            log = "\n".join((await head.api("GET", f"/v1/logs?run={first_run}&lines=400"))[1]["lines"])
            assert "started 4 RayWorkerWrapper actors on 2 node(s)" in log or hosts.fallback, log[-2000:]
            assert all(f"{ip} (2)" in log for ip in hosts.addrs) or hosts.fallback  # vLLM's ranks on both hosts
            kinds = [e["kind"] for e in await events(head, "cluster.whole")]
            assert kinds.index("cluster.waiting") < kinds.index("cluster.node_joined") < kinds.index("cluster.whole")
            wst = await worker.status()
            assert wst["cluster"]["role"] == "worker" and wst["cluster"]["ray_state"] == "running"
            assert wst["serving"]["state"] == "stopped"  # a worker serves no vLLM

            # the head's agent restarts (an upgrade): Ray and vLLM keep running, adopted, never restarted
            ray_pid, vllm_pid = st["cluster"]["ray_pid"], serving(st)["pid"]
            assert head.stop() == 0
            head = Agent(tmp_path, head_cfg, name="head2", sock=run / "head.sock", prefix=hosts.prefix(0), env=env)
            st = await wait_status(head, lambda s: serving(s)["state"] == "ready" and s["cluster"]["nodes"], 60,
                                   "the new head agent adopting Ray and vLLM")
            assert st["cluster"]["ray_pid"] == ray_pid and serving(st)["pid"] == vllm_pid
            assert serving(st)["run_id"] == first_run and serving(st)["adopted"]
            kinds = [e["kind"] for e in await events(head, "ray.adopted", "serving.adopted")]
            assert "serving.crash" not in kinds and kinds.count("ray.starting") == 1

            # the worker's Ray dies
            [raylet] = ray_pids(run / "rw", "raylet")
            os.kill(raylet, signal.SIGKILL)
            old_pid = wst["cluster"]["ray_pid"]
            await wait_status(worker, lambda s: s["cluster"]["ray_state"] == "running"
                              and s["cluster"]["ray_pid"] != old_pid, 120, "the worker's Ray restarted")
            await events(worker, "ray.exited", "ray.backoff")
            st = await wait_status(head, lambda s: serving(s)["state"] == "ready" and serving(s)["run_id"] != first_run,
                                   240, "serving back once the cluster is whole")
            hev = await events(head, "cluster.node_lost", "serving.crash")
            lost = [e for e in hev if e["kind"] == "cluster.node_lost"]
            assert lost and lost[0]["details"]["ip"] == hosts.addrs[1], lost
            assert lost[0]["details"]["state_message"]  # Ray's reason, as Ray gives it
            crash = [e for e in hev if e["kind"] == "serving.crash" and e["run_id"] == first_run]
            assert crash, [e["kind"] for e in hev]
            rejoined = [e for e in hev if e["kind"] == "cluster.node_joined" and e["id"] > lost[0]["id"]]
            assert rejoined and rejoined[0]["details"]["ip"] == hosts.addrs[1]  # a new node id, the same host

            # a plain stop on the head stops serving only
            code, body = await head.api("POST", "/v1/stop", {})
            assert code == 202, body
            await wait_status(head, lambda s: serving(s)["state"] == "stopped" and not s["agent"]["action"], 60,
                              "serving stopped")

            async def worker_ray_running() -> bool:
                return (await worker.status())["cluster"]["ray_state"] == "running"

            await holds_async(worker_ray_running, 1.0, what="the worker's Ray running after a plain stop")
            assert (await head.status())["cluster"]["ray_state"] == "running"

            # the cluster stop: every worker's Ray, then the head's
            cli = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "lynxtop", "stop", "--cluster", "--yes", "--socket", str(run / "head.sock"),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
            out = (await asyncio.wait_for(cli.communicate(), 60))[0].decode()
            assert cli.returncode == 0 and "stopping the cluster" in out, out
            wst = await wait_status(worker, lambda s: s["cluster"]["ray_state"] == "stopped", 120,
                                    "the worker's Ray stopped by the head")
            assert "stop --cluster" in wst["cluster"]["ray_reason"]
            await wait_status(head, lambda s: s["cluster"]["ray_state"] == "stopped", 120, "the head's Ray stopped")
            deadline = time.monotonic() + 30
            while (ray_pids(run / "rh") or ray_pids(run / "rw")) and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            assert not ray_pids(run / "rh") and not ray_pids(run / "rw")
            stop_ev = [e for e in await events(head, "ray.stopped") if e["kind"] == "cluster.stop"][-1]
            assert stop_ev["details"]["nodes"][0]["ok"], stop_ev
            assert worker.stop() == 0 and head.stop() == 0
        finally:
            for a in (worker, head):
                if a is not None and a.proc.poll() is None:
                    a.stop()
            for pid in ray_pids(run / "rh") + ray_pids(run / "rw"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
