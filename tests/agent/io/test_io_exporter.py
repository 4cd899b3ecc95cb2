"""The read-only Prometheus endpoint: names, units and absent readings, read back with prometheus_client's parser."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace

import aiohttp
import pytest
from agent_io_helpers import FakeController
from prometheus_client.parser import text_string_to_metric_families
from support.real import PROMETHEUS_HINT, unavailable

from lynxtop.agent.metrics.exporter import MetricsExporter, is_loopback, parse_listen
from lynxtop.contract.status import EngineLoad, HeldRun, ServingState


@pytest.fixture
async def exporter():
    fake = FakeController()
    state = {"snapshot": fake.status()}
    logs: list[str] = []
    exp = MetricsExporter("127.0.0.1:0", lambda: state["snapshot"], log=logs.append)
    await exp.start()
    session = aiohttp.ClientSession()

    async def get(path: str = "/metrics", method: str = "GET") -> tuple[int, str]:
        async with session.request(method, f"http://127.0.0.1:{exp.bound_port}{path}") as resp:
            return resp.status, await resp.text()

    yield get, state, logs
    await session.close()
    await exp.stop()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_metrics_names_units_and_labels(exporter):
    get, _, _ = exporter
    code, text = await get()
    assert code == 200
    s = samples(text)
    assert all(name.startswith("lynxtop_") for name, _ in s)
    g0 = (("gpu", "0"), ("uuid", "GPU-0000"))
    assert s[("lynxtop_gpu_utilization_ratio", g0)] == pytest.approx(0.97)
    assert s[("lynxtop_gpu_memory_used_bytes", g0)] == 130 * 2**30
    assert s[("lynxtop_gpu_power_watts", g0)] == 612
    assert s[("lynxtop_gpu_sm_clock_hertz", g0)] == 1980e6
    assert s[("lynxtop_gpu_energy_joules_total", g0)] == 123456
    assert ("lynxtop_gpu_sm_active_ratio", g0) not in s  # None on the GPU: no sample, never 0
    assert s[("lynxtop_host_cpu_utilization_ratio", ())] == pytest.approx(0.125)
    assert s[("lynxtop_serving_kv_cache_usage_ratio", ())] == pytest.approx(0.43)
    assert s[("lynxtop_serving_ttft_p99_seconds", ())] == pytest.approx(0.412)
    assert ("lynxtop_serving_itl_p50_seconds", ()) not in s
    assert s[("lynxtop_serving_state", (("state", "ready"),))] == 1
    assert s[("lynxtop_serving_state", (("state", "crash-loop"),))] == 0
    assert s[("lynxtop_serving_up", ())] == 1
    labels = {k for name, lab in s for k, _ in lab if name != "lynxtop_serving_info"}
    assert labels <= {"gpu", "uuid", "state", "condition", "reason"}


async def test_agent_and_sla_metrics_and_each_scrape_reads_the_snapshot(exporter):
    get, state, logs = exporter
    _, text = await get()
    s = samples(text)
    assert s[("lynxtop_agent_simulated", ())] == 1  # simulated nodes say so on every surface
    assert s[("lynxtop_agent_missed_ticks_total", ())] == 3
    assert s[("lynxtop_store_dropped_ticks_total", ())] == 2
    assert s[("lynxtop_sla_breach", ())] == 0
    assert s[("lynxtop_sla_ttft_p99_threshold_seconds", ())] == 2.0
    # the snapshot is read at each scrape: a change shows at the next one
    state["snapshot"] = replace(state["snapshot"], serving=replace(state["snapshot"].serving,
                                                                  state=ServingState.CRASH_LOOP))
    _, text = await get()
    s = samples(text)
    assert s[("lynxtop_serving_up", ())] == 0 and s[("lynxtop_serving_state", (("state", "crash-loop"),))] == 1
    assert s[("lynxtop_serving_held", ())] == 0
    # a server the previous agent left, held unsupervised while the state reads stopped (serving.held)
    state["snapshot"] = replace(state["snapshot"], serving=replace(
        state["snapshot"].serving, state=ServingState.STOPPED, held=HeldRun(run_id=12, profile="dsv41", pid=4242)))
    _, text = await get()
    s = samples(text)
    assert s[("lynxtop_serving_held", ())] == 1 and s[("lynxtop_serving_up", ())] == 0
    assert any("Prometheus metrics on http://127.0.0.1:" in line for line in logs)


async def test_per_engine_load_is_labelled_by_engine(exporter):
    """DP deployments: each engine's running, waiting and KV usage, so an alert can name the engine that lags."""
    get, state, _ = exporter
    _, text = await get()
    assert not any(name.startswith("lynxtop_serving_engine_") for name, _ in samples(text))  # none: no families
    engines = (EngineLoad("0", 12, 0, 37.5), EngineLoad("1", 14, 9, 96.4), EngineLoad("10", None, None, None),
               EngineLoad("2", 0, None, 12.0))
    state["snapshot"] = replace(state["snapshot"], engines=engines)
    _, text = await get()
    s = samples(text)
    e1 = (("engine", "1"),)
    assert s[("lynxtop_serving_engine_requests_running", e1)] == 14
    assert s[("lynxtop_serving_engine_requests_waiting", e1)] == 9
    assert s[("lynxtop_serving_engine_kv_cache_usage_ratio", e1)] == pytest.approx(0.964)
    assert s[("lynxtop_serving_engine_kv_cache_usage_ratio", (("engine", "0"),))] == pytest.approx(0.375)
    assert s[("lynxtop_serving_engine_requests_running", (("engine", "2"),))] == 0  # a real 0 stays a 0
    # a reading the page did not give is no sample, never 0
    assert ("lynxtop_serving_engine_requests_waiting", (("engine", "2"),)) not in s
    assert not [k for k in s if k[1] == (("engine", "10"),)]
    # the totals keep their names and have no engine label
    assert s[("lynxtop_serving_kv_cache_usage_ratio", ())] == pytest.approx(0.43)
    engine_names = {name for name, lab in s if ("engine", "1") in lab}
    assert engine_names == {"lynxtop_serving_engine_requests_running", "lynxtop_serving_engine_requests_waiting",
                            "lynxtop_serving_engine_kv_cache_usage_ratio"}
    assert {k for name, lab in s for k, _ in lab if name != "lynxtop_serving_info"} <= {"gpu", "uuid", "state",
                                                                                       "condition", "engine",
                                                                                           "reason"}
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["lynxtop_serving_engine_requests_waiting"].type == "gauge"


