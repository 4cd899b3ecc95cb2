"""The open TCP `/v1/status` names no caller in free text either (session 22).

Session 21 left out the `by` keys; the serving state's reason still said "stopped by uid 1000 (alice) pid 4242"
to anyone who could reach the port (Prometheus, the fleet view). The caller there reads "an operator"; the control
socket's status keeps it for the node's operators.
The real exporter on a real TCP port, its status built by the contract's records.
"""

from __future__ import annotations

import aiohttp

from lynxtop.agent.metrics.exporter import MetricsExporter
from lynxtop.contract.status import ServingState, ServingStatus, Status, without_callers


def test_a_caller_in_free_text_reads_as_an_operator_and_other_text_is_kept():
    tree = {"serving": {"reason": "stopped by uid 1000 (alice) pid 4242 (was crash-loop)"},
            "events": ["restart of profile p requested by uid 0 (root) pid 7", "uid 12 is not a caller"]}
    assert without_callers(tree) == {"serving": {"reason": "stopped by an operator (was crash-loop)"},
                                     "events": ["restart of profile p requested by an operator",
                                                "uid 12 is not a caller"]}


async def test_the_exporters_status_names_no_caller_in_the_reason():
    reason = "stopped by uid 1000 (alice) pid 42"
    st = Status(serving=ServingStatus(state=ServingState.STOPPED, reason=reason))
    exp = MetricsExporter("127.0.0.1:0", lambda: st, log=lambda _: None)
    await exp.start()
    try:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{exp.bound_port}/v1/status") as r:
            body = await r.json()
    finally:
        await exp.stop()
    assert body["serving"]["reason"] == "stopped by an operator"
    assert st.to_json()["serving"]["reason"] == reason  # the socket's status keeps it
