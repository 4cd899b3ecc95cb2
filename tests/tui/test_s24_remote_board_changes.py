"""s24: another node's History view tells where the board behind a GPU index changed, as the local one does.

Session 23 made the History view read `StoreReader.gpu_identities()` and mark a board change at an index (a
replacement, a shift after a board fell off the bus): index 0's line then goes on with another board's readings.
Another node's history comes over its agent's TCP reads (`GET /v1/history?read=...`, agent/api/tcpreads.py), which
had no such read: the remote History view showed the charts and said nothing of the change.

Real parts: a SQLite file whose `gpus` table the store's writer filled at two times (board A at index 0, then the
simulated NVML's board 0 there), a real `lynxtop agent` serving it over TCP with the read token, the dashboard's
RemoteHistory and its real History view in Pilot. Board A's UUID carries markup and a screen clear: another node's
text reaches the screen as text, escaped. An older agent (one that refuses the read as unknown, with its usual
400) is stood for by a proxy in front of the real agent: the view draws its charts and marks no change.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from support.ports import free_port
from support.remote_history import board_changes_in, tcp_reads_agent
from support.tui import make_app, screen_text, wait_for, words
from textual.widgets import Static

from lynxtop.agent.api.routes import _error_response
from lynxtop.contract.client import AgentClient, AgentRefused
from lynxtop.contract.terminal import first_control, terminal_safe
from lynxtop.store.writer import StoreWriter
from lynxtop.tui.cluster_source import RemoteHistory
from lynxtop.tui.history_source import BoardChange, HistorySource
from lynxtop.tui.screens.history import HistoryScreen
from lynxtop.tui.widgets.time_chart import TimeChart

pytestmark = pytest.mark.timeout(240)

TOKEN = "remote-board-token-7c3e9a1f5b2d4068"
UUID_A = "GPU-[b]a\x1b[2J-0000-4000-8000-000000000000"  # markup and a screen clear: shown, never acted on
UUID_SIM0 = "GPU-51m00000-c0de-4a11-8b0b-000000000000"  # fake NVML "sim"'s board at index 0 (sim/gpus.py)
SHOWN = "GPU 0 (GPU-[b]a\\x1b[2J… → GPU-51m00000…"  # the view's words for the change (short UUIDs, escaped)
# what an agent from before s24 answers the read (agent/api/tcpreads.py: _params' unknown read)
OLD_REFUSAL = ("query parameter 'read' must be one of series, runs, run, events, bench_results, "
               "got 'gpu_identities'")


def _seed(db: Path, now_ms: int) -> int:
    """Board A at index 0 from now-55 min; the simulated board 0 there from now-20 min (A replaced while no agent
    ran); a run from now-50 min and GPU samples every 30 s. Returns the replacement's time."""
    swap_ms = now_ms - 20 * 60_000
    db.parent.mkdir(parents=True, exist_ok=True)
    w = StoreWriter(db, clock=lambda: (now_ms - 55 * 60_000) / 1000)
    w.start()
    w.upsert_gpus([{"uuid": UUID_A, "idx": 0, "name": "H200"}])
    w.create_run(profile="sim", argv=["vllm", "serve", "m"], model="m", host="n", started_ms=now_ms - 50 * 60_000,
                 pid=11, log_path="", simulated=True)
    ts = now_ms - 50 * 60_000
    while ts < swap_ms:
        w.submit_tick(ts, gpu_rows=[{"gpu": 0, "sm_active_pct": 40.0}])
        ts += 30_000
    assert w.flush(30)
    w.close()
    w = StoreWriter(db, clock=lambda: swap_ms / 1000)
    w.start()
    w.upsert_gpus([{"uuid": UUID_SIM0, "idx": 0, "name": "H200"}])
    while ts < now_ms - 60_000:
        w.submit_tick(ts, gpu_rows=[{"gpu": 0, "sm_active_pct": 60.0}])
        ts += 30_000
    assert w.flush(30)
    w.close()
    return swap_ms


def _token_file(path: Path) -> Path:
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
async def node(tmp_path) -> AsyncIterator[tuple[int, Path, int]]:
    """(the TCP port of a real agent serving the seeded history with tcp_reads on, its database, the swap's ms)."""
    db = tmp_path / "state" / "lynxtop.db"
    swap_ms = _seed(db, int(time.time() * 1000))
    async with tcp_reads_agent(tmp_path, db, TOKEN) as port:
        yield port, db, swap_ms


@pytest.fixture
async def older(node) -> AsyncIterator[tuple[int, int]]:
    """(the port of an agent from before s24, the swap's ms): the real agent behind a proxy that refuses
    read=gpu_identities as that agent did (400 unknown_read), everything else forwarded as it is."""
    port, _, swap_ms = node

    async def forward(request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/history" and request.query.get("read") == "gpu_identities":
            return _error_response(400, "unknown_read", OLD_REFUSAL)
        headers = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}{request.rel_url}",
                                                       headers=headers) as r:
            return web.Response(status=r.status, body=await r.read(), content_type=r.content_type)

    app = web.Application()
    app.router.add_get("/{tail:.*}", forward)
    runner = web.AppRunner(app)
    await runner.setup()
    proxy = free_port()
    await web.TCPSite(runner, "127.0.0.1", proxy).start()
    try:
        yield proxy, swap_ms
    finally:
        await runner.cleanup()


