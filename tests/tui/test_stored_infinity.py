"""An infinite reading stored in the history database (the store keeps a REAL inf as it came; docs/reliability.md:
the CSV writes an empty cell for it) is no reading on the dashboard: the live charts backfilled from it at start-up
and the History view's charts show a gap there, and the dashboard stays up."""

from __future__ import annotations

import math
import shutil
import tempfile
from pathlib import Path

import pytest
from support.tui import make_app, wait_for
from support.tui_keys import open_screen
from tui_fake_agent import T0, gpu_row, serving_metrics

from lynxtop.store.writer import StoreWriter
from lynxtop.tui.history_series import points
from lynxtop.tui.live_state import LiveState
from lynxtop.tui.screens.history import HistoryScreen

META = ("index", "name", "uuid", "pci_bus_id", "arch", "gpm_supported", "nvlink_count")


@pytest.fixture
def inf_db():
    """Ten minutes of ticks, every seventh with an infinite SM activity, TTFT p99 and token rate."""
    d = Path(tempfile.mkdtemp(prefix="lt-inf-", dir="/tmp"))
    path = d / "history.db"
    w = StoreWriter(path, clock=lambda: T0 / 1000)
    w.start()
    start = T0 - 10 * 60_000
    run = w.create_run(profile="p", argv=["vllm", "serve", "m"], model="m", host="h", started_ms=start, pid=1,
                       log_path="", simulated=True, flags={})
    w.update_run(run, ready_ms=start + 1000)
    for i, ts in enumerate(range(start, T0 + 1, 10_000)):
        bad = i % 7 == 3
        w.submit_tick(ts, gpu_rows=[{"gpu": g, **{k: v for k, v in gpu_row(
            g, sm_active_pct=math.inf if bad else 50.0).items() if k not in META}} for g in range(2)],
            serving_row=serving_metrics(run_id=run, ttft_p99_ms=math.inf if bad else 400.0,
                                        generation_tokens_per_s=math.inf if bad else 1000.0))
    w.close()
    yield path
    shutil.rmtree(d, ignore_errors=True)


async def test_backfill_with_an_infinite_stored_reading_keeps_the_dashboard_up(sock_dir, inf_db):
    app = make_app(sock_dir / "absent.sock", inf_db, backfill=True, utc=True)
    async with app.run_test(size=(200, 48)) as pilot:
        await wait_for(pilot, lambda: len(app.state.serving_history) > 5 or app._exception is not None,
                       timeout_s=10)
        assert None in [v for _, v in app.state.serving_series("ttft_p99_ms")]  # the inf ticks: no reading
        for key in ("1", "3", "2", "1"):
            await pilot.press(key)
            await pilot.pause(0.3)
            assert app._exception is None, repr(app._exception)


async def test_history_view_with_an_infinite_stored_reading_keeps_the_dashboard_up(sock_dir, inf_db):
    app = make_app(sock_dir / "absent.sock", inf_db, utc=True)
    async with app.run_test(size=(200, 48)) as pilot:
        screen = await open_screen(pilot, app, "4", HistoryScreen, connected=False)
        await wait_for(pilot, lambda: len(screen.runs) == 1 or app._exception is not None)
        await pilot.pause(1.0)
        assert app._exception is None, repr(app._exception)


def test_stored_rows_with_an_infinite_reading_read_as_no_reading():
    """The two ways stored rows reach a chart: the History view's points and the live charts' backfill."""
    rows = [{"ts_ms": 1, "gpu": 0, "x": math.inf}, {"ts_ms": 1, "gpu": 1, "x": 30.0},
            {"ts_ms": 2, "gpu": 0, "x": math.nan}]
    assert points(rows, "x") == [(1, 30.0), (2, None)]
    state = LiveState()
    state.backfill([{"ts_ms": 1, "ttft_p99_ms": math.inf}, {"ts_ms": 2, "ttft_p99_ms": 5.0}],
                   [{"ts_ms": 1, "gpu": 0, "sm_active_pct": math.inf}])
    assert state.serving_series("ttft_p99_ms") == [(1, None), (2, 5.0)]
    assert state.gpu_series(0, "sm_active_pct") == [(1, None)]
