"""A foreign label value that UTF-8 cannot encode costs only itself, never the page (session 19, exporter audit).

Ray's state API may answer a lone surrogate (valid JSON: "\\ud800") in a node's IP, which the head's view copies
into the `ip` label. The real exporter on a real socket, Ray's answer read by the real parse_nodes, the page read
by prometheus_client's parser, in both formats the endpoint serves (text, OpenMetrics).
"""

from __future__ import annotations

import dataclasses
import json

import aiohttp
import pytest
from agent_io_helpers import FakeController
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families

from lynxtop.agent.cluster.view import parse_nodes
from lynxtop.agent.metrics.exporter import MetricsExporter
from lynxtop.contract.status import ClusterStatus, RayState, Role

pytestmark = pytest.mark.timeout(60)
NODE = {"node_id": "a" * 56, "node_ip": "192.0.2.2", "node_name": "192.0.2.2", "is_head_node": True,
        "state": "ALIVE", "resources_total": {"GPU": 8.0}, "start_time_ms": 1796288178717}
ODD_IP = "10.0.0.7" + "\\" + "ud800"  # JSON text of a lone surrogate after the address


def _status():  # noqa: ANN202
    worker = json.dumps({**NODE, "node_id": "b" * 56, "is_head_node": False, "node_ip": "PLACEHOLDER"})
    rows = f'[{json.dumps(NODE)}, {worker.replace("PLACEHOLDER", ODD_IP)}]'
    nodes = parse_nodes(json.loads('{"result": true, "data": {"result": {"result": ' + rows + "}}}"))
    assert any("\ud800" in (n.ip or "") for n in nodes), "the surrogate is not in the view: nothing is tested"
    st = FakeController().status()
    return dataclasses.replace(st, cluster=ClusterStatus(role=Role.HEAD, ray_state=RayState.RUNNING,
                                                         address="192.0.2.2:6379", nodes=tuple(nodes), view_ms=1,
                                                         gpus_needed=16))


async def _get(port: int, path: str, accept: str | None = None) -> tuple[int, str]:
    headers = {"Accept": accept} if accept else {}
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}{path}", headers=headers) as r:
        return r.status, await r.text()


async def test_a_lone_surrogate_in_a_label_value_is_escaped_and_the_page_is_served_whole():
    st = _status()
    exp = MetricsExporter("127.0.0.1:0", lambda: st, log=lambda _m: None)
    await exp.start()
    try:
        assert exp.bound_port is not None
        code, text = await _get(exp.bound_port, "/metrics")
        assert code == 200, f"GET /metrics answered {code}: one odd Ray node IP cost the node's every series"
        samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
        names = {s.name for s in samples}
        assert {"lynxtop_gpu_utilization_ratio", "lynxtop_agent_healthy", "lynxtop_cluster_node_up"} <= names
        ips = {s.labels["ip"] for s in samples if s.name == "lynxtop_cluster_node_up"}
        assert ips == {"192.0.2.2", "10.0.0.7\\ud800"}, ips  # the odd character as text; the good IP untouched

        code, om = await _get(exp.bound_port, "/metrics", "application/openmetrics-text; version=1.0.0")
        assert code == 200, f"OpenMetrics GET answered {code}"
        om_ips = {s.labels["ip"] for f in om_families(om) for s in f.samples if s.name == "lynxtop_cluster_node_up"}
        assert om_ips == ips

        code, again = await _get(exp.bound_port, "/metrics")  # the cached page: the same bytes
        assert code == 200 and again == text
    finally:
        await exp.stop()


def test_the_text_page_escapes_the_value_itself_and_keeps_the_others_as_generate_latest_writes_them():
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.exposition import generate_latest

    from lynxtop.agent.metrics.textpage import TextPage

    class Reg:
        def __init__(self, *fams: GaugeMetricFamily):
            self.fams = fams

        def collect(self) -> list[GaugeMetricFamily]:
            return list(self.fams)

    good = GaugeMetricFamily("x_up", "h", labels=["ip"])
    good.add_metric(["10.0.0.1"], 1.0)
    good.add_metric(["näme \"q\""], 0.0)
    odd = GaugeMetricFamily("x_up", "h", labels=["ip"])
    odd.add_metric(["10.0.0.1"], 1.0)
    odd.add_metric(["näme \"q\""], 0.0)
    odd.add_metric(["10.0.0.7\ud800"], 1.0)
    page = TextPage()
    assert page(Reg(good)) == generate_latest(Reg(good))  # byte for byte where every value encodes
    text = page(Reg(odd)).decode()
    assert 'x_up{ip="10.0.0.7\\\\ud800"} 1.0\n' in text
    assert text.startswith(generate_latest(Reg(good)).decode())
