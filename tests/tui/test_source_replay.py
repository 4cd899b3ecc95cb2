"""`ReplaySource` (tui/source.py): a history database written by the store's writer, read as a node, read-only."""

from __future__ import annotations

import pytest
from support.tui import make_app, text_of, wait_for
from textual.widgets import DataTable
from tui_fake_agent import T0, gpu_row

from lynxtop.contract.client import AgentRefused
from lynxtop.store.writer import StoreWriter
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


async def test_replay_reads_the_stored_gpu_facts_with_their_status_types(tmp_path):
    """The gpus table keeps `gpm_supported` as 0/1; the replayed status holds it as the bool the status' type
    says (the status refuses a field of another type: contract/status.py), so a replay with GPU facts reads."""
    meta = ("index", "name", "uuid", "pci_bus_id", "arch", "gpm_supported", "nvlink_count")
    path = tmp_path / "history.db"
    w = StoreWriter(path, clock=lambda: T0 / 1000)
    w.start()
    w.upsert_gpus([{"uuid": f"GPU-{g}", "idx": g, "name": "NVIDIA H200", "arch": "hopper", "gpm_supported": g == 0,
                    "nvlink_count": 18} for g in range(2)])
    w.submit_tick(T0, gpu_rows=[{"gpu": g, **{k: v for k, v in gpu_row(g).items() if k not in meta}}
                                for g in range(2)])
    w.close()
    status = await ReplaySource(path).status()
    assert [(g.index, g.name, g.gpm_supported, g.nvlink_count) for g in status.gpus] == [
        (0, "NVIDIA H200", True, 18), (1, "NVIDIA H200", False, 18)]
