"""Fixtures of the real-vLLM stage: the prepared vLLM CPU venv + tiny model, and one agent shared by the module.

One real server load costs 20-80 s on this 2-core machine, so the module shares one agent (and as far as the
scenario allows, one server) across its tests, in file order.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from rv_support import PREPARE, Agent, describe, kill_tree, operators_group, vllm_processes
from support.agent_config import agent_toml, profile
from support.ports import free_port
from support.real import unavailable


@dataclass(frozen=True)
class Prepared:
    root: Path
    python: Path
    vllm: Path
    ray: Path  # Ray in vLLM's venv (test_real_vllm_ray.py)
    model: Path

    def env(self) -> dict[str, str]:
        """What the CPU build needs (see prepare.py): tiny KV cache, no hub, no telemetry, private caches."""
        return {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
                "VLLM_CACHE_ROOT": str(self.root / "vllm-cache"), "HF_HOME": str(self.root / "hf-home")}


@pytest.fixture(scope="session")
def prepared() -> Prepared:
    """Build or reuse the cached venv and model; skip (saying why) when they cannot be built here, or fail under
    LYNXTOP_REQUIRE_REAL=1 (CI), where a stage that did not run must not pass as one that did."""
    try:
        proc = subprocess.run([sys.executable, str(PREPARE)], capture_output=True, text=True, timeout=1200)
    except subprocess.TimeoutExpired:
        unavailable("real vLLM: prepare.py took over 20 min (no package registry reachable?)")
    lines = proc.stdout.strip().splitlines()
    try:
        info = json.loads(lines[-1])
    except (IndexError, ValueError):
        unavailable(f"real vLLM: prepare.py printed no result; stderr: {proc.stderr[-800:]}")
    if proc.returncode != 0 or not info.get("ok"):
        unavailable(f"real vLLM: could not build the vLLM CPU venv or model (prepare.py exited {proc.returncode}): "
                    f"{info.get('error')} (log: {info.get('log')})")
    return Prepared(root=Path(info["root"]), python=Path(info["python"]), vllm=Path(info["vllm"]),
                    ray=Path(info["ray"]), model=Path(info["model"]))


def agent_config(prepared: Prepared, state: Path, port: int, **agent_keys: object) -> str:
    """Three profiles on one port: the main one, a switch target and one that vLLM rejects at start-up;
    `agent_keys`: more [agent] keys (a test's own agent)."""
    flags = ["--dtype", "float32", "--enforce-eager"]

    def tiny(name: str, description: str, **keys: object) -> str:
        return profile(name, prepared.vllm, model=str(prepared.model), port=port, description=description,
                       **keys, served_model_name="tiny", max_model_len=512, shutdown_timeout_s=10, stop_grace_s=40,
                       readiness_timeout_s=400, env=prepared.env())

    return agent_toml(
        state / "lynxtop.db", state / "agent.sock", socket_group=operators_group(), log_dir=state / "logs",
        sample_interval_s=1.0, backoff_initial_s=2, backoff_max_s=4, crash_loop_failures=4, gpu_release_timeout_s=30,
        live_restore=True, sla={"window_s": 900}, **agent_keys,
        profiles=[tiny("tiny", "tiny random Llama on vLLM's CPU build", max_num_seqs=8, extra_args=flags),
                  tiny("tiny-b", "same model, fewer sequences: the switch target", max_num_seqs=4, extra_args=flags),
                  tiny("badflag", "a flag vLLM rejects: must end in an event quoting vLLM and in backoff",
                       extra_args=[*flags, "--no-such-flag-lynxtop"])])


@contextlib.contextmanager
def running_agent(prepared: Prepared, request: pytest.FixtureRequest, **agent_keys: object) -> Iterator[Agent]:
    """The real `lynxtop agent` with profiles pointing at the prepared vLLM (`agent_keys`: more [agent] keys);
    stopped and swept afterwards.

    Its state (database, agent log, vLLM run logs) lives in a directory of its own, printed at the end, so a
    failure can be read after the fact (pytest's numbered temp dirs are pruned by other runs).
    """
    state = Path(tempfile.mkdtemp(prefix="lynxtop-real-vllm-"))
    port = free_port()
    cfg = state / "config.toml"
    cfg.write_text(agent_config(prepared, state, port, **agent_keys))
    ag = Agent(config=cfg, socket=state / "agent.sock", database=state / "lynxtop.db", log=state / "agent.log")
    ag.port = port  # type: ignore[attr-defined]
    before = {p.pid for p in vllm_processes(prepared.root)}
    failed_before = request.session.testsfailed
    ag.start()
    try:
        yield ag
    finally:
        # live_restore keeps serving across an agent exit: stop serving first, then the agent.
        try:
            if ag.proc is not None and ag.proc.poll() is None:
                ag.post("/v1/stop")
                ag.wait_state({"stopped"}, 60)
        except (OSError, AssertionError):
            pass
        ag.stop()
        stray = [p.pid for p in vllm_processes(prepared.root) if p.pid not in before]
        leaked = describe(stray)
        kill_tree(stray)
        if request.session.testsfailed == failed_before and not stray:
            shutil.rmtree(state, ignore_errors=True)
        else:
            print(f"\nreal-vLLM agent state kept (database, agent.log, logs/): {state}")
        assert not stray, "the agent left vLLM processes behind:\n  " + "\n  ".join(leaked)


@pytest.fixture(scope="module")
def agent(prepared: Prepared, request: pytest.FixtureRequest) -> Iterator[Agent]:
    """One agent shared by the module (see the module's docstring)."""
    with running_agent(prepared, request) as ag:
        yield ag


@pytest.fixture
def own_agent(prepared: Prepared, request: pytest.FixtureRequest):
    """`own_agent(**agent_keys)`: a context manager running an agent of the test's own (other [agent] keys)."""
    return lambda **agent_keys: running_agent(prepared, request, **agent_keys)
