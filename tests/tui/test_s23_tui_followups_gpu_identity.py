"""s23 follow-up: the History view tells where the board behind a GPU index changed within the charted window.

History is keyed by NVML index (store/gpu_identity.py): a board replaced at index 1, or the indices shifted after a
board fell off the bus, makes index 1's line continue with another board's readings. The view reads
`StoreReader.gpu_identities()` once per chart load and says it: a line naming both boards' short UUIDs and the time,
and a mark at that time on the GPU charts. Real parts: a SQLite file written by the real StoreWriter (two agent
processes, the second finding another board at index 1), read by the real dashboard in Pilot."""

from __future__ import annotations

from pathlib import Path

from support.status import T0
from support.tui import make_app, screen_text, wait_for, words
from support.tui_keys import open_history
from textual.widgets import Static

from lynxtop.store.writer import StoreWriter
from lynxtop.tui.widgets.time_chart import TimeChart

UUID_A = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
UUID_B = "GPU-bbbbbbbb-0000-4000-8000-000000000000"
UUID_C = "GPU-cccccccc-0000-4000-8000-000000000000"
SWAP_MS = T0 - 20 * 60_000  # 13:40:00Z: the second agent found board C at index 1


def _board_swapped_db(path: Path) -> None:
    """Agent 1 from T0-55 min with boards A, B; agent 2 from SWAP_MS with A, C (B replaced while it was down).
    One running run; samples of GPUs 0 and 1 every 30 s over the last 50 minutes."""
    w = StoreWriter(path, clock=lambda: (T0 - 55 * 60_000) / 1000)
    w.start()
    w.upsert_gpus([{"uuid": UUID_A, "idx": 0, "name": "H200"}, {"uuid": UUID_B, "idx": 1, "name": "H200"}])
    run = w.create_run(profile="p1", argv=["vllm", "serve", "m"], model="m", host="n", started_ms=T0 - 50 * 60_000,
                       pid=11, log_path="")
    ts = T0 - 50 * 60_000
    while ts < SWAP_MS:
        w.submit_tick(ts, gpu_rows=[{"gpu": g, "sm_active_pct": 40.0 + g} for g in (0, 1)])
        ts += 30_000
    assert w.flush(30)
    w.close()
    w = StoreWriter(path, clock=lambda: SWAP_MS / 1000)
    w.start()
    w.upsert_gpus([{"uuid": UUID_A, "idx": 0, "name": "H200"}, {"uuid": UUID_C, "idx": 1, "name": "H200"}])
    while ts <= T0:
        w.submit_tick(ts, gpu_rows=[{"gpu": g, "sm_active_pct": 60.0 + g} for g in (0, 1)])
        ts += 30_000
    w.update_run(run, ready_ms=T0 - 49 * 60_000)
    assert w.flush(30)
    w.close()


async def test_a_board_changed_at_an_index_is_named_on_the_history_view(agent, tmp_path):
    db = tmp_path / "history.db"
    _board_swapped_db(db)
    app = make_app(agent.socket_path, db, utc=True, poll_interval_s=3600)
    async with app.run_test(size=(140, 40)) as pilot:
        screen = await open_history(pilot, app)
        said = "GPU 1 (GPU-bbbbbbbb… → GPU-cccccccc… at 13:40:00Z)"
        await wait_for(pilot, lambda: said in words(screen_text(app)))
        assert "GPU 0 (" not in screen_text(app)  # index 0 kept its board
        # a mark at the change's time on the GPU charts, none on the serving ones
        sm = screen.query_one("#hchart-sm", TimeChart)
        axis = str(sm.render()).splitlines()[-1]
        assert "┴" in axis, axis
        assert "┴" not in str(screen.query_one("#hchart-tok", TimeChart).render())
        # the window moved to before the change: nothing to tell
        await pilot.press("left_square_bracket")
        await wait_for(pilot, lambda: screen.queried is not None and screen.queried[1] < SWAP_MS
                       and screen.last_draw_ms is not None and said not in words(screen_text(app)))
        assert not screen.query_one("#history-boards", Static).display


async def test_the_board_change_reads_in_ascii(agent, tmp_path):
    db = tmp_path / "history.db"
    _board_swapped_db(db)
    app = make_app(agent.socket_path, db, utc=True, poll_interval_s=3600, ascii_only=True)
    async with app.run_test(size=(140, 40)) as pilot:
        await open_history(pilot, app)
        said = "GPU 1 (GPU-bbbbbbbb... -> GPU-cccccccc... at 13:40:00Z)"
        await wait_for(pilot, lambda: said in words(screen_text(app)))
        assert screen_text(app).isascii()


def test_a_shift_after_a_board_fell_off_names_both_indices(tmp_path):
    """Board A at index 0 gone at the next start: B answers at index 0, and index 1 has no board since."""
    from lynxtop.store.reader import StoreReader
    from lynxtop.tui.history_source import BoardChange, board_changes

    db = tmp_path / "history.db"
    for wall_ms, gpus in ((T0 - 55 * 60_000, [(UUID_A, 0), (UUID_B, 1)]), (SWAP_MS, [(UUID_B, 0)])):
        w = StoreWriter(db, clock=lambda wall_ms=wall_ms: wall_ms / 1000)
        w.start()
        w.upsert_gpus([{"uuid": u, "idx": i} for u, i in gpus])
        assert w.flush(30)
        w.close()
    r = StoreReader(db)
    try:
        segs = r.gpu_identities()
    finally:
        r.close()
    assert board_changes(segs, T0 - 3600_000, T0) == [BoardChange(0, UUID_A, UUID_B, SWAP_MS),
                                                      BoardChange(1, UUID_B, None, SWAP_MS)]
    assert board_changes(segs, T0 - 3600_000, SWAP_MS - 1) == []  # the window ends before it
    assert board_changes(segs, SWAP_MS, T0) == []  # starts at it: the window's first reading is the new board's
