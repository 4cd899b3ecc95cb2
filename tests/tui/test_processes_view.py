"""The Processes view (7) through the real control API with real processes (issue 28.4): pid, user, GPU memory,
SM share and command per GPU process, a process that is not the supervised vLLM run flagged and listed first,
its command line's secrets masked and its foreign text shown literally, and an agent without the call explained."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.log_agent import LogAgent
from support.tui import make_app, screen_text, wait_for
from textual.widgets import DataTable

from lynxtop.tui.screens.processes import ProcessesScreen


@pytest.fixture
def stray():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "[bold]job", "x\x1b[31my",
                             "--hf-token", "hf_secret"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def agent(sock_dir: Path, tmp_path: Path):
    path = tmp_path / "run.log"
    path.write_text("INFO ready\n")
    agent = LogAgent(sock_dir / "agent.sock", path).start()
    yield agent
    agent.stop()


async def test_a_stray_process_is_flagged_first_with_its_user_command_and_memory(agent, stray):
    agent.controller.process_rows = [
        {"gpu": 0, "pid": os.getpid(), "used_mem_bytes": 80 << 30, "in_vllm_tree": True, "sm_util_pct": 71},
        {"gpu": 1, "pid": os.getpid(), "used_mem_bytes": 79 << 30, "in_vllm_tree": True, "sm_util_pct": 64},
        {"gpu": 1, "pid": stray.pid, "used_mem_bytes": 2 << 30, "in_vllm_tree": False, "sm_util_pct": None},
    ]
    app = make_app(agent.socket_path)
    async with app.run_test(size=(200, 40)) as pilot:
        await pilot.press("7")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, ProcessesScreen))
        table = pilot.app.screen.query_one("#procs", DataTable)
        await wait_for(pilot, lambda: table.row_count == 3)
        first = [str(c) for c in table.get_row_at(0)]
        assert first[:6] == ["1", str(stray.pid), getpass.getuser(), "2.00 GiB", "–", "⚠ not the vLLM run"]
        assert "[bold]job" in first[6] and "x\\x1b[31my" in first[6] and "hf_secret" not in first[6]
        assert [str(c) for c in table.get_row_at(1)][4:6] == ["71%", "vLLM run"]
        await wait_for(pilot, lambda: "1 not the supervised vLLM: 2.00 GiB" in screen_text(pilot.app))
        assert "[bold]job" in screen_text(pilot.app)

        agent.controller.process_rows = agent.controller.process_rows[:2]  # the stray job ended
        await wait_for(pilot, lambda: table.row_count == 2)
        await wait_for(pilot, lambda: "all belong to the supervised vLLM run" in screen_text(pilot.app))


async def test_an_agent_without_the_call_is_explained(sock_dir):
    """The view says what the agent answered, and shows no rows."""
    from tui_fake_agent import FakeAgent

    fake = FakeAgent(sock_dir / "agent.sock")
    fake.gpu_processes = None  # an agent from before the call: 404
    fake.start()
    try:
        app = make_app(fake.socket_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("7")
            await wait_for(pilot, lambda: isinstance(pilot.app.screen, ProcessesScreen))
            await wait_for(pilot, lambda: "answered HTTP 404" in screen_text(pilot.app))
            assert pilot.app.screen.query_one("#procs", DataTable).row_count == 0
    finally:
        fake.stop()
