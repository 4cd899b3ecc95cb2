"""The fleet view on a Ray head (`N`): every node Ray lists with its serving state, GPUs and TTFT p99, read from
each node's own agent; Enter opens a node's screens over its read-only TCP endpoint, labelled and without controls.

The head is the FAKE agent on a real unix socket (its status lists the Ray nodes, as a head's does); the other
node is a real `lynxtop agent` process whose `[agent] metrics_listen` serves the read-only endpoint.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.agent_proc import Agent, e2e_config
from support.ports import free_port, short_dir
from support.tui import make_app, screen_text, wait_for
from support.waits import holds_async
from test_snapshots import snap_screen, three_sizes  # noqa: F401 - the snapshot harness (its fixture by name)
from tui_fake_agent import T0, make_status

from lynxtop.contract.status import ServingState
from lynxtop.tui.cluster_source import ClusterSource
from lynxtop.tui.screens.cluster import ClusterScreen

LOST = "Unexpected termination: health check failed due to missing too many heartbeats"


def ray_node(ip: str, *, head: bool = False, alive: bool = True, name: str = "") -> dict[str, Any]:
    return {"node_id": f"{ip}-{head}".replace(".", "") * 3, "ip": ip, "name": name, "head": head, "alive": alive,
            "gpus": 8.0, "state_message": None if alive else LOST, "start_ms": T0 - 600_000,
            "end_ms": None if alive else T0 - 30_000}


def head_status(*nodes: dict[str, Any]) -> dict[str, Any]:
    st = make_status(profile="v4-tp8pp2-ray")
    st["cluster"] = {"role": "head", "ray_state": "running", "ray_since_ms": T0 - 600_000, "ray_pid": 5151,
                     "address": "10.0.0.1:6379", "nodes": list(nodes), "view_ms": T0, "gpus_needed": 16}
    return st


@pytest.fixture
async def worker(tmp_path):
    """A real agent (simulated GPUs, nothing served) with its read-only endpoint on 127.0.0.1:PORT."""
    port = free_port()
    with short_dir() as d:
        cfg = e2e_config(tmp_path, autostart=False, sock=d / "w.sock",
                         extra_agent=f'metrics_listen = "127.0.0.1:{port}"\n')
        proc = Agent(tmp_path, cfg, name="worker", sock=d / "w.sock")
        try:
            await proc.wait_notify("READY=1", timeout=60)
            yield proc, port
        finally:
            proc.stop()


async def _open_cluster(pilot) -> ClusterScreen:
    app = pilot.app
    await wait_for(pilot, lambda: app.state.connected)
    await pilot.press("N")
    await wait_for(pilot, lambda: isinstance(app.screen, ClusterScreen))
    screen = app.screen
    await wait_for(pilot, lambda: screen.fleet is not None and screen.fleet.rows, timeout_s=15)
    return screen


async def test_head_lists_every_node_and_opens_another_read_only_over_its_tcp_endpoint(agent, worker):
    proc, port = worker
    agent.status = head_status(ray_node("10.0.0.1", head=True, name="head-1"), ray_node("127.0.0.1", name="gpu-2"),
                               ray_node("10.0.0.9", alive=False, name="gpu-9"))
    app = make_app(agent.socket_path, node_port=port)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await _open_cluster(pilot)
        await wait_for(pilot, lambda: screen.fleet.rows[1].status is not None, timeout_s=15)
        screen.redraw()
        text = screen_text(app)
        head_line = next(ln for ln in text.splitlines() if "head-1" in ln)
        assert " head " in head_line and "READY" in head_line and "this node's socket" in head_line
        worker_line = next(ln for ln in text.splitlines() if "gpu-2" in ln)
        # the real agent's own answer: nothing served there, its 8 simulated GPUs
        assert "STOPPED" in worker_line and f"http://127.0.0.1:{port}" in worker_line and "N/A" in worker_line
        lost_line = next(ln for ln in text.splitlines() if "gpu-9" in ln)
        assert "LOST" in lost_line and "lost: Unexpected termination" in lost_line

        await pilot.press("down", "enter")  # open gpu-2
        await wait_for(pilot, lambda: app.viewing_node == "gpu-2" and app.state.status is not None, timeout_s=15)
        assert app.current_mode == "node"
        assert app.state.serving.state == ServingState.STOPPED and len(app.state.status.gpus) == 8
        assert app.state.status.agent.pid == proc.proc.pid  # the worker agent answered, not the head
        await pilot.resize_terminal(80, 24)  # the label leads the header: even 80 columns never cut it
        await wait_for(pilot, lambda: app.screen.size.width == 80)
        app.screen.redraw()
        await wait_for(pilot, lambda: len(screen_text(app).splitlines()[0]) <= 80
                       and screen_text(app).splitlines()[0].strip().startswith("viewing node gpu-2 (read-only)"))
        # read-only: the control keys are gone, and a key press sends nothing anywhere
        assert app.check_action("control", ("restart",)) is False
        assert "Restart" not in screen_text(app)
        await pilot.press("R", "X")
        # nothing is sent: the check is that no request comes for a while, so it holds for 0.3 s
        await holds_async(lambda: not agent.posts(), 0.3, "no request from a read-only view", sleep=pilot.pause)
        assert (await proc.status())["serving"]["state"] == "stopped"
        # its history is on that node: the History and Events views say so instead of showing the head's
        await pilot.press("4")
        await wait_for(pilot, lambda: "gpu-2's history database is on that node" in screen_text(app))
        assert "h200-node-07" not in screen_text(app)  # nothing of the head's own history

        # back to the head: its own state, controls again
        await pilot.press("N")
        await wait_for(pilot, lambda: isinstance(app.screen, ClusterScreen))
        await wait_for(pilot, lambda: app.screen.fleet is not None and app.screen.fleet.rows, timeout_s=15)
        app.screen.cursor = 0
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.viewing_node is None and app.state.status is not None, timeout_s=15)
        assert app.state.serving.state == ServingState.READY
        assert app.check_action("control", ("restart",)) is True and app.readonly_reason is None


async def test_a_node_that_cannot_be_read_says_why_in_its_own_row(agent):
    """No endpoint port known, an endpoint nobody answers on, a lost node: each row says why, the others stand."""
    nodes = (ray_node("10.0.0.1", head=True), ray_node("127.0.0.1", name="silent"), ray_node("10.0.0.9", alive=False))
    agent.status = head_status(*nodes)
    fleet = await ClusterSource(agent.socket_path, None).poll()
    assert [r.label for r in fleet.rows] == ["10.0.0.1", "silent", "10.0.0.9"]
    assert fleet.rows[0].status is not None and fleet.rows[0].status.serving.state == ServingState.READY
    assert "metrics_listen" in fleet.rows[1].error and "--node-port" in fleet.rows[1].error
    assert fleet.rows[2].error.startswith("lost: Unexpected termination")
    port = free_port()  # nobody listens there
    fleet = await ClusterSource(agent.socket_path, port).poll()
    assert fleet.rows[0].status is not None
    assert fleet.rows[1].status is None and f"http://127.0.0.1:{port}" in fleet.rows[1].error


async def test_a_single_node_has_no_cluster_view(agent):
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        assert app.check_action("view", ("cluster",)) is False
        await pilot.press("N")
        # nothing happens: the view must stay the node's for a while, not only at one instant
        await holds_async(lambda: app.current_mode == "node" and not isinstance(app.screen, ClusterScreen), 0.2,
                          "the node view stays", sleep=pilot.pause)
    fleet = await ClusterSource(agent.socket_path, 9464).poll()
    assert fleet.rows == () and "not a Ray head" in fleet.problem


async def _snap_cluster(pilot) -> None:
    await _open_cluster(pilot)
    screen = pilot.app.screen
    await wait_for(pilot, lambda: all(r.status is not None or r.error for r in screen.fleet.rows))
    screen.redraw()


@three_sizes
def test_cluster_view_snapshot(snap_screen, size):  # noqa: F811 - the harness's fixture, imported above
    """The harness's frozen data and clock; the head lists a node with no endpoint port known and a lost one."""
    status = head_status(ray_node("10.0.0.1", head=True, name="h200-node-07"), ray_node("10.0.0.2", name="gpu-2"),
                         ray_node("10.0.0.3", alive=False, name="gpu-3"))
    assert snap_screen(_snap_cluster, size, status=status)
