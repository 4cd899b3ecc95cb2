"""The idle probe (`[agent] idle_probe_s`, session 25) against the real vLLM (CPU build, the tiny model): the
served model's name is learnt from the real `/v1/models`, the real server answers the 1-token completion, and an
idle healthy server is never judged hung nor the probe turned off. The hang itself is the simulator's
(`--sim-fail hang-after-idle`, tests/agent/test_s25_idle_hang.py): a real engine cannot be made to hang here.
"""

from __future__ import annotations

import pytest
from rv_support import counter, http_get, wait_for

pytestmark = [pytest.mark.real_vllm, pytest.mark.timeout(900)]

IDLE_S = 5.0


def test_an_idle_real_server_is_probed_answers_and_is_never_judged_hung(own_agent):
    with own_agent(idle_probe_s=IDLE_S, hang_timeout_s=60) as ag:
        code, body = ag.post("/v1/start", {"profile": "tiny"})
        assert code == 202, (code, body)
        ag.wait_state({"ready"}, 400)
        # nobody sends a request: each answered probe is one request vLLM counts, as docs/agent.md says
        wait_for(lambda: counter(http_get(ag.port, "/metrics")[1], "vllm:request_success") >= 2, 3 * IDLE_S + 120,
                 "two idle probes answered by the real server (vllm:request_success)")
        events = ag.events()
        off = [e["message"] for e in events if e["kind"] == "serving.idle_probe_off"]
        assert not off, off
        kinds = {e["kind"] for e in events}
        assert not kinds & {"serving.degraded.hang", "serving.degraded.health"}, kinds
        assert ag.serving()["state"] == "ready"
        assert "Bearer" not in ag.log.read_text()