async def test_the_remote_read_tells_the_board_change_the_local_one_does(node):
    port, db, swap_ms = node
    start, end = swap_ms - 30 * 60_000, swap_ms + 10 * 60_000
    remote = RemoteHistory("gpu-2", f"http://127.0.0.1:{port}", TOKEN, timeout_s=30)
    local = await asyncio.to_thread(board_changes_in, HistorySource(db), start, end)
    assert local == [BoardChange(0, UUID_A, UUID_SIM0, swap_ms)]
    got = await asyncio.to_thread(board_changes_in, remote, start, end)
    # the same change; its UUIDs (another node's text) escaped on the way in
    assert got == [BoardChange(0, terminal_safe(UUID_A), UUID_SIM0, swap_ms)]
    assert all(first_control(c.old) is None for c in got)


async def test_the_read_is_bounded_and_checked_where_the_other_reads_are(node):
    port, _, swap_ms = node
    tcp = AgentClient(f"http://127.0.0.1:{port}", timeout_s=30, token=TOKEN)
    whole = await asyncio.to_thread(tcp.request, "GET", "/v1/history", {"read": "gpu_identities"})
    assert whole["truncated"] is False
    ours = [s for s in whole["segments"] if s["gpu"] == 0]
    assert [(s["uuid"], s["until_ms"]) for s in ours] == [(UUID_A, swap_ms), (UUID_SIM0, None)]
    one = await asyncio.to_thread(tcp.request, "GET", "/v1/history", {"read": "gpu_identities", "max_segments": 1})
    assert one["truncated"] is True and len(one["segments"]) == 1
    assert one["segments"][0]["since_ms"] == max(s["since_ms"] or 0 for s in whole["segments"])  # the newest kept
    for params, code in (({"max_segments": 4097}, "out_of_range"), ({"gpu": 0}, "unknown_parameter")):
        with pytest.raises(AgentRefused) as bad:
            await asyncio.to_thread(tcp.request, "GET", "/v1/history", {"read": "gpu_identities", **params})
        assert bad.value.status == 400 and bad.value.code == code, bad.value


def _remote_history_view(agent: Any, tmp_path: Path) -> tuple[Any, Any]:
    app = make_app(agent.socket_path, None, clock=time.time, utc=True,
                   node_token_file=_token_file(tmp_path / "dash.token"))
    return app, app.run_test(size=(160, 45))


async def _open_history(pilot: Any, app: Any, port: int) -> HistoryScreen:
    await wait_for(pilot, lambda: app.state.connected, timeout_s=30)
    app.view_node("gpu-2", f"http://127.0.0.1:{port}")
    await wait_for(pilot, lambda: isinstance(app.history, RemoteHistory) and app.state.connected, timeout_s=30)
    await pilot.press("4")
    await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), timeout_s=30)
    screen = app.screen
    await wait_for(pilot, lambda: screen.runs and screen.last_draw_ms is not None, timeout_s=60)
    return screen


async def test_the_remote_history_view_marks_the_change_as_text(agent, node, tmp_path):
    port, _, _ = node
    app, running = _remote_history_view(agent, tmp_path)
    async with running as pilot:
        screen = await _open_history(pilot, app, port)
        await wait_for(pilot, lambda: SHOWN in words(screen_text(app)), timeout_s=30)
        assert screen.error is None
        # markup in the UUID is shown, not parsed; nothing of it reaches the terminal raw
        assert all(first_control(line) is None for line in screen_text(app).splitlines())
        axis = str(screen.query_one("#hchart-sm", TimeChart).render()).splitlines()[-1]
        assert "┴" in axis, axis


async def test_an_older_agent_without_the_read_leaves_the_view_unmarked(agent, older, tmp_path):
    proxy, swap_ms = older
    remote = RemoteHistory("gpu-2", f"http://127.0.0.1:{proxy}", TOKEN, timeout_s=30)
    assert await asyncio.to_thread(board_changes_in, remote, swap_ms - 60_000, swap_ms + 60_000) == []

    def segments() -> list[dict[str, Any]]:
        with remote.reader() as reader:
            return reader.gpu_identities()

    assert await asyncio.to_thread(segments) == []  # the read itself: none, not a refusal raised
    app, running = _remote_history_view(agent, tmp_path)
    async with running as pilot:
        screen = await _open_history(pilot, app, proxy)
        chart = screen.query_one("#hchart-sm", TimeChart)
        await wait_for(pilot, lambda: any(v is not None for _, v in chart.points), timeout_s=30)
        assert screen.error is None and "history unavailable" not in screen_text(app)
        assert not screen.query_one("#history-boards", Static).display
        assert "board changed" not in screen_text(app)
        assert "┴" not in str(chart.render()).splitlines()[-1]
