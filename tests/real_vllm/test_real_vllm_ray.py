"""Real vLLM on real Ray across two agents: what vLLM 0.32's CPU build does with `--distributed-executor-backend ray`.

A head agent and a worker agent on loopback (state dirs, sockets, Ray ports and temp dirs of their own), each
running `ray start` from vLLM's venv (prepare.py installs Ray there, so Ray's workers can import vLLM), one CPU
"GPU" declared per node. The head's profile is the tiny model at pipeline parallel 2 on Ray.

vLLM's CPU build refuses Ray: `ValueError: current platform cpu does not support ray.` (its CpuPlatform has no
`ray_device_key`; vllm/v1/executor/ray_utils.py initialize_ray_cluster, for both Ray executors). So the
multi-node serving scenario stays on the simulator (tests/agent/test_ray_two_hosts.py) and this test pins what
the real parts do up to that refusal: the head waits for the worker's GPU, hands vLLM the cluster's address,
vLLM joins that cluster and refuses, and the agent records the crash with vLLM's own line and backs off. The
day a CPU build serves on Ray this test fails, saying so: then it becomes the full scenario (docs/cluster.md).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest
from rv_support import Agent, kill_tree, vllm_processes, wait_for
from support.agent_config import agent_toml, profile, toml_value
from support.ports import free_port, short_dir

pytestmark = [pytest.mark.real_vllm, pytest.mark.timeout(900)]

REFUSAL = "current platform cpu does not support ray"
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_health_check_period_ms": "1000"}


def _ray(**keys: object) -> str:
    return "\n[ray]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in keys.items())


def configs(prepared, state: Path, run: Path) -> tuple[Path, Path]:
    """Head and worker: loopback, one declared GPU and one CPU each, Ray from vLLM's venv. A long first backoff:
    the test needs one refused start, not a loop of them on 2 shared cores."""
    common = {"sample_interval_s": 1.0, "backoff_initial_s": 60, "backoff_max_s": 120, "crash_loop_failures": 4,
              "gpu_release_timeout_s": 10}
    gcs, dash = free_port(), free_port()
    for node in ("head", "worker"):  # a state directory each: one agent per directory (agent.lock)
        (state / node).mkdir()
    pp2 = profile("pp2", prepared.vllm, model=str(prepared.model), served_model_name="tiny", max_model_len=512,
                  max_num_seqs=4, pipeline_parallel_size=2, distributed_executor_backend="ray",
                  extra_args=["--dtype", "float32", "--enforce-eager"], env=prepared.env(),
                  shutdown_timeout_s=5, stop_grace_s=20, readiness_timeout_s=400,
                  description="tiny model, PP 2 over Ray's two nodes")
    ray = {"executable": prepared.ray, "node_ip_address": "127.0.0.1", "num_gpus": 1, "num_cpus": 1,
           "env": RAY_ENV}
    head = agent_toml(state / "head" / "lynxtop.db", run / "head.sock", role="head", default_profile="pp2",
                      autostart=True, log_dir=state / "head" / "logs", **common, profiles=pp2)
    head += _ray(port=gcs, dashboard_port=dash, temp_dir=str(run / "rh"), view_interval_s=1.0, **ray)
    worker = agent_toml(state / "worker" / "lynxtop.db", run / "worker.sock", role="worker",
                        log_dir=state / "worker" / "logs", **common)
    worker += _ray(head_address=f"127.0.0.1:{gcs}", temp_dir=str(run / "rw"), **ray)
    (state / "head.toml").write_text(head)
    (state / "worker.toml").write_text(worker)
    return state / "head.toml", state / "worker.toml"


def ray_pids(*temp_dirs: Path) -> list[int]:
    """Live processes of our Ray nodes: each node's temp dir is in its daemons' command lines."""
    marks = [str(d) for d in temp_dirs]
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        with contextlib.suppress(psutil.Error):
            if p.info["status"] != psutil.STATUS_ZOMBIE and any(m in a for a in p.info["cmdline"] or [] for m in marks):
                out.append(p.pid)
    return out


def kinds(agent: Agent) -> list[str]:
    return [e["kind"] for e in sorted(agent.events(), key=lambda e: e["id"])]


def test_vllm_cpu_on_two_agents_ray_cluster_refuses_ray_and_the_head_records_it(prepared):
    state = Path(tempfile.mkdtemp(prefix="lynxtop-real-ray-"))
    with short_dir("lxrr") as run:
        head_cfg, worker_cfg = configs(prepared, state, run)
        head = Agent(config=head_cfg, socket=run / "head.sock", database=state / "head" / "lynxtop.db",
                     log=state / "head" / "agent.log")
        worker = Agent(config=worker_cfg, socket=run / "worker.sock", database=state / "worker" / "lynxtop.db",
                       log=state / "worker" / "agent.log")
        ok = False
        before = {p.pid for p in vllm_processes(prepared.root)}
        try:
            # the head alone: its Ray (from vLLM's venv) up, serving held at the gate, saying what is missing
            head.start()
            st = wait_for(lambda: (s := head.status())["serving"]["state"] == "waiting"
                          and "1 missing" in s["serving"]["reason"] and s, 180, "the head waiting for a 2nd GPU")
            assert st["cluster"]["ray_state"] == "running" and st["cluster"]["gpus_needed"] == 2, st["cluster"]

            # the worker joins: the gate opens and vLLM starts on the cluster, then refuses Ray
            worker.start()
            st = wait_for(lambda: (s := head.status())["serving"]["state"] in ("backoff", "crash-loop", "ready")
                          and s, 400, "vLLM on Ray to refuse (or to serve)")
            assert st["serving"]["state"] != "ready", (
                "vLLM's CPU build now SERVES with --distributed-executor-backend ray: make this the full two-node "
                "scenario (traffic, kill the worker's Ray, the head notices) and update docs/cluster.md")
            seen = kinds(head)
            assert seen.index("cluster.waiting") < seen.index("cluster.whole") < seen.index("serving.crash"), seen
            assert sum(n["gpus"] for n in st["cluster"]["nodes"] if n["alive"]) == 2, st["cluster"]

            run_id = max(int(r.get("id", r.get("run_id"))) for r in head.runs())  # rows carry "id"
            code, body = head.request("GET", f"/v1/logs?run={run_id}&lines=400")
            assert code == 200, body
            log = "\n".join(body["lines"])
            # the head handed vLLM the address of the agents' cluster (RAY_ADDRESS), and vLLM joined that one
            address = st["cluster"]["address"]
            assert f"Using address {address} set in the environment variable RAY_ADDRESS" in log, log[-3000:]
            assert "Connected to Ray cluster" in log, log[-3000:]
            assert "version 0.32.0" in log and f"ValueError: {REFUSAL}." in log, log[-3000:]
            crash = [e for e in head.events() if e["kind"] == "serving.crash" and e["run_id"] == run_id]
            assert crash and crash[0]["details"]["exit_code"] not in (None, 0), crash
            wst = worker.status()
            assert wst["cluster"]["ray_state"] == "running" and wst["serving"]["state"] == "stopped", wst

            # the whole cluster stops from the head, through Ray (stop.py runs on vLLM's venv's Python here)
            code, body = head.post("/v1/stop")
            assert code == 202, body
            head.wait_state({"stopped"}, 60)
            cli = subprocess.run([sys.executable, "-m", "lynxtop", "stop", "--cluster", "--yes", "--socket",
                                  str(run / "head.sock")], capture_output=True, text=True, timeout=180)
            assert cli.returncode == 0, cli.stdout + cli.stderr
            wait_for(lambda: worker.status()["cluster"]["ray_state"] == "stopped", 120, "the worker's Ray stopped")
            wait_for(lambda: head.status()["cluster"]["ray_state"] == "stopped", 120, "the head's Ray stopped")
            wait_for(lambda: not ray_pids(run / "rh", run / "rw"), 60, "no Ray process of either node left")
            assert head.stop() == 0 and worker.stop() == 0
            ok = True
        finally:
            worker.stop()
            head.stop()
            stray = ray_pids(run / "rh", run / "rw")
            for pid in stray:
                with contextlib.suppress(psutil.Error):
                    psutil.Process(pid).kill()
            leaked = [p.pid for p in vllm_processes(prepared.root) if p.pid not in before]
            kill_tree(leaked)
            if ok and not stray and not leaked:
                shutil.rmtree(state, ignore_errors=True)
            else:
                print(f"\nreal-vLLM Ray state kept (databases, agent logs, run logs): {state}")
        assert not stray and not leaked, f"left behind: Ray {stray}, vLLM {leaked}"
