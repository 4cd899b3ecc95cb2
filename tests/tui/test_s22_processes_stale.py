"""A lost GPU's last processes (agent/gpu/lost.py keeps them, marked stale) reach the Processes view as such.

`/v1/processes` dropped the flag: a process last seen on a GPU that fell off the bus read as a live reading, its
memory and its "vLLM run" as if NVML had just listed them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.log_agent import LogAgent
from support.tui import make_app, screen_text, wait_for
from textual.widgets import DataTable

from lynxtop.agent.api.processes import describe
from lynxtop.contract.processes import GpuProcesses
from lynxtop.tui.screens.processes import ProcessesScreen


def test_the_stale_flag_is_served_and_read_back():
    rows = [{"gpu": 3, "pid": os.getpid(), "used_mem_bytes": 1 << 30, "in_vllm_tree": True, "stale": True},
            {"gpu": 0, "pid": os.getpid(), "used_mem_bytes": 1 << 30, "in_vllm_tree": True}]
    answer = GpuProcesses.from_json(describe(rows, 1.0).to_json())
    by_gpu = {p.gpu: p.stale for p in answer.processes}
    assert by_gpu == {0: False, 3: True}


def test_an_older_agents_answer_reads_as_not_stale():
    answer = GpuProcesses.from_json({"age_s": 1.0, "processes": [{"pid": 7, "gpu": 0, "in_run": True}]})
    assert answer.processes[0].stale is False


@pytest.fixture
def agent(sock_dir: Path, tmp_path: Path):
    path = tmp_path / "run.log"
    path.write_text("INFO ready\n")
    agent = LogAgent(sock_dir / "agent.sock", path).start()
    yield agent
    agent.stop()


async def test_the_view_marks_a_lost_gpus_processes(agent):
    agent.controller.process_rows = [
        {"gpu": 0, "pid": os.getpid(), "used_mem_bytes": 80 << 30, "in_vllm_tree": True, "sm_util_pct": 71},
        {"gpu": 5, "pid": os.getpid(), "used_mem_bytes": 79 << 30, "in_vllm_tree": True, "stale": True},
    ]
    app = make_app(agent.socket_path)
    async with app.run_test(size=(200, 40)) as pilot:
        await pilot.press("7")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, ProcessesScreen))
        table = pilot.app.screen.query_one("#procs", DataTable)
        await wait_for(pilot, lambda: table.row_count == 2)
        cells = {str(table.get_row_at(i)[0]): str(table.get_row_at(i)[5]) for i in range(2)}
        assert cells == {"0": "vLLM run", "5": "vLLM run (last seen: GPU lost)"}
        await wait_for(pilot, lambda: "GPU 5 lost: its processes as last seen" in screen_text(pilot.app))
