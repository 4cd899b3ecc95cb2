"""Another node's Events, Compare and History read with their filters in that node's database; the History
view's filter searches every run, not the newest 200 (s21).

Another node's reader (tui/cluster_source.py, over the agent's TCP history reads) took no filter: its Events view
searched only the newest 1,000 events (three errors behind 2,000 newer infos: "no events match"), Compare filtered
the newest 1,000 bench results. The History view filtered the newest 200 runs in Python, so an older run's profile
found nothing.

A real agent with `[agent] tcp_reads` over a history written beforehand by the store's writer, read by the
dashboard's own RemoteHistory; the History view is the real app driven by Textual's Pilot over a real database.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.agent_config import sim_profile, write_agent_config
from support.agent_proc import Agent, reap_sims
from support.ports import free_port, short_dir
from support.tui import make_app, text_of, wait_for
from support.tui_keys import open_screen
from textual.widgets import DataTable
from tui_fake_agent import T0

from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.store.reader import StoreReader
from lynxtop.store.writer import StoreWriter
from lynxtop.tui.cluster_source import RemoteHistory
from lynxtop.tui.history_source import HistoryUnavailable
from lynxtop.tui.screens.compare import _bench_of
from lynxtop.tui.screens.events import EVENTS_READ, EventsScreen
from lynxtop.tui.screens.history import RUNS_READ, HistoryScreen

pytestmark = pytest.mark.timeout(180)

TOKEN = "remote-filter-token-4f7a1c9e2b6d8035"


def _seed(db: Path) -> dict[str, int]:
    """Runs bench-a, bench-b (a sweep each) and flood (60 newer results); 3 errors behind 2,000 newer infos."""
    base = int(time.time() * 1000) - 3_600_000
    w = StoreWriter(db)
    w.start()
    ids = {}
    for i, profile in enumerate(("bench-a", "bench-b", "flood")):
        ids[profile] = w.create_run(profile=profile, argv=["vllm"], model="m", host="h", started_ms=base + i * 1000,
                                    pid=100 + i, log_path="", simulated=True)
        w.update_run(ids[profile], ended_ms=base + i * 1000 + 500, exit_code=0, end_reason="switch")
    for i in range(3):
        w.record(Event(EventKind.GPU_XID, Severity.ERROR, f"GPU {i} XID 79: fell off the bus", ts_ms=base + 10 + i))
    for i in range(2_000):
        w.record(Event(EventKind.SCRAPE_COUNTER_RESET, Severity.INFO, f"counter reset {i}",
                       ts_ms=base + 1_000 + i * 100))
        if i % 500 == 0:
            assert w.flush(30)
    for name in ("bench-a", "bench-b"):
        w.add_bench_result({"run_id": ids[name], "name": "sharegpt", "concurrency": 8, "ts_ms": base + 5_000,
                            "bench_id": f"sweep-{name}", "output_tokens_per_s": 800.0, "num_prompts": 40})
    for i in range(60):
        w.add_bench_result({"run_id": ids["flood"], "name": "sharegpt", "concurrency": 1, "ts_ms": base + 6_000 + i,
                            "bench_id": f"flood-{i}", "output_tokens_per_s": 90.0})
    w.close()
    return ids


@pytest.fixture
async def node(tmp_path):
    """(RemoteHistory of a real agent serving its TCP reads, the seeded run ids)."""
    (tmp_path / "state").mkdir()
    ids = _seed(tmp_path / "state" / "lynxtop.db")
    port = free_port()
    token = tmp_path / "read.token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    with short_dir() as d:
        cfg = write_agent_config(tmp_path / "config.toml", tmp_path / "state" / "lynxtop.db", d / "a.sock",
                                 fake_nvml="sim", sample_interval_s=0.5, default_profile="sim", autostart=False,
                                 metrics_listen=f"127.0.0.1:{port}",
                                 extra=f'tcp_reads = true\ntcp_token_file = "{token}"\n',
                                 profiles=[sim_profile("sim", startup_s=0.3, stop_grace_s=5)])
        agent = Agent(tmp_path, cfg, sock=d / "a.sock")
        try:
            await agent.wait_notify("READY=1", timeout=60)
            yield RemoteHistory("gpu-2", f"http://127.0.0.1:{port}", TOKEN, timeout_s=30), ids
        finally:
            agent.stop()
            reap_sims(tmp_path / "sim-state")


async def test_another_nodes_reader_filters_in_its_database(node):
    history, ids = node
    with history.reader() as reader:
        errors = reader.events(limit=EVENTS_READ, severities=["error", "critical"])
        assert [e.message for e in errors] == [f"GPU {i} XID 79: fell off the bus" for i in range(3)]
        assert len(reader.events(limit=EVENTS_READ, kind_family="gpu.", text="fell")) == 3

        # the Events view's read: filtered there, so its title says "newest 1000 shown", not "searched"
        events, in_sql = EventsScreen._read(None, reader, None, "error", "")  # type: ignore[arg-type]
        assert len(events) == 3 and in_sql
        events, in_sql = EventsScreen._read(None, reader, "gpu.", "info", "XID")  # type: ignore[arg-type]
        assert len(events) == 3 and in_sql

        # Compare's bench results by run, behind 60 newer ones of another run
        pair = (ids["bench-a"], ids["bench-b"])
        bench = reader.bench_results(limit=10, run_ids=pair)
        assert sorted(r["run_id"] for r in bench) == sorted(pair)
        assert sorted(r["run_id"] for r in _bench_of(reader, pair)) == sorted(pair)

        assert [r.profile for r in reader.runs(limit=RUNS_READ, text="BENCH-B")] == ["bench-b"]

        with pytest.raises(HistoryUnavailable) as bad:  # a bad value: the node's 400, naming the parameter
            reader.events(limit=10, severities=["fatal"])
        assert "400" in str(bad.value) and "'severities'" in str(bad.value)


@pytest.fixture
def many_runs(tmp_path) -> Path:
    """`old-unique`, `a_b`, `axb` and `a%b`, then 205 runs newer than them (p0..p204)."""
    db = tmp_path / "history.db"
    w = StoreWriter(db, clock=lambda: T0 / 1000)
    w.start()
    profiles = ["old-unique", "a_b", "axb", "a%b", *(f"p{i}" for i in range(205))]
    for i, profile in enumerate(profiles):
        run = w.create_run(profile=profile, argv=["vllm"], model="m", host="h", started_ms=T0 - 10_000_000 + i * 1000,
                           pid=100 + i, log_path="", simulated=True)
        w.update_run(run, ended_ms=T0 - 10_000_000 + i * 1000 + 500, exit_code=0, end_reason="switch")
    w.close()
    return db


def test_the_store_reader_filters_runs_in_sql(many_runs):
    with StoreReader(many_runs) as reader:
        assert [r.profile for r in reader.runs(limit=RUNS_READ, text="OLD-UNIQUE")] == ["old-unique"]
        assert [r.profile for r in reader.runs(limit=RUNS_READ, text="a_b")] == ["a_b"]  # _ is itself
        assert [r.profile for r in reader.runs(limit=RUNS_READ, text="a%b")] == ["a%b"]  # % is itself
        assert len(reader.runs(limit=RUNS_READ, text="switch")) == RUNS_READ  # the end reason
        first = reader.runs(limit=1)[0]
        assert [r.id for r in reader.runs(limit=5, text=str(first.id))][0] == first.id  # the id
        assert len(reader.runs(limit=300, text="")) == 209  # no filter


async def test_the_history_filter_finds_a_run_older_than_the_newest_200(sock_dir, many_runs):
    app = make_app(sock_dir / "absent.sock", many_runs, utc=True)
    async with app.run_test(size=(160, 40)) as pilot:
        screen = await open_screen(pilot, app, "4", HistoryScreen, connected=False)
        table = screen.query_one("#runs", DataTable)
        status = screen.query_one("#history-status")
        await wait_for(pilot, lambda: table.row_count == RUNS_READ, 60)
        await pilot.press("slash", *"old-uni", "enter")
        await wait_for(pilot, lambda: table.row_count == 1, 60)
        assert [r.profile for r in screen.runs] == ["old-unique"]
        await wait_for(pilot, lambda: "'old-uni': 1 run" in text_of(status), 30)
        assert "newest" not in text_of(status)  # every run searched: nothing cut

        await pilot.press("slash", "ctrl+u", "p", "enter")  # 205 match: the newest 200 of them shown, said so
        await wait_for(pilot, lambda: table.row_count == RUNS_READ and screen.runs[0].profile == "p204", 60)
        await wait_for(pilot, lambda: f"newest {RUNS_READ} matches" in text_of(status), 30)

        await pilot.press("escape")
        await wait_for(pilot, lambda: table.row_count == RUNS_READ and not screen.run_filter, 60)
        await wait_for(pilot, lambda: f"newest {RUNS_READ} runs listed" in text_of(status), 30)
