"""Another node's history as the dashboard reads it: a real `lynxtop agent` serving a history file over its TCP
reads, and the board changes a history source (the local file's or the remote one) tells the History view."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from lynxtop.tui.history_source import BoardChange
from lynxtop.tui.screens.history import _board_changes
from support.agent_config import sim_profile, write_agent_config
from support.agent_proc import Agent, reap_sims
from support.ports import free_port, short_dir


@asynccontextmanager
async def tcp_reads_agent(tmp_path: Path, db: Path, token: str) -> AsyncIterator[int]:
    """A real agent (fake NVML "sim", serving stopped) whose database is `db`, with `tcp_reads` on and `token` as
    its read token (a 0600 file under tmp_path); yields its TCP port once it said READY=1. The simulated servers it
    leaves are reaped at the end."""
    port = free_port()
    token_file = tmp_path / "read.token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    with short_dir() as d:
        cfg = write_agent_config(tmp_path / "config.toml", db, d / "a.sock", fake_nvml="sim", sample_interval_s=0.5,
                                 default_profile="sim", autostart=False, metrics_listen=f"127.0.0.1:{port}",
                                 extra=f'tcp_reads = true\ntcp_token_file = "{token_file}"\n',
                                 profiles=[sim_profile("sim", startup_s=0.3, stop_grace_s=5)])
        agent = Agent(tmp_path, cfg, sock=d / "a.sock")
        try:
            await agent.wait_notify("READY=1", timeout=60)
            yield port
        finally:
            agent.stop()
            reap_sims(tmp_path / "sim-state")


def board_changes_in(history: Any, start: int, end: int) -> list[BoardChange]:
    """The board changes the History view marks for [start, end], read through `history`'s reader (a
    HistorySource or a RemoteHistory): blocking, run it in a thread from a test's loop."""
    with history.reader() as reader:
        return _board_changes(reader, start, end)
