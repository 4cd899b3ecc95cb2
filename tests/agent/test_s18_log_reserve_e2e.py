"""A disk that fills during a load (session 18), with a real agent, the simulated vLLM and a real tmpfs for the run
logs: vLLM's progress bars re-raise ENOSPC (the simulator's do too: tests/agent/sim/test_s18_progress_bars.py), so
without the log's reserve (`[agent] run_log_reserve_mb`) the load dies; with it, the load writes into blocks
allocated past the log's end and becomes ready. When the run ends the reserve is given back."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from support.agent_config import sim_profile, write_agent_config
from support.agent_proc import Agent
from support.small_fs import fill, mounted

pytestmark = pytest.mark.timeout(150)

RESERVE_MB = 1


@pytest.fixture
def small_fs(tmp_path):
    """A 12m tmpfs for the run logs only (support/small_fs.py); the history stays on tmp_path."""
    with mounted(tmp_path / "small", "12m") as mnt:
        yield mnt


def _agent(tmp_path: Path, small_fs: Path, reserve_mb: int) -> Agent:
    # an 8 s load: its weight phase (70 %) prints a bar line every 0.2 s for ~5.6 s
    prof = sim_profile("v4", startup_s=8, readiness_timeout_s=90, sim_args=("--sim-log-interval", "1"))
    cfg = write_agent_config(tmp_path / "config.toml", tmp_path / "state" / "lynxtop.db",
                             tmp_path / "run" / "agent.sock", fake_nvml="sim", sample_interval_s=0.2,
                             default_profile="v4", autostart=True, backoff_initial_s=0.3, backoff_max_s=1,
                             gpu_release_timeout_s=10, min_free_mb=1, log_dir=small_fs / "logs",
                             run_log_reserve_mb=reserve_mb, profiles=[prof])
    return Agent(tmp_path, cfg)


async def _bar_started(small_fs: Path, timeout: float = 60) -> Path:
    """The run's log once the checkpoint-shard bar has begun (the load is under way)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for log in (small_fs / "logs").glob("*.log") if (small_fs / "logs").exists() else ():
            if b"checkpoint shards:   0%" in log.read_bytes():
                return log
        await asyncio.sleep(0.05)
    raise AssertionError("the load's progress bar never started")


def fill_last_block(log: Path) -> None:
    """Append one line that ends at the log's last block boundary: once the disk is full, the load's next write
    needs a new block (a short log would otherwise take the rest of the bar into its last block's slack)."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    try:
        st = os.fstat(fd)
        n = -st.st_size % st.st_blksize
        if n:
            os.write(fd, b"#" * (n - 1) + b"\n")
    finally:
        os.close(fd)


def _reserved(log: Path) -> int:
    st = os.stat(log)
    return st.st_blocks * 512 - st.st_size


async def _events(a: Agent, kind: str) -> list[dict]:
    code, body = await a.api("GET", "/v1/events?since=0&limit=1000")
    assert code == 200, body
    return [e for e in body["events"] if e["kind"] == kind]


async def test_a_load_whose_log_disk_fills_becomes_ready_on_its_reserve_which_is_given_back_at_the_end(
        tmp_path, small_fs, cleanup):
    a = _agent(tmp_path, small_fs, RESERVE_MB)
    cleanup.append(a)
    log = await _bar_started(small_fs)
    assert _reserved(log) >= (RESERVE_MB << 20) // 2, "no reserve past the new run's log"
    filler = fill(small_fs)
    fill_last_block(log)
    size_at_fill = log.stat().st_size
    st = await a.wait_state(lambda s: s["state"] in ("ready", "backoff", "waiting", "crash-loop"), timeout=60,
                            what="the load's end")
    assert st["serving"]["state"] == "ready", (st["serving"], a.output())
    assert not await _events(a, "serving.crash")
    text = log.read_bytes()
    assert text.find(b"100% Completed", size_at_fill) > 0  # the bar's end written on the full disk, into the reserve
    assert b"Application startup complete." in text
    assert os.statvfs(small_fs).f_bfree == 0  # still full: nothing but the reserve took those lines

    code, body = await a.api("POST", "/v1/stop", {})
    assert code == 202, body
    await a.wait_state(lambda s: s["state"] == "stopped", timeout=30, what="stopped")
    deadline = time.monotonic() + 10
    while _reserved(log) >= 4096 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert _reserved(log) < 4096, "the ended run's log kept its reserve"  # its last block's slack at most
    filler.unlink()
    assert a.stop() == 0


async def test_without_the_reserve_the_same_load_dies_and_the_agent_names_the_full_disk(tmp_path, small_fs,
                                                                                      cleanup):
    a = _agent(tmp_path, small_fs, 0)
    cleanup.append(a)
    log = await _bar_started(small_fs)
    assert _reserved(log) < 4096
    filler = fill(small_fs)
    fill_last_block(log)
    deadline = time.monotonic() + 60
    crashes: list[dict] = []
    while not crashes and time.monotonic() < deadline:
        crashes = await _events(a, "serving.crash")
        await asyncio.sleep(0.2)
    assert crashes, a.output()
    msg = crashes[0]["message"]
    assert f"the run log's file system {small_fs / 'logs'} is full" in msg, msg
    assert "exited with code 1 before becoming ready" in msg, msg
    assert b"100% Completed" not in log.read_bytes()
    filler.unlink()
    assert a.stop() == 0
