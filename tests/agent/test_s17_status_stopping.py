"""While a run stops, GET /v1/status says against which timeouts it drains: the run's vLLM `--shutdown-timeout`
(in-flight requests finish within it) and the agent's `stop_grace_s` (what is left is killed after it), both
counted from `serving.state_since_ms`. Null in any other state.

A real agent process; the stand-in vLLM drains for 3 s on SIGTERM, so the stop phase lasts long enough to read.
"""

from __future__ import annotations

import contextlib
import os
import signal

import pytest
from support.agent_config import agent_toml, profile
from support.agent_proc import Agent

from lynxtop.agent.serving import procs

pytestmark = pytest.mark.timeout(90)

STANDIN = os.path.join(os.path.dirname(__file__), "standin_vllm.py")
DRAIN = {"STANDIN_MODE": "drain", "STANDIN_DRAIN_S": "3"}


def _config(tmp_path):
    profiles = profile("alpha", STANDIN, model="m", readiness_timeout_s=20, stop_grace_s=12, shutdown_timeout_s=7)
    path = tmp_path / "config.toml"
    path.write_text(agent_toml(tmp_path / "state" / "lynxtop.db", tmp_path / "run" / "agent.sock", fake_nvml="sim",
                               sample_interval_s=0.2, default_profile="alpha", autostart=True,
                               backoff_initial_s=0.3, backoff_max_s=1, gpu_release_timeout_s=5, profiles=profiles))
    return path


async def test_a_stopping_run_serves_its_drain_timeouts(tmp_path, cleanup):
    a = Agent(tmp_path, _config(tmp_path), env=DRAIN)
    cleanup.append(a)
    try:
        st = await a.wait_state(lambda s: s["state"] == "ready", what="autostart")
        assert st["serving"]["shutdown_timeout_s"] is None and st["serving"]["stop_grace_s"] is None
        code, body = await a.api("POST", "/v1/stop", {})
        assert code == 202, body
        st = await a.wait_state(lambda s: s["state"] == "stopping", what="the stop's drain")
        serving = st["serving"]
        assert serving["shutdown_timeout_s"] == 7 and serving["stop_grace_s"] == 12, serving
        assert serving["state_since_ms"] is not None and serving["state_since_ms"] <= st["ts_ms"]
        st = await a.wait_state(lambda s: s["state"] == "stopped", what="stopped")
        assert st["serving"]["shutdown_timeout_s"] is None and st["serving"]["stop_grace_s"] is None
        assert a.stop() == 0
    finally:
        logs = os.path.realpath(tmp_path / "state" / "logs")
        for pid in procs.runs_started_in(logs):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
