"""Another node's History, Events, Logs and Processes from the head's cluster view (issue 28's last gap).

The head is the FAKE agent on a real unix socket with its own history database (runs `dsv41-tp8*`, an XID event);
the other node is a real `lynxtop agent` serving a simulated run, its `metrics_listen` on loopback with
`[agent] tcp_reads` and a token file. Opened from the cluster view with the same token (`--node-token-file`), every
view shows that node's data, never the head's; with a wrong token, or reads off there, each view says why and what
to configure instead of showing empty panes.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from support.agent_config import sim_profile, write_agent_config
from support.agent_proc import Agent, reap_sims
from support.ports import free_port, short_dir
from support.tui import make_app, screen_text, wait_for
from test_cluster_view import head_status, ray_node
from tui_fake_agent import T0, make_status

from lynxtop.contract.client import AgentRefused, AgentUnreachable
from lynxtop.contract.events import Event, EventKind
from lynxtop.contract.status import Status
from lynxtop.tui.cluster_source import RemoteHistory
from lynxtop.tui.screens.cluster import ClusterScreen

pytestmark = pytest.mark.timeout(180)

TOKEN = "cluster-read-token-0b8f6e2d4c1a9375"


def _token_file(path: Path, token: str) -> Path:
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture(params=[True], ids=["reads-on"])
async def worker(request, tmp_path):
    """A real agent serving a simulated run; `[agent] tcp_reads` as the param says (token: TOKEN)."""
    port = free_port()
    token = _token_file(tmp_path / "node.token", TOKEN)
    extra = f'tcp_reads = true\ntcp_token_file = "{token}"\n' if request.param else ""
    with short_dir() as d:
        cfg = write_agent_config(tmp_path / "config.toml", tmp_path / "state" / "lynxtop.db", d / "w.sock",
                                 fake_nvml="sim", sample_interval_s=0.2, default_profile="remote-tp8",
                                 autostart=True, gpu_release_timeout_s=10, metrics_listen=f"127.0.0.1:{port}",
                                 extra=extra, profiles=[sim_profile("remote-tp8", stop_grace_s=5,
                                                                    sim_args=("--sim-log-interval", "0.2"))])
        proc = Agent(tmp_path, cfg, name="worker", sock=d / "w.sock")
        try:
            await proc.wait_state(lambda s: s["state"] == "ready", timeout=60, what="ready")
            yield proc, port
        finally:
            proc.stop()
            reap_sims(tmp_path / "sim-state")


async def _open_worker(pilot, agent) -> None:
    app = pilot.app
    agent.status = head_status(ray_node("10.0.0.1", head=True, name="head-1"), ray_node("127.0.0.1", name="gpu-2"))
    await wait_for(pilot, lambda: app.state.connected and app.state.status.cluster.nodes)
    await pilot.press("N")
    await wait_for(pilot, lambda: isinstance(app.screen, ClusterScreen))
    screen = app.screen
    await wait_for(pilot, lambda: screen.fleet is not None and len(screen.fleet.rows) == 2
                   and screen.fleet.rows[1].status is not None, timeout_s=15)
    await pilot.press("down", "enter")
    await wait_for(pilot, lambda: app.viewing_node == "gpu-2" and app.state.status is not None, timeout_s=15)


async def test_another_nodes_history_events_logs_and_processes_are_its_own(agent, worker, history_db, tmp_path):
    proc, port = worker
    runs = (await proc.api("GET", "/v1/runs"))[1]["runs"]
    run_id = runs[0]["id"]
    app = make_app(agent.socket_path, history_db[0], node_port=port, clock=time.time,
                   node_token_file=_token_file(tmp_path / "dash.token", TOKEN))
    async with app.run_test(size=(160, 50)) as pilot:
        await _open_worker(pilot, agent)
        assert isinstance(app.history, RemoteHistory)

        def reads():  # the Compare and event-detail views' reads too, as the screens make them (in a thread)
            with app.history.reader() as reader:
                return reader.run(run_id), reader.run(run_id, summary=False), reader.bench_results(limit=5)

        one, bare, bench = await asyncio.to_thread(reads)
        assert one.id == run_id and one.profile == "remote-tp8" and one.summary["ended"] is False
        assert bare.summary is None and bench == []

        await pilot.press("4")  # History: the node's runs, and its charts from its own samples
        screen = app.screen
        await wait_for(pilot, lambda: "remote-tp8" in screen_text(app), timeout_s=15)
        assert "dsv41-tp8" not in screen_text(app) and screen.error is None  # nothing of the head's history
        assert screen.selected is not None and screen.selected.id == run_id
        chart = screen.query_one("#hchart-sm")
        await wait_for(pilot, lambda: any(v is not None for _, v in chart.points), timeout_s=15)

        await pilot.press("5")  # Events: the node's events (its agent's start names its pid), not the head's XID
        await wait_for(pilot, lambda: f"pid {proc.proc.pid}" in screen_text(app), timeout_s=15)
        assert "fell off the bus" not in screen_text(app)
        assert "gpu-2" in app.screen.source and "history database" not in app.screen.source

        await pilot.press("6")  # Logs: the node's vLLM log, over TCP
        screen = app.screen
        await wait_for(pilot, lambda: screen.run_id == run_id and screen.view.lines, timeout_s=15)
        assert screen.problem is None and str(tmp_path) in screen.path

        await pilot.press("7")  # Processes: the node's GPU processes
        screen = app.screen
        await wait_for(pilot, lambda: screen.answer is not None, timeout_s=15)
        assert screen.problem is None
    assert TOKEN not in proc.output()


async def test_a_wrong_token_says_so_in_every_view_instead_of_empty_panes(agent, worker, history_db, tmp_path):
    _, port = worker
    app = make_app(agent.socket_path, history_db[0], node_port=port, clock=time.time,
                   node_token_file=_token_file(tmp_path / "dash.token", "not-" + TOKEN))
    async with app.run_test(size=(160, 50)) as pilot:
        await _open_worker(pilot, agent)
        await pilot.press("4")
        await wait_for(pilot, lambda: "refused this dashboard's read token (401)" in screen_text(app), timeout_s=15)
        assert "--node-token-file" in screen_text(app) and "dsv41-tp8" not in screen_text(app)
        await pilot.press("6")
        screen = app.screen
        await wait_for(pilot, lambda: screen.problem is not None and "401" in screen.problem, timeout_s=15)
        assert "tcp_token_file" in screen.problem
        await pilot.press("7")
        screen = app.screen
        await wait_for(pilot, lambda: screen.problem is not None and "401" in screen.problem, timeout_s=15)


@pytest.mark.parametrize("worker", [False], ids=["reads-off"], indirect=True)
async def test_a_node_with_reads_off_says_what_to_configure(agent, worker, history_db, tmp_path):
    _, port = worker
    app = make_app(agent.socket_path, history_db[0], node_port=port, clock=time.time,
                   node_token_file=_token_file(tmp_path / "dash.token", TOKEN))
    async with app.run_test(size=(160, 50)) as pilot:
        await _open_worker(pilot, agent)
        await pilot.press("4")
        await wait_for(pilot, lambda: "serves no history over TCP (403)" in screen_text(app), timeout_s=15)
        assert "tcp_reads = true" in screen_text(app) and "dsv41-tp8" not in screen_text(app)
        await pilot.press("7")
        screen = app.screen
        await wait_for(pilot, lambda: screen.problem is not None and "403" in screen.problem, timeout_s=15)
        assert "tcp_reads = true" in screen.problem


async def test_without_a_token_file_history_says_what_to_configure(agent, worker, history_db):
    _, port = worker
    app = make_app(agent.socket_path, history_db[0], node_port=port, clock=time.time)
    async with app.run_test(size=(160, 50)) as pilot:
        await _open_worker(pilot, agent)
        await pilot.press("4")
        await wait_for(pilot, lambda: "gpu-2's history database is on that node" in screen_text(app), timeout_s=15)
        text = screen_text(app).replace("\n", " ")
        assert "tcp_reads" in text and "dsv41-tp8" not in text


class _NoLogSource:
    """Another node whose history reads but whose log does not (refused, or gone since)."""

    label = "http://127.0.0.1:1"
    read_only = "viewing node gpu-2"

    def __init__(self, status):
        self._status = status

    async def status(self):
        return self._status

    async def events(self, since_ms=None, limit=500):
        return []

    async def runs(self, limit=50):
        return []

    async def profiles(self):
        raise AgentRefused(403, "read_only", "read-only")

    async def logs(self, run_id=None, lines=2000, after=None, inode=None):
        raise AgentUnreachable("node gpu-2 did not answer")

    async def processes(self):
        raise AgentUnreachable("node gpu-2 did not answer")

    async def action(self, action, profile=None, **extra):
        raise AgentRefused(403, "read_only", "read-only")

    async def close(self):
        pass


async def test_another_nodes_log_is_never_read_from_a_local_file_of_the_same_path(tmp_path):
    """The Events view reads a run's log file itself when the agent does not answer: on this node only. Another
    node's run names a path on that node; the same path here (another run's log) must not be shown as its log."""
    from lynxtop.store.writer import StoreWriter

    local = tmp_path / "run-1.log"
    local.write_text("THIS-NODE-ONLY line 1\nTHIS-NODE-ONLY line 2\n")
    db = tmp_path / "node.db"
    w = StoreWriter(db, clock=lambda: T0 / 1000)
    w.start()
    run = w.create_run(profile="remote-tp8", argv=["vllm", "serve", "m"], model="m", host="gpu-2",
                       started_ms=T0 - 60_000, pid=7, log_path=str(local), simulated=True)
    w.record(Event(EventKind.SERVING_STARTING, "info", "starting remote-tp8", run_id=run, ts_ms=T0 - 60_000))
    w.close()
    app = make_app(tmp_path / "no-agent.sock", db, source=_NoLogSource(Status.from_json(make_status())))
    app.viewing_node = "gpu-2"  # as the cluster view leaves it, its history read as that node's
    async with app.run_test(size=(160, 50)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        await pilot.press("5")
        screen = app.screen
        await wait_for(pilot, lambda: screen.runs and "starting remote-tp8" in screen_text(app), timeout_s=10)
        screen.fetch_log()  # again, now that the runs (and the log's path) are known
        await wait_for(pilot, lambda: "did not answer" in screen._log_header, timeout_s=10)
        assert not any("THIS-NODE-ONLY" in ln for ln in screen.log_lines)
        assert "THIS-NODE-ONLY" not in screen_text(app)


def test_the_served_dashboard_gets_the_token_files_path_never_the_token():
    from lynxtop.cli.parser import build_parser
    from lynxtop.cli.web import dashboard_argv

    args = build_parser().parse_args(["dashboard", "--web", "127.0.0.1:8765", "--node-token-file", "/etc/n.token"])
    argv = dashboard_argv(args, Path("/run/a.sock"), Path("/var/h.db"), control=False)
    i = argv.index("--node-token-file")
    assert argv[i:i + 2] == ["--node-token-file", "/etc/n.token"]


def test_the_dashboard_reads_the_agents_own_token_file_through_its_group(tmp_path):
    """The production layout: the token file is the agent's user's, mode 0640 with the operators' group; an
    operator's dashboard reads it (the agent alone checks the owner). A file others may read is still refused."""
    import os

    if os.geteuid() != 0:
        pytest.skip("needs root to give the file to another user")
    token = _token_file(tmp_path / "agent.token", TOKEN)
    os.chown(token, 65534, 0)  # another user's (nobody), group root: this process reads it through the group
    token.chmod(0o640)
    app = make_app(tmp_path / "no.sock", None, node_token_file=token)
    assert app._node_token() == (TOKEN, None)
    token.chmod(0o644)
    got, why = app._node_token()
    assert got is None and "has mode 0644" in why and TOKEN not in why


