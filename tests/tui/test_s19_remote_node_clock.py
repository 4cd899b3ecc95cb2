"""Another node's times measured on that node's own clock, and garbage from a node never read as a healthy one.

The head's dashboard opening a worker (the cluster view) once judged the worker's timestamps by the head's wall
clock: a worker a minute behind showed a permanent "samples 1m00s old", one a minute ahead hid a real stall, and
every duration ("READY 2m", "retry in") was off by the skew. The agent now says what its clock read when it
answered (`now_ms`); the dashboard counts from there with its own time since the answer came. An agent without the
field (older) is judged as before, by the dashboard's clock; a foreign `now_ms` that is no plausible time is absent.

A node's endpoint answering JSON of another shape is an error row, and a state word this lynxtop does not know is
shown as it came (escaped), never as STOPPED.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from aiohttp import web
from support.agent_proc import Agent, e2e_config
from support.ports import free_port, short_dir
from support.status import T0, make_status, status_json
from support.tui import make_app, screen_text, text_of, wait_for
from test_cluster_view import head_status, ray_node

from lynxtop.contract.status import ClusterNode, ServingState, Status
from lynxtop.tui.cluster_source import ClusterSource
from lynxtop.tui.live_state import LiveState
from lynxtop.tui.screens.cluster import ClusterScreen
from lynxtop.tui.widgets.node_header import header_line

SKEW_MS = 60_000
WORKER = ClusterNode(node_id="w1", ip="127.0.0.1", name="", head=False, alive=True, gpus=8.0)


def answered(node_now: int, ts_ms: int | None = None, **over) -> Status:
    """A status answered at `node_now` on the node's clock, its data taken at `ts_ms` (default: then)."""
    d = status_json(ts_ms=node_now if ts_ms is None else ts_ms, **over)
    d["now_ms"] = node_now
    return Status.from_json(d)


def header(state: LiveState, local_ms: int) -> str:
    return header_line(state, local_ms, []).plain


# ---------------------------------------------------------------------------------------------- clock skew
@pytest.mark.parametrize("skew_ms", [-SKEW_MS, SKEW_MS, -3_600_000])
def test_a_healthy_node_is_judged_on_its_own_clock_whatever_its_skew(skew_ms):
    """Fresh samples are not old, and "READY 1h02m" is the node's own count, whatever the head's clock says."""
    state = LiveState()
    local = T0
    state.apply_status(answered(local + skew_ms), local)
    text = header(state, local + 500)
    assert "old" not in text, text
    assert "READY 1h02m" in text, text  # state_since is 3723 s before the node's own now


def test_a_node_ahead_of_the_head_still_shows_its_real_stall():
    """A node 60 s ahead whose newest data is 60 s old on its own clock: the stall shows (it cancelled out before)."""
    state = LiveState()
    local = T0
    node_now = local + SKEW_MS
    state.apply_status(answered(node_now, ts_ms=node_now - 60_000), local)
    assert "samples 1m00s old" in header(state, local)


def test_time_since_the_answer_counts_on_the_local_clock():
    """Between two answers the node's clock is the one it answered with plus the time since, here 20 s."""
    state = LiveState()
    local = T0
    state.apply_status(answered(local - SKEW_MS, state="backoff", next_retry_ms=local - SKEW_MS + 30_000), local)
    text = header(state, local + 20_000)
    assert "retry in 10s" in text, text
    assert "BACKOFF 1h02m" in text, text  # 3723 s + 20 s


def test_same_numbers_as_before_when_clocks_agree():
    state_new, state_old = LiveState(), LiveState()
    local = T0
    state_new.apply_status(answered(local, state="backoff", next_retry_ms=local + 30_000), local)
    old = status_json(ts_ms=local, state="backoff", next_retry_ms=local + 30_000)
    state_old.apply_status(Status.from_json(old), local)
    for later in (0, 1500, 45_000):
        assert header(state_new, local + later) == header(state_old, local + later)


def test_an_older_agent_without_the_field_is_judged_by_the_local_clock_as_before():
    state = LiveState()
    state.apply_status(make_status(ts_ms=T0 - SKEW_MS), T0)  # the fake's status: no `now_ms`, as an older agent
    assert state.status.now_ms is None
    assert "samples 1m00s old" in header(state, T0)


@pytest.mark.parametrize("now", [float("nan"), float("inf"), 2**64, -5, "x", True, [1], {"a": 1}, 2**53])
def test_a_now_that_is_no_time_is_absent(now):
    """Foreign: NaN, 2^64, a string, true... never crash nor count from it; read as an agent without the field."""
    d = status_json(ts_ms=T0 - SKEW_MS)
    d["now_ms"] = now
    st = Status.from_json(d)
    assert st.now_ms is None and st.ts_ms == T0 - SKEW_MS
    state = LiveState()
    state.apply_status(st, T0)
    assert "samples 1m00s old" in header(state, T0)  # today's rule, by the local clock


def test_the_agent_sends_its_clock_at_answer():
    st = answered(T0)
    assert st.to_json()["now_ms"] == T0 and Status.from_json(st.to_json()).now_ms == T0


