"""The Prometheus endpoint on a Ray head and worker: Ray's state, the cluster's nodes and GPUs, `promtool check
metrics` on the page; and not one of these names on a single node."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
from agent_io_helpers import FakeController
from prometheus_client.parser import text_string_to_metric_families
from support.real import PROMETHEUS_HINT, unavailable

from lynxtop.agent.cluster.view import parse_nodes
from lynxtop.agent.metrics.exporter import MetricsExporter
from lynxtop.contract.status import ClusterNode, ClusterStatus, RayState, Role

PAGE = Path(__file__).resolve().parent / "pages" / "ray-2.60-nodes-one-dead.json"
NEW_NAMES = ("lynxtop_ray_", "lynxtop_cluster_")


@pytest.fixture
async def exporter():
    state = {"snapshot": FakeController().status()}
    exp = MetricsExporter("127.0.0.1:0", lambda: state["snapshot"], log=lambda _: None)
    await exp.start()
    session = aiohttp.ClientSession()

    async def page() -> str:
        async with session.get(f"http://127.0.0.1:{exp.bound_port}/metrics") as resp:
            assert resp.status == 200
            return await resp.text()

    yield page, state
    await session.close()
    await exp.stop()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def head(**over) -> ClusterStatus:
    """The head of Ray 2.60's captured page (its worker DEAD), plus a second worker alive at its own address."""
    nodes = (*parse_nodes(json.loads(PAGE.read_text())), ClusterNode("e" * 56, ip="192.0.2.3", gpus=8.0))
    base = dict(role=Role.HEAD, ray_state=RayState.RUNNING, ray_since_ms=1_796_288_178_000, ray_pid=5151,
                address="192.0.2.2:6379", nodes=nodes, view_ms=1_796_288_200_000, gpus_needed=24, ray_failures=1)
    return ClusterStatus(**(base | over))


async def test_single_node_page_has_no_ray_or_cluster_series(exporter):
    page, _ = exporter
    assert not [k for k in samples(await page()) if k[0].startswith(NEW_NAMES)]


async def test_head_exports_ray_and_the_cluster(exporter):
    page, state = exporter
    state["snapshot"] = replace(state["snapshot"], cluster=head())
    s = samples(await page())
    assert s[("lynxtop_ray_up", ())] == 1
    assert s[("lynxtop_ray_state", (("state", "running"),))] == 1
    assert s[("lynxtop_ray_state", (("state", "crash-loop"),))] == 0
    assert ("lynxtop_ray_state", (("state", "off"),)) not in s
    assert s[("lynxtop_ray_failures_in_window", ())] == 1
    assert s[("lynxtop_ray_info", (("address", "192.0.2.2:6379"), ("role", "head")))] == 1
    assert s[("lynxtop_cluster_nodes", (("state", "alive"),))] == 2
    assert s[("lynxtop_cluster_nodes", (("state", "dead"),))] == 1  # the captured worker, killed
    assert s[("lynxtop_cluster_gpus", ())] == 16 and s[("lynxtop_cluster_gpus_needed", ())] == 24
    assert s[("lynxtop_cluster_view_ok", ())] == 1
    assert s[("lynxtop_cluster_node_up", (("ip", "192.0.2.2"), ("kind", "worker")))] == 0
    assert s[("lynxtop_cluster_node_up", (("ip", "192.0.2.3"), ("kind", "worker")))] == 1
    # per node: GPUs present (a lost node none) against GPUs expected (what Ray listed for it)
    gpus = {k[1]: v for k, v in s.items() if k[0] == "lynxtop_cluster_node_gpus"}
    expected = {k[1]: v for k, v in s.items() if k[0] == "lynxtop_cluster_node_gpus_expected"}
    worker2, worker3 = (("ip", "192.0.2.2"), ("kind", "worker")), (("ip", "192.0.2.3"), ("kind", "worker"))
    assert gpus == {(("ip", "192.0.2.2"), ("kind", "head")): 8, worker2: 0, worker3: 8}
    assert expected == {(("ip", "192.0.2.2"), ("kind", "head")): 8, worker2: 8, worker3: 8}


async def test_an_unread_view_is_no_sample_and_a_worker_has_no_cluster(exporter):
    page, state = exporter
    state["snapshot"] = replace(state["snapshot"], cluster=head(
        ray_state=RayState.BACKOFF, nodes=(), view_error="this node's Ray is not running"))
    s = samples(await page())
    assert s[("lynxtop_ray_up", ())] == 0 and s[("lynxtop_cluster_view_ok", ())] == 0
    assert ("lynxtop_cluster_gpus", ()) not in s and ("lynxtop_cluster_nodes", (("state", "alive"),)) not in s
    assert s[("lynxtop_cluster_gpus_needed", ())] == 24
    state["snapshot"] = replace(state["snapshot"], cluster=ClusterStatus(
        role=Role.WORKER, ray_state=RayState.STOPPED, address="192.0.2.2:6379"))
    s = samples(await page())
    assert s[("lynxtop_ray_state", (("state", "stopped"),))] == 1
    assert s[("lynxtop_ray_info", (("address", "192.0.2.2:6379"), ("role", "worker")))] == 1
    assert not [k for k in s if k[0].startswith("lynxtop_cluster_")]


async def test_an_unreadable_view_exports_what_is_known_for_the_view_down_alert(exporter):
    """Ray's state API stops answering on a head whose Ray runs: no GPU count (unknown, never 0), but the view's
    failure, the GPUs the profile needs and when the view was last read, which LynxtopClusterViewDown (promtool's
    cases in contrib/prometheus/tests) alerts on."""
    page, state = exporter
    state["snapshot"] = replace(state["snapshot"], cluster=head(
        nodes=(), view_error="Ray's state API at 127.0.0.1:8265: connection refused"))
    s = samples(await page())
    assert s[("lynxtop_ray_state", (("state", "running"),))] == 1 and s[("lynxtop_cluster_view_ok", ())] == 0
    assert s[("lynxtop_cluster_gpus_needed", ())] == 24 and ("lynxtop_cluster_gpus", ()) not in s
    assert s[("lynxtop_cluster_view_time_seconds", ())] == 1_796_288_200  # the last good read (head()'s view_ms)
    state["snapshot"] = replace(state["snapshot"], cluster=head(  # never read: Ray was not up yet
        ray_state=RayState.STARTING, nodes=(), view_ms=None, view_error="this node's Ray is not running (starting)"))
    s = samples(await page())
    assert ("lynxtop_cluster_view_time_seconds", ()) not in s and s[("lynxtop_cluster_view_ok", ())] == 0


async def test_promtool_accepts_a_heads_page(exporter):
    promtool = shutil.which("promtool")
    if promtool is None:
        unavailable(f"promtool not installed ({PROMETHEUS_HINT})")
    page, state = exporter
    state["snapshot"] = replace(state["snapshot"], cluster=head())
    text = await page()
    assert "lynxtop_cluster_gpus_needed" in text
    p = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stdout + p.stderr
