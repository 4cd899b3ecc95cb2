"""SVG snapshots at 80×24 and 160×48 (pytest-textual-snapshot; textual pinned exactly in pyproject).

Data and clock are frozen: the fake agent serves one fixed status, the app's clock is fixed, times are UTC.
Update after an intended change with `pytest tests/tui/test_snapshots.py --snapshot-update` and review the SVGs.
"""

from __future__ import annotations

import pytest
from support.status import engine_loads
from support.tui import make_app, wait_for
from tui_fake_agent import make_status

from lynxtop.tui.screens.confirm import ConfirmScreen

SIZES = [(80, 24), (160, 48)]


def _app(agent, db=None):
    return make_app(agent.socket_path, db, utc=True, poll_interval_s=0.5)


async def _connected(pilot) -> None:
    await wait_for(pilot, lambda: pilot.app.state.connected)
    if pilot.app.screen.has_class("-tall"):  # the node view's recent events come in a worker of their own
        await wait_for(pilot, lambda: getattr(pilot.app.screen, "events", None) is not None)
    await pilot.pause(0.2)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_node_view(snap_compare, agent, size):
    assert snap_compare(_app(agent), terminal_size=size, run_before=_connected)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_restart_confirmation(snap_compare, agent, size):
    async def open_dialog(pilot) -> None:
        await _connected(pilot)
        await pilot.press("R")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, ConfirmScreen))
        await pilot.pause(0.2)

    assert snap_compare(_app(agent), terminal_size=size, run_before=open_dialog)


def test_node_view_per_engine_160x48(snap_compare, agent):
    """DP8 with engine 5 queueing and its KV cache near full: `e` shows each engine, engine 5 marked."""
    engines = engine_loads(waiting={5: 9}, kv={5: 96.4}, running={5: 14})
    agent.status = make_status(engines=engines, metrics={"requests_running": 98, "requests_waiting": 9,
                                                         "kv_cache_usage_pct": 96.4})

    async def per_engine(pilot) -> None:
        await _connected(pilot)
        await pilot.press("e")
        await pilot.pause(0.3)

    assert snap_compare(_app(agent), terminal_size=(160, 48), run_before=per_engine)


def test_latency_view_160x48(snap_compare, agent):
    async def latency(pilot) -> None:
        await _connected(pilot)
        await pilot.press("3")
        await pilot.pause(0.3)

    assert snap_compare(_app(agent), terminal_size=(160, 48), run_before=latency)


def test_history_view_160x48(snap_compare, agent, history_db):
    db, _ = history_db

    async def history(pilot) -> None:
        await _connected(pilot)
        await pilot.press("4")
        await wait_for(pilot, lambda: getattr(pilot.app.screen, "last_draw_ms", None) is not None)
        await pilot.pause(0.3)

    assert snap_compare(_app(agent, db), terminal_size=(160, 48), run_before=history)


def test_too_small_60x20(snap_compare, agent):
    assert snap_compare(_app(agent), terminal_size=(60, 20), run_before=_connected)
