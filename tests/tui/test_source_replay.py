"""`ReplaySource` (tui/source.py): a history database written by the store's writer, read as a node, read-only."""

from __future__ import annotations

import pytest
from support.tui import make_app, text_of, wait_for
from textual.widgets import DataTable

from lynxtop.contract.client import AgentRefused
from lynxtop.tui.source import NodeSource, ReplaySource
from lynxtop.tui.widgets.gpu_table import GpuTable
from lynxtop.tui.widgets.node_header import NodeHeader


async def test_replay_status_is_the_newest_stored_samples(history_db):
    path, info = history_db
    source = ReplaySource(path)
    assert isinstance(source, NodeSource)
    status = await source.status()
    assert status.agent.host == "h200-node-07"
    assert status.serving.run_id == info["run2"] and status.serving.profile == "dsv41-tp8-ep"
    assert len(status.gpus) == 8
    assert [e.message for e in await source.events(limit=1000)][-1] == "TTFT p99 3.0 s above 2.0 s"


async def test_replay_refuses_actions_as_read_only(history_db):
    source = ReplaySource(history_db[0])
    with pytest.raises(AgentRefused) as refused:
        await source.action("restart")
    assert refused.value.status == 403 and "replay is read-only" in refused.value.message


async def test_node_view_renders_a_replay_labelled_as_such(history_db, tmp_path):
    path, _ = history_db
    app = make_app(tmp_path / "no-agent.sock", path, source=ReplaySource(path))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.status is not None and
                       app.screen.query_one(GpuTable).row_count == 8)
        header = text_of(app.screen.query_one(NodeHeader))
        assert "h200-node-07" in header and "dsv41-tp8-ep" in header
        assert f"READ-ONLY (replay of {path})" in header
        await pilot.press("5")
        table = app.screen.query_one("#events", DataTable)
        await wait_for(pilot, lambda: table.row_count == 4)


async def test_replay_of_a_missing_database_names_it(tmp_path):
    from lynxtop.contract.client import AgentUnreachable

    source = ReplaySource(tmp_path / "nothing.db")
    with pytest.raises(AgentUnreachable, match="nothing.db"):
        await source.status()
