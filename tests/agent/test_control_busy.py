"""The 409 a second control request gets says when the running action will end (issue 25.5)."""

from __future__ import annotations

import pytest

from lynxtop.agent.api.control import ActionError

wait_for = None  # bound from the `h` fixture (tests import only lynxtop.*)


@pytest.fixture(autouse=True)
def _helpers(h):
    global wait_for
    wait_for = h.wait_for


async def test_busy_answer_names_the_deadline_of_the_running_switch(make_sup):
    """A restart asked during a switch: the answer gives the elapsed time and the latest end, the sum of the
    timeouts the switch can still run into (stop, kill, GPU release, the new profile's readiness)."""
    sup = make_sup()
    await sup.start("alpha", by="uid 0 (root)")
    await wait_for(lambda: sup.state == "ready" and sup.action is None, 15, what="ready")
    await sup.switch("beta", by="uid 1000 (alice)")
    with pytest.raises(ActionError) as exc:
        await sup.restart(by="uid 1001 (bob)")
    err = exc.value
    assert err.code == "busy" and err.http_status == 409
    since = err.details["action"]["since_ms"]
    # make_sup: stop_grace_s 3, kill wait 5, gpu_release_timeout_s 5, beta's readiness_timeout_s 20
    assert err.details["deadline_ms"] - since == 33_000
    assert 0 <= err.details["elapsed_s"] <= err.details["deadline_ms"] / 1000
    assert 0 < err.details["retry_after_s"] <= 33
    assert "ends by" in err.message and "at the latest" in err.message
    assert "stop_grace_s 3 s + kill wait 5 s + gpu_release_timeout_s 5 s + readiness_timeout_s 20 s" in err.message
    await wait_for(lambda: sup.action is None and sup.state == "ready", 20, what="switch done")
    await sup.shutdown(stop_serving=True)
