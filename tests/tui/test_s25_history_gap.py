"""s25: the History view marks a GPU index's gap (its board gone, then back) as it marks a board change.

Session 24 recorded a board gone while no agent ran and its return as two segments of the same UUID with a gap
between (store/gpu_identity.py); the History view told only a change to another board (`board_changes`), so the
same board back after an absence drew nothing: index 1's line just stopped and went on. The gap is now told in
the same line as a change ("absent from X, back at Y") and both its ends are marked on the GPU charts, locally and
for another node (the agent's `read=gpu_identities` segments already carry each segment's end: no new field).

Real parts: a SQLite file written by the real StoreWriter (three agent processes: boards A, B; A alone; A, B), read
by the real dashboard in Pilot; the remote read from a real `lynxtop agent` serving that file over TCP.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support.remote_history import board_changes_in, tcp_reads_agent
from support.status import T0
from support.tui import make_app, screen_text, wait_for, words
from support.tui_keys import open_history
from textual.widgets import Static

from lynxtop.store.reader import StoreReader
from lynxtop.store.writer import StoreWriter
from lynxtop.tui.cluster_source import RemoteHistory
from lynxtop.tui.history_source import BoardChange, HistorySource, board_changes
from lynxtop.tui.widgets.time_chart import TimeChart

pytestmark = pytest.mark.timeout(240)

UUID_A = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
UUID_B = "GPU-bbbbbbbb-0000-4000-8000-000000000000"
UUID_C = "GPU-cccccccc-0000-4000-8000-000000000000"
TOKEN = "gap-board-token-3b8e1c5a9f2d4e70"


def _gap_db(path: Path, now_ms: int, back: str = UUID_B) -> tuple[int, int]:
    """Agent 1 from now-55 min with A, B (samples of both every 30 s until now-40 min); agent 2 from now-30 min
    with A alone (B gone; samples of GPU 0); agent 3 from now-20 min with A and `back` (samples of both). One run
    from now-50 min. Returns (B's last sample, the third agent's start)."""
    last_b, back_ms = now_ms - 40 * 60_000, now_ms - 20 * 60_000
    path.parent.mkdir(parents=True, exist_ok=True)
    ts = now_ms - 50 * 60_000
    run = None
    for start, boards, until in ((now_ms - 55 * 60_000, [UUID_A, UUID_B], last_b),
                                 (now_ms - 30 * 60_000, [UUID_A], back_ms - 30_000),
                                 (back_ms, [UUID_A, back], now_ms)):
        w = StoreWriter(path, clock=lambda start=start: start / 1000)
        w.start()
        w.upsert_gpus([{"uuid": u, "idx": i, "name": "H200"} for i, u in enumerate(boards)], enumerated=len(boards))
        if run is None:
            run = w.create_run(profile="sim", argv=["vllm", "serve", "m"], model="m", host="n",
                               started_ms=now_ms - 50 * 60_000, pid=11, log_path="", simulated=True)
            w.update_run(run, ready_ms=now_ms - 49 * 60_000)
        ts = max(ts, start)
        while ts <= until:
            w.submit_tick(ts, gpu_rows=[{"gpu": g, "sm_active_pct": 40.0 + g} for g in range(len(boards))])
            ts += 30_000
        assert w.flush(30)
        w.close()
    return last_b, back_ms


def _segments(db: Path) -> list[dict]:
    r = StoreReader(db)
    try:
        return r.gpu_identities()
    finally:
        r.close()


def test_the_same_board_back_after_a_gap_is_a_change_to_tell(tmp_path):
    db = tmp_path / "history.db"
    last_b, back_ms = _gap_db(db, T0)
    segs = _segments(db)
    assert board_changes(segs, T0 - 3600_000, T0) == [BoardChange(1, UUID_B, UUID_B, back_ms, last_b)]
    # the window holds the gap's start only: the board gone (nothing after it in the window)
    assert board_changes(segs, T0 - 3600_000, back_ms - 60_000) == [BoardChange(1, UUID_B, None, last_b)]
    # the window holds its return only: told with the gap's start, though that is before the window
    assert board_changes(segs, last_b + 60_000, T0) == [BoardChange(1, UUID_B, UUID_B, back_ms, last_b)]
    assert board_changes(segs, back_ms, T0) == []  # starts at the return: the window's readings are all B's


def test_another_board_after_a_gap_names_the_gap(tmp_path):
    db = tmp_path / "history.db"
    last_b, back_ms = _gap_db(db, T0, back=UUID_C)
    assert board_changes(_segments(db), T0 - 3600_000, T0) == [BoardChange(1, UUID_B, UUID_C, back_ms, last_b)]


async def test_the_history_view_tells_and_marks_the_gap(agent, tmp_path):
    db = tmp_path / "history.db"
    _gap_db(db, T0)  # B last read 13:20, back at 13:40 (T0 = 14:00Z)
    app = make_app(agent.socket_path, db, utc=True, poll_interval_s=3600)
    async with app.run_test(size=(140, 40)) as pilot:
        screen = await open_history(pilot, app)
        said = "board absent: GPU 1 (GPU-bbbbbbbb… absent from 13:20:00Z, back at 13:40:00Z)"
        await wait_for(pilot, lambda: said in words(screen_text(app)))
        assert "GPU 0 (" not in screen_text(app)
        # both ends of the gap marked on the GPU charts, where a change is marked; none on the serving ones
        axis = str(screen.query_one("#hchart-sm", TimeChart).render()).splitlines()[-1]
        assert axis.count("┴") == 2, axis
        assert "┴" not in str(screen.query_one("#hchart-tok", TimeChart).render())


async def test_another_board_after_a_gap_reads_as_a_change_with_its_gap_in_ascii(agent, tmp_path):
    db = tmp_path / "history.db"
    _gap_db(db, T0, back=UUID_C)
    app = make_app(agent.socket_path, db, utc=True, poll_interval_s=3600, ascii_only=True)
    async with app.run_test(size=(140, 40)) as pilot:
        screen = await open_history(pilot, app)
        said = "board changed: GPU 1 (GPU-bbbbbbbb... -> GPU-cccccccc... at 13:40:00Z, none there from 13:20:00Z)"
        await wait_for(pilot, lambda: said in words(screen_text(app)))
        assert screen_text(app).isascii()
        assert screen.query_one("#history-boards", Static).display


@pytest.fixture
async def node(tmp_path) -> AsyncIterator[tuple[int, Path, int, int]]:
    """(the TCP port of a real agent serving a gap history with tcp_reads on, its database, B's last sample, B's
    return)."""
    db = tmp_path / "state" / "lynxtop.db"
    last_b, back_ms = _gap_db(db, int(time.time() * 1000))
    async with tcp_reads_agent(tmp_path, db, TOKEN) as port:
        yield port, db, last_b, back_ms


async def test_the_remote_read_tells_the_gap_the_local_one_does(node):
    port, db, last_b, back_ms = node
    start, end = back_ms - 40 * 60_000, back_ms + 10 * 60_000
    local = await asyncio.to_thread(board_changes_in, HistorySource(db), start, end)
    # (the sim agent serving the file stored its own boards when it started: after the window's end)
    assert local == [BoardChange(1, UUID_B, UUID_B, back_ms, last_b)]
    remote = RemoteHistory("gpu-2", f"http://127.0.0.1:{port}", TOKEN, timeout_s=30)
    got = await asyncio.to_thread(board_changes_in, remote, start, end)
    assert got == local
