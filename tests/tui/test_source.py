"""The screens against a fake in-memory `NodeSource` (tui/source.py): no socket, no agent process.

The app's socket path points at nothing; every read and action must reach the source it was given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.status import T0, make_status
from support.tui import make_app, text_of, wait_for
from support.tui_keys import open_screen
from textual.widgets import DataTable

from lynxtop.contract.client import AgentRefused, AgentUnreachable
from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.contract.processes import GpuProcesses
from lynxtop.contract.records import ActionAnswer, ProfileList, RunInfo
from lynxtop.contract.status import Status
from lynxtop.tui.screens.confirm import ConfirmScreen
from lynxtop.tui.screens.node import NodeScreen
from lynxtop.tui.source import LiveSource, NodeSource
from lynxtop.tui.widgets.gpu_table import GpuTable
from lynxtop.tui.widgets.node_header import NodeHeader


class FakeSource:
    """A node held in memory: its status, its events, and every action it was asked for."""

    label = "fake node"

    def __init__(self, status: Status, events: list[Event] | None = None):
        self._status = status
        self._events = events or []
        self.actions: list[tuple[str, str | None]] = []

    async def status(self) -> Status:
        return self._status

    async def events(self, since_ms: int | None = None, limit: int = 500) -> list[Event]:
        return self._events[-limit:]

    async def runs(self, limit: int = 50) -> list[RunInfo]:
        return []

    async def profiles(self) -> ProfileList:
        return ProfileList()

    async def logs(self, run_id: int | None = None, lines: int = 2000, after: int | None = None,
                   inode: int | None = None) -> dict[str, Any]:
        return {"lines": [], "run_id": run_id}

    async def processes(self) -> GpuProcesses:
        raise AgentUnreachable("fake node: no processes")

    async def action(self, action: str, profile: str | None = None, **extra: Any) -> ActionAnswer:
        self.actions.append((action, profile))
        return ActionAnswer(accepted=True, action=action, message=f"{action} accepted by the fake")

    async def close(self) -> None:
        pass


def _event(i: int, message: str) -> Event:
    return Event(EventKind.SERVING_READY, Severity.INFO, message, ts_ms=T0 - 60_000 * i, id=i)


def _app(tmp_path: Path, source: FakeSource):
    # The socket path names nothing: a read that went to a client instead of the source would fail.
    return make_app(tmp_path / "no-agent.sock", tmp_path / "no.db", source=source)


def test_fake_source_is_a_node_source():
    assert isinstance(FakeSource(make_status()), NodeSource)


async def test_node_view_renders_the_sources_status(tmp_path):
    source = FakeSource(make_status(gpus=4))
    app = _app(tmp_path, source)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.status is not None and
                       app.screen.query_one(GpuTable).row_count == 4)
        assert isinstance(app.screen, NodeScreen)
        header = text_of(app.screen.query_one(NodeHeader))
        assert "h200-node-07" in header and "READY" in header and "dsv41-tp8" in header


async def test_events_view_lists_the_sources_events(tmp_path):
    source = FakeSource(make_status(),
                        [_event(1, "first from the fake"), _event(2, "second from the fake")])
    app = _app(tmp_path, source)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.status is not None)
        await pilot.press("5")
        table = app.screen.query_one("#events", DataTable)
        await wait_for(pilot, lambda: table.row_count == 2)
        cells = " ".join(text_of(c) for r in range(2) for c in table.get_row_at(r))
        assert "first from the fake" in cells and "second from the fake" in cells


async def test_stop_goes_to_the_sources_action(tmp_path):
    source = FakeSource(make_status())
    app = _app(tmp_path, source)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        await open_screen(pilot, app, "X", ConfirmScreen)
        await pilot.press("tab", "enter")  # Cancel is focused first
        await wait_for(pilot, lambda: source.actions != [])
        assert source.actions == [("stop", None)]


async def test_live_source_read_only_refuses_without_sending(tmp_path):
    """Another node's endpoint (the cluster view) refuses an action itself, naming why, with the agent's 403."""
    source = LiveSource(tmp_path / "nothing.sock", read_only="viewing node gpu-b")
    with pytest.raises(AgentRefused) as refused:
        await source.action("restart")
    assert refused.value.status == 403 and "viewing node gpu-b" in refused.value.message
