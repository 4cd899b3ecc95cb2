"""A Ray worker's GPUs held by processes that are not Ray's (`cluster.gpus_taken`) shown where an operator looks:
the dashboard's node header of the worker (fitting 80 columns) and its row in the head's cluster view.

The agent has reported them since session 19 (agent/cluster/gpus.py), but nothing showed them: the head saw only
vLLM's ranks there crash, back off and crash. A process name is foreign text: shown as it came, never as markup.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp import web
from rich.text import Text
from support.ports import free_port
from support.status import T0, status_json
from support.tui import make_app, screen_text, text_of, wait_for
from test_cluster_view import head_status, ray_node

from lynxtop.contract.status import Status
from lynxtop.tui.live_state import LiveState
from lynxtop.tui.screens.cluster import ClusterScreen
from lynxtop.tui.widgets.node_header import NodeHeader, header_line

TAKER = {"pid": 4242, "name": "python", "gpus": [3], "used_mem_bytes": 20 * 2**30}
OTHER = {"pid": 5151, "name": "jupyter-lab", "gpus": [0, 1], "used_mem_bytes": 2**30}


def worker_json(*takers: dict[str, Any], agent: dict[str, Any] | None = None, **cluster: Any) -> dict[str, Any]:
    st = status_json(state="stopped", profile=None, run_id=None, pid=None, vllm_version=None,
                     state_since_ms=T0 - 86_000_000, agent=agent)
    st["cluster"] = {"role": "worker", "ray_state": "running", "ray_since_ms": T0 - 120_000, "ray_pid": 77,
                     "address": "10.0.0.1:6379", "gpus_taken": list(takers),
                     "gpus_taken_since_ms": T0 - 30_000 if takers else None, **cluster}
    return st


def style_at(text: Text, part: str) -> str:
    start = text.plain.index(part)
    return " ".join(str(s.style) for s in text.spans if s.start <= start < s.end)


def line_of(*takers: dict[str, Any], level: int = 0) -> Text:
    state = LiveState()
    state.apply_status(Status.from_json(worker_json(*takers)), T0)
    return header_line(state, T0, [], None, level)


def test_the_header_line_names_each_holder_in_a_warning_style():
    t = line_of(TAKER, OTHER)
    assert "⚠ GPUs held: pid 4242 (python) GPU 3, pid 5151 (jupyter-lab) GPUs 0,1" in t.plain, t.plain
    assert "yellow" in style_at(t, "⚠ GPUs held")
    assert "worker of 10.0.0.1:6379" in t.plain and "agent ✓" in t.plain
    assert "GPUs held" not in line_of().plain  # none: nothing said


def test_a_name_that_looks_like_markup_is_shown_as_it_came():
    t = line_of({**TAKER, "name": "[bold]x[/]"})
    assert "pid 4242 ([bold]x[/]) GPU 3" in t.plain, t.plain


async def test_the_worker_header_fits_80_columns_with_the_holders_and_its_health(agent):
    """Pilot at 80x24: the warning and `agent ✓` both on the header line, nothing cut (the head's address goes
    first, then the holders after the first are counted)."""
    agent.status = worker_json(TAKER, OTHER)
    app = make_app(agent.socket_path, clock=lambda: T0 / 1000)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.status is not None)
        header = app.screen.query_one(NodeHeader)
        await wait_for(pilot, lambda: "held" in text_of(header))
        first = screen_text(app).splitlines()[0]
        # SIMULATED (the fake's node) takes 12 columns: the shortest form, `⚠ held: pid 4242 (python) +1`
        assert "SIMULATED" in first and "⚠ held: pid 4242 (python) +1" in first, first
        assert "agent ✓" in first and "…" not in first, first
        assert "yellow" in style_at(header.content, "⚠ held")


@pytest.mark.parametrize("level, part", [(1, "worker of 10.0.0.1:6379  Ray ✓ 2m00s  ⚠ GPUs held: pid 4242 (python) "
                                              "GPU 3 +1  agent ✓"),
                                         (2, "h200-node-07 worker Ray ✓ 2m00s ⚠ GPUs held: pid 4242 (python) GPU 3 "
                                              "+1 agent ✓"),
                                         (3, "h200-node-07 worker Ray ✓ ⚠ held: pid 4242 (python) +1 agent ✓")])
def test_each_pressed_level_keeps_the_warning_and_the_health(level, part):
    assert part in line_of(TAKER, OTHER, level=level).plain


def test_a_real_worker_at_80_columns_keeps_the_gpu():
    """Not simulated (a real worker: no badge): level 2 fits, with the GPU and the count of the others."""
    state = LiveState()
    real = worker_json(TAKER, OTHER, agent={"host": "gpu-node-02", "simulated": False})
    state.apply_status(Status.from_json(real), T0)
    fits = next(t for level in range(4) for t in (header_line(state, T0, [], None, level),) if t.cell_len <= 80)
    assert "⚠ GPUs held: pid 4242 (python) GPU 3 +1" in fits.plain and "agent ✓" in fits.plain, fits.plain


async def _serve(body: str) -> tuple[web.AppRunner, int]:
    async def status(_req: web.Request) -> web.Response:
        return web.Response(text=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/v1/status", status)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


@pytest.mark.parametrize("width", [80, 140])
async def test_the_cluster_view_row_of_a_worker_says_its_gpus_are_held(agent, width):
    worker = worker_json({**TAKER, "name": "[red]py"})
    worker["agent"]["host"] = "gpu-2"
    runner, port = await _serve(json.dumps(worker))
    try:
        agent.status = head_status(ray_node("10.0.0.1", head=True, name="head-1"), ray_node("127.0.0.1", name="gpu-2"))
        app = make_app(agent.socket_path, node_port=port)
        async with app.run_test(size=(width, 24)) as pilot:
            await wait_for(pilot, lambda: app.state.connected)
            await pilot.press("N")
            await wait_for(pilot, lambda: isinstance(app.screen, ClusterScreen))
            screen = app.screen
            await wait_for(pilot, lambda: screen.fleet is not None and len(screen.fleet.rows) == 2
                           and screen.fleet.rows[1].status is not None, timeout_s=30)
            screen.redraw()
            line = next(ln for ln in screen_text(app).splitlines() if "gpu-2" in ln)
            assert "⚠ GPUs HELD" in line and "STOPPED" not in line, line
            assert "pid 4242" in line, line
            if width >= 140:
                assert "pid 4242 ([red]py) GPU 3" in line, line
            assert len(line) <= width
    finally:
        await runner.cleanup()
