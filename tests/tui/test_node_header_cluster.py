"""The node header and the serving line on a Ray head and a worker (a single node is the snapshot tests' case)."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from support.tui import make_app, screen_text, text_of, wait_for
from tui_fake_agent import T0, make_status

from lynxtop.tui.widgets.node_header import NodeHeader
from lynxtop.tui.widgets.startup_phases import StartupPhases

LOST = "Unexpected termination: health check failed due to missing too many heartbeats"
WAIT_REASON = ("waiting for Ray to report 16 GPUs (TP 8 x PP 2 x DP 1): it has 8 on 1 node(s) [10.0.0.1 (8 GPUs, "
               "head)]; 8 missing; lost: 10.0.0.2 (8 GPUs): " + LOST)


def node(name: str, *, head: bool = False, alive: bool = True, **over: Any) -> dict[str, Any]:
    return {"node_id": name.replace(".", "") * 4, "ip": name, "name": name, "head": head, "alive": alive, "gpus": 8.0,
            "state_message": None if alive else LOST, "start_ms": T0 - 600_000,
            "end_ms": None if alive else T0 - 30_000, **over}


def head(*nodes: dict[str, Any], **over: Any) -> dict[str, Any]:
    return {"role": "head", "ray_state": "running", "ray_since_ms": T0 - 600_000, "ray_pid": 5151,
            "address": "10.0.0.1:6379", "nodes": list(nodes), "view_ms": T0, "gpus_needed": 16, **over}


def style_of(text: Text, part: str) -> str:
    """The styles over where `part` starts (what colour an operator sees it in)."""
    start = text.plain.index(part)
    return " ".join(str(s.style) for s in text.spans if s.start <= start < s.end)


async def test_head_with_the_whole_cluster_is_green(agent):
    agent.status = make_status(profile="v4-tp8pp2-ray")
    agent.status["cluster"] = head(node("10.0.0.1", head=True), node("10.0.0.2"))
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.status is not None)
        header = app.screen.query_one(NodeHeader)
        text = text_of(header)
        assert "READY" in text and "head Ray ✓" in text and "2/2 nodes, 16/16 GPUs" in text
        assert "green" in style_of(header.content, "2/2 nodes")


async def test_head_waiting_with_a_lost_node_is_red_and_says_what_is_missing(agent):
    t = T0
    agent.status = make_status(state="waiting", simulated=False, profile="v4-tp8pp2-ray", reason=WAIT_REASON,
                               run_id=None, pid=None, state_since_ms=t - 90_000, vllm_version=None)
    agent.status["cluster"] = head(node("10.0.0.1", head=True), node("10.0.0.2", alive=False),
                                   node("10.0.0.3", alive=False, node_id="before-it-rejoined"), node("10.0.0.3"),
                                   gpus_needed=24)
    app = make_app(agent.socket_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.status is not None)
        header = app.screen.query_one(NodeHeader)
        text = text_of(header)
        # the lost worker counts; the old entry of a worker that rejoined does not
        assert "WAITING 1m32s" in text and "2/3 nodes, 16/24 GPUs" in text
        assert "red" in style_of(header.content, "2/3 nodes")
        assert "2/3 nodes, 16/24 GPUs" in screen_text(app).splitlines()[0]  # a real head's line fits 80 columns
        phases = app.screen.query_one(StartupPhases)
        await wait_for(pilot, lambda: phases.has_class("-visible"))
        assert "waiting for Ray to report 16 GPUs" in text_of(phases)


async def test_head_short_of_gpus_without_a_loss_is_yellow_and_ray_trouble_in_words(agent):
    agent.status = make_status(state="waiting", reason="waiting for Ray's view", run_id=None)
    agent.status["cluster"] = head(node("10.0.0.1", head=True))
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.status is not None)
        header = app.screen.query_one(NodeHeader)
        assert "yellow" in style_of(header.content, "1/1 nodes, 8/16 GPUs")
        agent.status["cluster"] = head(ray_state="backoff", ray_pid=None, nodes=[],
                                       view_error="this node's Ray is not running")
        await wait_for(pilot, lambda: "Ray BACKOFF" in text_of(header))
        assert "nodes ?" in text_of(header)


async def test_worker_shows_its_head_and_ray_instead_of_serving(agent):
    agent.status = make_status(state="stopped", profile=None, run_id=None, pid=None, vllm_version=None,
                               state_since_ms=T0 - 86_000_000)
    agent.status["cluster"] = {"role": "worker", "ray_state": "running", "ray_since_ms": T0 - 120_000,
                               "ray_pid": 77, "address": "10.0.0.1:6379"}
    app = make_app(agent.socket_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.status is not None)
        text = text_of(app.screen.query_one(NodeHeader))
        assert "worker of 10.0.0.1:6379  Ray ✓ 2m" in text
        assert "STOPPED" not in text and "no profile" not in text and "SLA" not in text
        agent.status["cluster"] = {**agent.status["cluster"], "ray_state": "crash-loop", "ray_pid": None}
        await wait_for(pilot, lambda: "Ray CRASH-LOOP" in text_of(app.screen.query_one(NodeHeader)))
