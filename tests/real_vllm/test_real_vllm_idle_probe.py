"""The idle probe (`[agent] idle_probe_s`, session 25) against the real vLLM (CPU build, the tiny model): the
served model's name is learnt from the real `/v1/models`, the real server answers the 1-token completion, and an
idle healthy server is never judged hung nor the probe turned off. The hang itself is the simulator's
(`--sim-fail hang-after-idle`, tests/agent/test_s25_idle_hang.py): a real engine cannot be made to hang here.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from rv_support import Agent, counter, describe, http_get, kill_tree, vllm_processes, wait_for
from support.ports import free_port

pytestmark = [pytest.mark.real_vllm, pytest.mark.timeout(900)]

IDLE_S = 5.0


def test_an_idle_real_server_is_probed_answers_and_is_never_judged_hung(prepared, own_config):
    state = Path(tempfile.mkdtemp(prefix="lynxtop-real-vllm-probe-"))
    port = free_port()
    cfg = state / "config.toml"
    cfg.write_text(own_config(state, port, idle_probe_s=IDLE_S, hang_timeout_s=60))
    ag = Agent(config=cfg, socket=state / "agent.sock", database=state / "lynxtop.db", log=state / "agent.log")
    before = {p.pid for p in vllm_processes(prepared.root)}
    ag.start()
    try:
        code, body = ag.post("/v1/start", {"profile": "tiny"})
        assert code == 202, (code, body)
        ag.wait_state({"ready"}, 400)
        # nobody sends a request: each answered probe is one request vLLM counts, as docs/agent.md says
        wait_for(lambda: counter(http_get(port, "/metrics")[1], "vllm:request_success") >= 2, 3 * IDLE_S + 120,
                 "two idle probes answered by the real server (vllm:request_success)")
        kinds = {e["kind"] for e in ag.events()}
        assert "serving.idle_probe_off" not in kinds, [e["message"] for e in ag.events()
                                                       if e["kind"] == "serving.idle_probe_off"]
        assert not kinds & {"serving.degraded.hang", "serving.degraded.health"}, kinds
        assert ag.serving()["state"] == "ready"
        assert "Bearer" not in (state / "agent.log").read_text()
    finally:
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
        shutil.rmtree(state, ignore_errors=True)
        assert not stray, "the agent left vLLM processes behind:\n  " + "\n  ".join(leaked)
