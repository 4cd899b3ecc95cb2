"""The status JSON: what a real Node answers survives `Status.from_json(...).to_json()` unchanged.

The API writes `Node.status().to_json()` and every client reads `Status.from_json()`, so a key the typed form
drops or renames would silently vanish from `lynxtop status --json`, the dashboard and the exporter.
"""

from __future__ import annotations

import json

import pytest
from support.node import close_node, open_node, run_clock
from support.status import make_status, status_json

from lynxtop.contract.status import (
    ActionInfo,
    ClusterNode,
    ClusterStatus,
    NodeSet,
    ServingState,
    SlaState,
    Status,
)

pytestmark = pytest.mark.timeout(60)


def _config(tmp_path) -> str:
    path = tmp_path / "config.toml"
    path.write_text(f"""
[agent]
database = "{tmp_path / 'state' / 'lynxtop.db'}"
socket = "{tmp_path / 'run' / 'agent.sock'}"
sample_interval_s = 0.1
fake_nvml = "h200x8"

[[profile]]
name = "alpha"
executable = "/bin/true"
model = "deepseek-ai/DeepSeek-V4.1"
port = 18000
""")
    return str(path)


async def test_a_real_status_round_trips(tmp_path):
    node = open_node(_config(tmp_path))
    try:
        # a few ticks: GPU and host metrics are read (the host's CPU % needs two readings)
        await run_clock(node, 30, until=lambda: node.ticker.ticks >= 3
                        and node.status().host.metric("cpu_pct") is not None)
        st = node.status()
        wire = json.loads(json.dumps(st.to_json()))  # what `GET /v1/status` carries
        assert Status.from_json(wire).to_json() == wire
        assert Status.from_json(wire) == st
        assert len(wire["gpus"]) == 8 and wire["gpus"][0]["mem_total_bytes"]
        assert wire["host"]["cpu_pct"] is not None and wire["agent"]["nvml"]["state"] == "ok"
        assert st.serving.state is ServingState.STOPPED and st.sla.state is SlaState.UNKNOWN
    finally:
        close_node(node)  # the GPU sampler too: its NVML session closed before the next module


def test_the_test_factory_round_trips_and_reads_as_typed():
    wire = json.loads(json.dumps(make_status(state="backoff", agent={"action": {
        "action": "restart", "profile": "p", "since_ms": 1, "by": "uid 0"}}, sla={"state": "breach",
        "breached": ["ttft"], "worst_ttft_p99_ms": 9000.0, "worst_tpot_p99_ms": None}).to_json()))
    st = Status.from_json(wire)
    assert st.to_json() == wire
    assert st.serving.state is ServingState.BACKOFF and st.agent.action == ActionInfo("restart", "p", 1, "uid 0")
    assert st.sla.breached == ("ttft",) and wire["sla"]["worst_ttft_p99_ms"] == 9000.0
    assert Status.from_json(status_json()) == make_status()


def _node(node_id: str, ip: str, *, head: bool = False, alive: bool = True, gpus: float = 8,
          msg: str | None = None) -> ClusterNode:
    return ClusterNode(node_id=node_id, ip=ip, name=ip, head=head, alive=alive, gpus=gpus, state_message=msg)


def test_node_set_counts_alive_lost_and_what_a_profile_lacks():
    nodes = (_node("h", "10.0.0.1", head=True), _node("w-old", "10.0.0.3", alive=False, msg="restarted"),
             _node("w", "10.0.0.3"), _node("x", "10.0.0.2", alive=False, msg="health check failed"),
             _node("one", "", gpus=1))
    view = NodeSet(nodes)
    assert [n.node_id for n in view.alive] == ["h", "w", "one"] and view.gpus_alive == 17
    assert [n.node_id for n in view.lost] == ["x"]  # a rejoined worker's old entry is history, not lost
    assert view.gpus_missing(16) == 0 and view.shortfall(16) is None and view.shortfall(17) is None
    assert view.gpus_missing(24) == 7
    assert view.shortfall(24) == ("17 on 3 node(s) [10.0.0.1 (8 GPUs, head), 10.0.0.3 (8 GPUs), one (1 GPU)]; "
                                  "7 missing; lost: 10.0.0.2 (8 GPUs): health check failed")
    assert NodeSet().shortfall(1) == "0 on 0 node(s) []; 1 missing"
    st = ClusterStatus(nodes=nodes, gpus_needed=24)  # the status reads the same arithmetic
    assert (st.alive_nodes, st.lost_nodes, st.gpus_alive) == (view.alive, view.lost, view.gpus_alive)
    assert st.node_set == view and "node_set" not in Status(cluster=st).to_json()["cluster"]