async def test_a_hostile_or_older_node_is_a_clear_history_message(tmp_path):
    """A real HTTP server stands for the other node: series rows with text where numbers go are refused (never
    drawn), and an agent from before tcp_reads (its listener's plain 404) is named as such."""
    from aiohttp import web

    from lynxtop.tui.history_source import HistoryUnavailable

    async def history(request):
        rows = [{"ts_ms": 1, "gpu": 0, "sm_active_pct": "\x1b[2J99"}]
        return web.json_response({"resolution": "raw", "rows": rows})

    app = web.Application()
    app.router.add_get("/v1/history", history)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    old = web.AppRunner(web.Application())  # serves nothing: aiohttp's plain-text 404, as an older agent's
    await old.setup()
    old_port = free_port()
    await web.TCPSite(old, "127.0.0.1", old_port).start()
    try:
        def series(port):
            with RemoteHistory("gpu-2", f"http://127.0.0.1:{port}", TOKEN).reader() as reader:
                return reader.series("gpu", ["sm_active_pct"], 0, 10)

        with pytest.raises(HistoryUnavailable) as bad:
            await asyncio.to_thread(series, port)
        assert "node gpu-2 answered series that this lynxtop cannot read" in str(bad.value)
        assert "sm_active_pct is not a number" in str(bad.value) and "\x1b" not in str(bad.value)
        with pytest.raises(HistoryUnavailable) as bad:
            await asyncio.to_thread(series, old_port)
        assert "serves no history over TCP (404: an agent older than this dashboard?)" in str(bad.value)
    finally:
        await runner.cleanup()
        await old.cleanup()
