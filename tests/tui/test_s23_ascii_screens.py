"""ASCII mode draws only ASCII: every cell of every main screen, as the compositor sends it to the terminal.

A C-locale terminal (LC_ALL=C, a serial console, PuTTY in Latin-1) shows a UTF-8 box-drawing character as two or
three garbage cells and shifts the rest of the line: the borders Textual draws (a dialog's, an input's, the log's
rule), the charts' axes, the scrollbars and the bars all had to go, not only lynxtop's own marks
(test_s22_terminals.py). Each screen is opened as its snapshot test opens it (the same frozen data), with the app in
ASCII mode, and the whole screen (modal layers and scrollbars included) is read back cell by cell."""

from __future__ import annotations

from typing import Any

import pytest
from support.tui import make_app, screen_text, wait_for
from test_cluster_view import _snap_cluster, head_status, ray_node
from test_logs_processes_snapshots import LOG, _logs, _processes
from test_snapshots import SCREENS, settle
from test_steer_snapshots import _event_detail, _gpus_sorted, _history_zoomed, _palette
from textual.widgets import Input

from lynxtop.tui.widgets.gpu_table import GpuTable

OPENERS: dict[str, Any] = {**SCREENS, "logs": _logs, "processes": _processes, "cluster": _snap_cluster,
                           "event_detail": _event_detail, "palette": _palette, "history_zoomed": _history_zoomed,
                           "gpus_sorted": _gpus_sorted}


def _non_ascii(text: str) -> list[tuple[int, str]]:
    """(line number, line) of each line of `text` with a character outside ASCII."""
    return [(n, line) for n, line in enumerate(text.splitlines()) if not line.isascii()]


async def _shown_in_ascii(agent: Any, db: Any, name: str, size: tuple[int, int]) -> str:
    agent.log_lines = list(LOG)
    if name == "cluster":
        agent.status = head_status(ray_node("10.0.0.1", head=True, name="h200-node-07"),
                                   ray_node("10.0.0.2", name="gpu-2"), ray_node("10.0.0.3", alive=False, name="gpu-3"))
    app = make_app(agent.socket_path, db, utc=True, poll_interval_s=3600, backfill=True, ascii_only=True)
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        opener = OPENERS[name]
        if opener is not None:
            await opener(pilot)
            await settle(pilot)
        for field in app.screen.query(Input):
            field.cursor_blink = False
        await pilot.pause()
        return screen_text(app)


@pytest.mark.parametrize("name", list(OPENERS))
async def test_every_screen_is_ascii_in_ascii_mode(agent, history_db, monkeypatch, name):
    db, _ = history_db
    monkeypatch.chdir(db.parent)
    shown = await _shown_in_ascii(agent, type(db)(db.name), name, (120, 40))
    print(f"--- {name}\n{shown}")  # shown with -s: what a C-locale terminal gets
    assert shown.strip(), "nothing drawn"
    assert not _non_ascii(shown), "\n".join(f"{n:2}: {line}" for n, line in _non_ascii(shown))


@pytest.mark.parametrize("name", ["node", "history", "events", "gpu", "latency"])
async def test_tall_and_small_terminals_are_ascii_too(agent, history_db, monkeypatch, name):
    """200x60 adds the Node view's per-GPU trends and recent events; 80x24 the compact charts and run list."""
    db, _ = history_db
    monkeypatch.chdir(db.parent)
    for size in ((200, 60), (80, 24)):
        shown = await _shown_in_ascii(agent, type(db)(db.name), name, size)
        assert not _non_ascii(shown), f"{size}\n" + "\n".join(f"{n:2}: {line}" for n, line in _non_ascii(shown))


async def test_outage_and_too_small_are_ascii(agent):
    app = make_app(agent.socket_path, ascii_only=True)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:  # toasts drawn, as on a terminal
        await wait_for(pilot, lambda: app.screen.query_one(GpuTable).row_count == 8)
        agent.stop()
        await wait_for(pilot, lambda: "unreachable" in screen_text(app))
        assert not _non_ascii(screen_text(app)), screen_text(app)
        app.notify("restart refused — agent busy ⚠", title="Restart ✗", severity="error")  # a toast's border
        await wait_for(pilot, lambda: "Restart" in screen_text(app) and "busy" in screen_text(app))
        assert not _non_ascii(screen_text(app)), screen_text(app)
        await pilot.resize_terminal(60, 20)
        await wait_for(pilot, lambda: "needs at least" in screen_text(app))
        assert not _non_ascii(screen_text(app)), screen_text(app)


async def test_utf8_mode_keeps_its_borders_and_axes(agent, history_db, monkeypatch):
    """The ASCII rules apply to ASCII mode only: a UTF-8 terminal keeps the box-drawing borders and axes."""
    db, _ = history_db
    monkeypatch.chdir(db.parent)
    app = make_app(agent.socket_path, type(db)(db.name), utc=True, poll_interval_s=3600, backfill=True,
                   ascii_only=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await SCREENS["gpu"](pilot)
        await settle(pilot)
        assert "└" in screen_text(app) and "│" in screen_text(app)
        await SCREENS["help"](pilot)
        await settle(pilot)
        assert any(c in screen_text(app) for c in "┃━▀▄█"), screen_text(app)
