"""The status JSON: what a real Node answers survives `Status.from_json(...).to_json()` unchanged.

The API writes `Node.status().to_json()` and every client reads `Status.from_json()`, so a key the typed form
drops or renames would silently vanish from `lynxtop status --json`, the dashboard and the exporter.
"""

from __future__ import annotations

import json
import math

import pytest
from support.node import close_node, open_node, run_clock
from support.status import make_status, status_json

from lynxtop.contract.records import RecordError
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


def _wire(**over) -> dict:
    return json.loads(json.dumps(make_status(**over).to_json()))


def test_a_metric_that_is_not_a_finite_number_reads_as_not_read():
    """Every metric column holds a finite number or None: NaN and Infinity (Python's JSON reads both), true and a
    string are no reading a chart or a format can draw. A TEXT column keeps its string."""
    wire = _wire()
    odd = {"sm_active_pct": math.nan, "temp_c": math.inf, "power_w": -math.inf, "lost": True, "util_gpu_pct": "60",
           "mem_used_bytes": [1], "sm_clock_mhz": 1980, "energy_j": 1.5}
    wire["gpus"][0].update(odd)
    wire["host"].update(cpu_pct=math.inf, load1="3", cpu_per_core_pct="[1.0, 2.5]")
    wire["serving_metrics"].update(ttft_p99_ms=math.nan, requests_running=False, kv_cache_usage_pct=37.5)
    st = Status.from_json(wire)
    assert {k: st.gpus[0].metric(k) for k in odd} == {
        "sm_active_pct": None, "temp_c": None, "power_w": None, "lost": None, "util_gpu_pct": None,
        "mem_used_bytes": None, "sm_clock_mhz": 1980, "energy_j": 1.5}
    assert (st.host.metric("cpu_pct"), st.host.metric("load1"), st.host.metric("cpu_per_core_pct")) == (
        None, None, "[1.0, 2.5]")
    sm = st.serving_metrics
    assert (sm.metric("ttft_p99_ms"), sm.metric("requests_running"), sm.metric("kv_cache_usage_pct")) == (
        None, None, 37.5)


def test_a_number_field_that_is_not_finite_or_null_reads_as_not_known():
    """NaN or Infinity in a number field is "not known", as a null is: None where the field allows it, else the
    field's default."""
    wire = _wire()
    wire["ts_ms"] = math.nan
    wire["agent"].update(uptime_s=math.nan, missed_ticks=None, clock_offset_ms=math.inf)
    wire["serving"].update(state_since_ms=math.inf, reason=None)
    wire["sla"].update(ttft_threshold_ms=-math.inf)
    st = Status.from_json(wire)
    assert (st.ts_ms, st.agent.uptime_s, st.agent.missed_ticks, st.agent.clock_offset_ms) == (None, None, 0, 0)
    assert (st.serving.state_since_ms, st.serving.reason, st.sla.ttft_threshold_ms) == (None, "", None)
    wire["agent"]["started_ms"] = 1.0e12  # any number for a number field
    assert Status.from_json(wire).agent.started_ms == 1.0e12


@pytest.mark.parametrize(("section", "over", "named"), [
    ("agent", {"host": 7}, "AgentStatus.host: expected a string, got 7"),
    ("agent", {"uptime_s": "86400"}, "AgentStatus.uptime_s: expected a number or null, got '86400'"),
    ("agent", {"simulated": 1}, "AgentStatus.simulated: expected true or false, got 1"),
    ("agent", {"nvml": "ok"}, "NvmlStatus: must be a JSON object"),
    ("agent", {"connections": []}, "AgentStatus.connections: expected an object, got []"),
    ("serving", {"model": 7}, "ServingStatus.model: expected a string or null, got 7"),
    ("serving", {"phases": "loading"}, "ServingStatus.phases: expected a list, got str"),
    ("serving", {"phases": [{"phase": "load"}]}, "PhaseMark.ts_ms: missing"),
    ("serving", {"degraded": "hang"}, "ServingStatus.degraded: expected a list, got 'hang'"),
    ("sla", {"window_s": "60"}, "SlaStatus.window_s: expected a number or null, got '60'"),
    ("sla", {"breached": "ttft"}, "SlaStatus.breached: expected a list, got 'ttft'"),
    ("gpus", {"index": "0"}, "GpuStatus.index: expected a number or null, got '0'"),
    ("engines", {"engine": 5}, "EngineLoad.engine: expected a string, got 5"),
    ("cluster", {"nodes": {"a": {}}}, "ClusterStatus.nodes: expected a list, got dict"),
    ("", {"gpus": {"0": {}}}, "Status.gpus: expected a list, got dict"),
])
def test_a_field_of_another_json_type_is_refused_naming_it(section, over, named):
    """An agent answering a field with another JSON type is one this version cannot read: a RecordError naming the
    field and the value (the client's AgentUnreadable), never a value of the wrong type handed to a printer."""
    wire = _wire(engines=[{"engine": "0", "running": 1, "waiting": 0, "kv_cache_usage_pct": 1.0}])
    target = {"": wire, "gpus": wire["gpus"][0], "engines": wire["engines"][0]}.get(section) or wire[section]
    target.update(over)
    with pytest.raises(RecordError) as refused:
        Status.from_json(wire)
    assert named in str(refused.value)