async def test_run_info_hang_and_xid_for_the_alert_rules(exporter):
    """contrib/prometheus: profile and run through one info series, a hang told apart from a failing /health,
    and an XID counter that starts at 0 on every GPU (so increase() sees the first one)."""
    get, state, _ = exporter
    _, text = await get()
    s = samples(text)
    info = [lab for name, lab in s if name == "lynxtop_serving_info"]
    assert info == [(("model", "deepseek-ai/DeepSeek-V4.1"), ("profile", "tp8"), ("run", "7"))]
    assert s[("lynxtop_serving_info", info[0])] == 1
    assert s[("lynxtop_serving_degraded", (("condition", "hang"),))] == 0
    assert s[("lynxtop_serving_degraded", (("condition", "health"),))] == 0
    assert s[("lynxtop_gpu_xid_errors_total", (("gpu", "0"), ("uuid", "GPU-0000")))] == 0
    assert len([k for k in s if k[0] == "lynxtop_gpu_xid_errors_total"]) == len(state["snapshot"].gpus)
    snap = state["snapshot"]
    gpus = (replace(snap.gpus[0], xid_errors=2), *snap.gpus[1:])
    state["snapshot"] = replace(snap, gpus=gpus, serving=replace(snap.serving, state=ServingState.DEGRADED,
                                                                 degraded=("hang",)))
    _, text = await get()
    s = samples(text)
    assert s[("lynxtop_gpu_xid_errors_total", (("gpu", "0"), ("uuid", "GPU-0000")))] == 2
    assert s[("lynxtop_serving_degraded", (("condition", "hang"),))] == 1
    assert s[("lynxtop_serving_degraded", (("condition", "health"),))] == 0
    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert families["lynxtop_gpu_xid_errors"] == "counter" and families["lynxtop_serving_info"] == "gauge"
    state["snapshot"] = replace(snap, serving=replace(snap.serving, state=ServingState.STOPPED, profile=None,
                                                      run_id=None))
    _, text = await get()
    assert "lynxtop_serving_info" not in text  # no run, no info series


