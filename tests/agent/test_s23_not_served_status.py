"""The quantities the served vLLM's page lacks are in the live status, not only an event: `serving.not_served`
(agent/metrics/served.py's keys) and `serving.not_served_version`, and `lynxtop status` prints one line naming them,
so an empty TPOT column reads "not served by this vLLM", not "no traffic".

A real agent process serving the stand-in vLLM, whose /metrics has only the running gauge and the generation token
counter (no TPOT histogram, among others) and whose /version says `0.0.0-standin`; the real `lynxtop status`
against its socket. The status's parse keeps the field, and a status without it (an older agent) reads empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest
from support.agent_config import agent_toml, profile
from support.agent_proc import Agent

from lynxtop.agent.serving import procs
from lynxtop.contract.status import ServingState, ServingStatus, Status, not_served_text

pytestmark = pytest.mark.timeout(120)

STANDIN = os.path.join(os.path.dirname(__file__), "standin_vllm.py")


def _config(tmp_path):
    profiles = profile("alpha", STANDIN, model="m", readiness_timeout_s=30, stop_grace_s=5,
                       shutdown_timeout_s=2)
    path = tmp_path / "config.toml"
    path.write_text(agent_toml(tmp_path / "state" / "lynxtop.db", tmp_path / "run" / "agent.sock", fake_nvml="sim",
                               sample_interval_s=0.2, default_profile="alpha", autostart=True,
                               backoff_initial_s=0.3, backoff_max_s=1, gpu_release_timeout_s=5, profiles=profiles))
    return path


async def _wait_not_served(a: Agent, timeout: float = 60) -> dict:
    """The status once it names a quantity not served (scrapes come after readiness, on a loaded machine late)."""
    await a.wait_state(lambda s: s["state"] == "ready", timeout=timeout, what="autostart")
    deadline = time.monotonic() + timeout
    st: dict = {}
    while time.monotonic() < deadline:
        st = await a.status()
        if st["serving"].get("not_served"):
            return st
        await asyncio.sleep(0.2)
    raise AssertionError(f"no serving.not_served in the status: {st.get('serving')}\n{a.output()}")


async def test_a_family_the_page_lacks_is_in_the_status_and_lynxtop_status(tmp_path, cleanup):
    cfg = _config(tmp_path)
    a = Agent(tmp_path, cfg)
    cleanup.append(a)
    try:
        st = await _wait_not_served(a)
        serving = st["serving"]
        assert "tpot" in serving["not_served"] and "ttft" in serving["not_served"], serving
        assert "running" not in serving["not_served"] and "generation_tokens" not in serving["not_served"], serving
        assert serving["not_served_version"] == "0.0.0-standin", serving
        assert st["serving_metrics"]["tpot_p99_ms"] is None  # the empty column the field explains
        parsed = Status.from_json(st)
        assert parsed.serving.not_served == tuple(serving["not_served"])
        out = subprocess.run([sys.executable, "-m", "lynxtop", "status", "--config", str(cfg)],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        line = next((ln for ln in out.stdout.splitlines() if "not served by vLLM" in ln), None)
        assert line is not None, out.stdout
        assert line.strip().startswith("not served by vLLM 0.0.0-standin: ") and "TPOT" in line, line
        assert line.endswith("(their columns stay empty)"), line
        # stopped: the stopped run's page is no one's now, the field is empty again
        code, body = await a.api("POST", "/v1/stop", {})
        assert code == 202, body
        st = await a.wait_state(lambda s: s["state"] == "stopped", timeout=60, what="stopped")
        assert st["serving"]["not_served"] == [] and st["serving"]["not_served_version"] is None, st["serving"]
        out = subprocess.run([sys.executable, "-m", "lynxtop", "status", "--config", str(cfg)],
                             capture_output=True, text=True, timeout=60)
        assert "not served" not in out.stdout, out.stdout
        assert a.stop() == 0
    finally:
        logs = os.path.realpath(tmp_path / "state" / "logs")
        for pid in procs.runs_started_in(logs):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_an_older_agents_status_reads_every_quantity_served():
    """No field (an agent older than it): empty, and no line; a status carrying it keeps it through JSON."""
    old = Status.from_json({"serving": {"state": "ready"}})
    assert old.serving.not_served == () and old.serving.not_served_version is None
    assert not_served_text(old.serving) == ""
    st = ServingStatus(state=ServingState.READY, not_served=("tpot",), not_served_version="0.10.2")
    back = ServingStatus.from_json(st.to_json())
    assert back == st
    assert not_served_text(back) == "not served by vLLM 0.10.2: TPOT"
    words = ServingStatus(state=ServingState.READY, not_served=("prefix_hits", "tpot"))
    assert not_served_text(words) == "not served by vLLM (version unknown): prefix cache hits, TPOT"