async def test_the_dashboard_opening_a_skewed_node_shows_no_false_staleness(agent):
    """Pilot: the node a minute behind answers (through the socket, escaped and typed as any answer); the header
    reads as a healthy node, its durations on its own clock."""
    st = status_json(ts_ms=T0 - SKEW_MS, state="backoff", next_retry_ms=T0 - SKEW_MS + 30_000)
    st["now_ms"] = T0 - SKEW_MS
    agent.status = st
    app = make_app(agent.socket_path, clock=lambda: T0 / 1000)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.status is not None and app.state.status.now_ms is not None)
        app.screen.redraw()
        text = text_of(app.screen.query_one("NodeHeader"))
        assert "old" not in text and "retry in 30s" in text and "BACKOFF 1h02m" in text, text


# ---------------------------------------------------------------------------------------------- garbage
async def _serve(body: str):
    async def status(_req):
        return web.Response(text=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/v1/status", status)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


@pytest.mark.parametrize("body", ['[1, 2]', '{"ts_ms": "x", "agent": 5}', '{"serving": {"state": "nope"}}', '"x"',
                                  '{}', '{"serving": {"state": "ready"}, "agent": {}}', 'null'])
async def test_a_node_answering_garbage_is_an_error_row(body):
    runner, port = await _serve(body)
    try:
        row = await ClusterSource("/nonexistent.sock", port)._row(WORKER, None)  # type: ignore[arg-type]
        assert row.status is None and row.error, row
    finally:
        await runner.cleanup()


async def test_an_answer_with_no_time_and_no_host_says_what_it_is():
    runner, port = await _serve('{"serving": {"state": "ready"}}')
    try:
        row = await ClusterSource("/nonexistent.sock", port)._row(WORKER, None)  # type: ignore[arg-type]
        assert row.status is None and "answer not a lynxtop status" in row.error, row
    finally:
        await runner.cleanup()


def test_an_unknown_state_is_kept_as_it_came_never_stopped():
    st = Status.from_json(status_json(state="hibernating"))
    assert st.serving.unknown_state == "hibernating"
    assert st.to_json()["serving"]["state"] == "hibernating" and "unknown_state" not in st.to_json()["serving"]
    state = LiveState()
    state.apply_status(st, T0)
    text = header(state, T0)
    assert "STOPPED" not in text and "UNKNOWN (hibernating)" in text, text
    # a known state carries no such word, and its JSON is as before
    known = Status.from_json(status_json(state="stopped"))
    assert known.serving.unknown_state is None and "unknown_state" not in known.to_json()["serving"]


async def test_a_node_with_an_unknown_state_is_shown_so_in_its_row_escaped(agent):
    """Pilot: the cluster view's row of a node answering a state word this lynxtop does not know (with a control
    character in it) says `?` and the word escaped, never STOPPED."""
    worker = status_json(ts_ms=T0, state="nope\x1b[2J")
    worker["agent"]["host"] = "gpu-2"
    runner, port = await _serve(json.dumps(worker))
    try:
        agent.status = head_status(ray_node("10.0.0.1", head=True, name="head-1"),
                                   ray_node("127.0.0.1", name="gpu-2"))
        app = make_app(agent.socket_path, node_port=port)
        async with app.run_test(size=(140, 40)) as pilot:
            await wait_for(pilot, lambda: app.state.connected)
            await pilot.press("N")
            await wait_for(pilot, lambda: isinstance(app.screen, ClusterScreen))
            screen = app.screen
            await wait_for(pilot, lambda: screen.fleet is not None and len(screen.fleet.rows) == 2
                           and screen.fleet.rows[1].status is not None, timeout_s=30)
            screen.redraw()
            line = next(ln for ln in screen_text(app).splitlines() if "gpu-2" in ln)
            assert "STOPPED" not in line and "\x1b" not in line, line
            assert "? nope\\x1b[2J" in line, line  # the word as it came, its control character escaped
    finally:
        await runner.cleanup()


async def test_a_real_agents_first_answers_are_a_status_with_its_clock(tmp_path):
    """A real agent (simulated GPUs, nothing served) read at its read-only endpoint from its first answer on:
    never an error row, and every answer carries its clock."""
    port = free_port()
    with short_dir() as d:
        cfg = e2e_config(tmp_path, autostart=False, sock=d / "w.sock",
                         extra_agent=f'metrics_listen = "127.0.0.1:{port}"\n')
        proc = Agent(tmp_path, cfg, name="worker", sock=d / "w.sock")
        try:
            src = ClusterSource("/nonexistent.sock", port)
            rows = []
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and len(rows) < 5:
                row = await src._row(WORKER, None)  # type: ignore[arg-type]
                if row.status is not None or "nothing answers" not in (row.error or ""):
                    rows.append(row)  # an answer came (refused connections before the listener is up don't count)
                await asyncio.sleep(0.05)
            assert len(rows) == 5, rows
            for row in rows:
                assert row.error is None and row.status is not None, row
                assert row.status.now_ms is not None and row.status.ts_ms is not None
                assert row.status.serving.state == ServingState.STOPPED and row.status.serving.unknown_state is None
                assert abs(row.status.now_ms - time.time() * 1000) < 60_000
        finally:
            proc.stop()