async def test_only_metrics_and_the_status_are_served_and_a_broken_snapshot_is_survived(exporter):
    """Read-only: /metrics and the socket's GET /v1/status (the head's cluster view opens a node with it); no
    control route, nothing else (the reads of `[agent] tcp_reads`, off here, say how to turn them on)."""
    get, state, _ = exporter
    for action in ("stop", "start", "restart", "switch"):
        code, _ = await get(f"/v1/{action}", method="POST")
        assert code in (404, 405)
    code, _ = await get("/v1/profiles")
    assert code == 404
    for other in ("/v1/events", "/v1/logs", "/v1/runs", "/v1/processes", "/v1/history"):
        code, text = await get(other)
        assert code == 403 and json.loads(text)["error"] == "tcp_reads_off" and "tcp_reads = true" in text
    code, text = await get("/v1/status")
    assert code == 200 and json.loads(text) == state["snapshot"].to_json()
    state["snapshot"] = None  # the agent has no snapshot yet
    code, text = await get("/v1/status")
    assert code == 503 and json.loads(text)["error"] == "not_ready"
    code, text = await get()
    assert code == 200 and samples(text)[("lynxtop_agent_simulated", ())] == 0


async def test_promtool_accepts_the_page(exporter):
    promtool = shutil.which("promtool")
    if promtool is None:
        unavailable(f"promtool not installed ({PROMETHEUS_HINT})")
    get, state, _ = exporter
    state["snapshot"] = replace(state["snapshot"], engines=(EngineLoad("0", 3, 1, 20.0), EngineLoad("1", 4, 0, 25.0)))
    _, text = await get()
    assert "lynxtop_serving_engine_requests_running" in text
    p = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stdout + p.stderr


def test_listen_parsing_and_loopback():
    assert parse_listen("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_listen("[::1]:9464") == ("::1", 9464)
    for bad in ("9464", ":9464", "host:port", "127.0.0.1:70000"):
        with pytest.raises(ValueError, match="metrics_listen"):
            parse_listen(bad)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("node1")


async def test_non_loopback_listen_is_warned_about():
    logs: list[str] = []
    exp = MetricsExporter("0.0.0.0:0", lambda: None, log=logs.append)
    await exp.start()
    try:
        assert any(line.startswith("warning:") and "reachable from the network" in line for line in logs)
    finally:
        await exp.stop()


async def test_port_in_use_is_a_clear_error(exporter):
    get, _, _ = exporter
    first = MetricsExporter("127.0.0.1:0", lambda: None, log=lambda m: None)
    await first.start()
    try:
        second = MetricsExporter(f"127.0.0.1:{first.bound_port}", lambda: None, log=lambda m: None)
        with pytest.raises(RuntimeError, match=f"cannot listen on 127.0.0.1:{first.bound_port} for metrics"):
            await second.start()
    finally:
        await first.stop()


async def test_throttle_reasons_one_series_per_reason_per_gpu(exporter):
    """dcgm-exporter's DCGM_FI_DEV_CLOCK_THROTTLE_REASONS as a `reason` label: 1 for each bit NVML set, an unknown
    bit as "other", and no series for a GPU whose reasons were not read (never "nothing throttles")."""
    get, state, _ = exporter
    snap = state["snapshot"]
    g0 = replace(snap.gpus[0], metrics={**snap.gpus[0].metrics, "throttle_reasons": 0x4 | 0x40 | 0x1000})
    g1 = replace(snap.gpus[1], metrics={**snap.gpus[1].metrics, "throttle_reasons": None})
    state["snapshot"] = replace(snap, gpus=(g0, g1, *snap.gpus[2:]))
    _, text = await get()
    s = samples(text)
    reasons = {dict(lab)["reason"]: v for (name, lab), v in s.items()
               if name == "lynxtop_gpu_clock_throttle_reasons" and dict(lab)["gpu"] == "0"}
    assert {r for r, v in reasons.items() if v == 1} == {"sw_power_cap", "hw_thermal", "other"}
    assert reasons["idle"] == 0 and reasons["hw_slowdown"] == 0 and len(reasons) == 10
    assert not [k for k in s if k[0] == "lynxtop_gpu_clock_throttle_reasons" and dict(k[1])["gpu"] == "1"]
    assert s[("lynxtop_gpu_clock_throttle_reasons", (("gpu", "2"), ("reason", "idle"), ("uuid", "GPU-0002")))] == 0
