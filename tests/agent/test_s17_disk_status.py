"""What the agent serves while its database's disk is full (audit, session 17): the store's status must let an
operator see the cause: the database's path, the free bytes of its file system, that writes are failing and
retried, and the ticks queued and dropped. The agent stays `healthy`: it feeds systemd's watchdog, which would
restart it into the same full disk.

A real agent with its database on a 20 MB tmpfs (root only), a simulated model ready, the file system then filled
to the last byte; the served status is read over its real API.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
from support.agent_proc import Agent, e2e_config, reap_sims
from support.small_fs import fill, mounted


@pytest.fixture
def small_fs(tmp_path):
    """A 20m tmpfs (support/small_fs.py)."""
    with mounted(tmp_path / "small", "20m") as mnt:
        yield mnt


@pytest.fixture
def agent_on_small_fs(tmp_path, small_fs):
    db = small_fs / "lynxtop.db"
    cfg = e2e_config(tmp_path, extra_agent="min_free_mb = 0")  # the preflight would hold the start on 20 MB
    cfg.write_text(cfg.read_text().replace(str(tmp_path / "state" / "lynxtop.db"), str(db)))
    a = Agent(tmp_path, cfg)
    yield a, db, cfg
    if a.proc.poll() is None:
        a.proc.kill()
        a.proc.wait(5)
    reap_sims(tmp_path / "sim-state")


@pytest.mark.timeout(120)
async def test_a_full_disk_is_served_with_the_path_free_space_and_counts(agent_on_small_fs):
    a, db, _ = agent_on_small_fs
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    store = st["agent"]["store"]
    assert store["path"] == str(db) and store["retrying"] is False, store
    assert isinstance(store["free_bytes"], int) and store["free_bytes"] > 1 << 20, store  # 20 MB, mostly free
    fill(db.parent)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        st = await a.status()
        store = st["agent"]["store"]
        # free space is read at most every few seconds: wait for the reading after the fill too
        if store.get("retrying") and store.get("free_bytes") == 0 and store.get("queued"):
            break
        await asyncio.sleep(0.5)
    assert "database or disk is full" in (store.get("last_error") or ""), store
    assert store["path"] == str(db), store
    assert store["retrying"] is True and store["free_bytes"] == 0, store
    assert store["queued"] > 0 and isinstance(store["dropped"], int), store
    assert st["agent"]["healthy"] is True, st["agent"]


@pytest.mark.timeout(120)
async def test_lynxtop_status_prints_the_full_disk_and_the_run_log_problem(agent_on_small_fs):
    """The same agent read by the real `lynxtop status`: the history line and the run log's problem."""
    a, db, cfg = agent_on_small_fs
    await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    fill(db.parent)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        st = await a.status()
        store = st["agent"]["store"]
        if store.get("retrying") and store.get("free_bytes") == 0 and st["serving"].get("log_problem"):
            break
        await asyncio.sleep(0.5)
    out = subprocess.run([sys.executable, "-m", "lynxtop", "status", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=30).stdout
    assert f"history  NOT WRITING - disk full: {db} (0 B free), " in out, out
    assert "ticks queued" in out and "dropped" in out, out
    assert f"run log  NOT KEPT - {st['serving']['log_problem']}" in out, out
