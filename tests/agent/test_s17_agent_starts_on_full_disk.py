"""An agent (re)started while its database's disk is full (session 17): it must start and supervise serving.

The previous agent stopped cleanly (an upgrade), so its last close removed the -wal/-shm; the disk filled before
the next agent opened the database, which could not create a new -shm. The agent exited 1 ("cannot open the
history database ...: disk I/O error") and systemd gave up after 5 tries: vLLM unsupervised, no history even once
space returned. Real agent processes on a real 20 MB tmpfs (root only), filled to the last byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from pathlib import Path

import pytest
from support.agent_proc import Agent, e2e_config, reap_sims
from support.small_fs import fill, mounted


@pytest.fixture
def small_fs(tmp_path):
    """A 20m tmpfs (support/small_fs.py)."""
    with mounted(tmp_path / "small", "20m") as mnt:
        yield mnt


def _query(db: Path, sql: str) -> list[tuple]:
    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return c.execute(sql).fetchall()
    finally:
        c.close()


@pytest.mark.timeout(150)
async def test_agent_started_on_a_full_disk_adopts_serving_and_writes_history_once_space_returns(tmp_path, small_fs):
    db = small_fs / "lynxtop.db"
    cfg = e2e_config(tmp_path, extra_agent="min_free_mb = 0")  # the run log is on the small disk too
    cfg.write_text(cfg.read_text().replace(str(tmp_path / "state" / "lynxtop.db"), str(db)))
    a = Agent(tmp_path, cfg)
    b: Agent | None = None
    try:
        st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
        pid = st["serving"]["pid"]
        assert a.stop() == 0  # serving keeps running (live restore); the last close removes -wal/-shm
        assert not Path(f"{db}-shm").exists()
        filler = fill(small_fs)
        b = Agent(tmp_path, cfg, name="agent2")
        deadline = time.monotonic() + 40
        st2: dict = {}
        while time.monotonic() < deadline and b.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError, KeyError):  # the socket is not up yet
                st2 = await b.status()
                if st2["serving"]["state"] == "ready":
                    break
            await asyncio.sleep(0.3)
        assert b.proc.poll() is None, f"agent exited {b.proc.returncode}: {b.output()[-800:]}"
        assert st2["serving"]["state"] == "ready" and st2["serving"]["pid"] == pid, st2.get("serving")
        err = st2["agent"]["store"]["last_error"] or ""
        assert "history unavailable" in err and "no space left" in err and str(db) in err, err
        code, _ = await b.api("GET", "/v1/processes")  # the socket answers beyond status
        assert code == 200
        started_ms = int(time.time() * 1000)
        filler.unlink()
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            st2 = await b.status()
            if st2["agent"]["store"]["last_error"] is None:
                rows = _query(db, f"SELECT count(*) FROM gpu_samples WHERE ts_ms >= {started_ms}")
                if rows[0][0]:
                    break
            await asyncio.sleep(0.5)
        else:
            raise AssertionError(f"no history after space returned: {st2['agent']['store']}\n{b.output()[-800:]}")
        kinds = {r[0] for r in _query(db, "SELECT kind FROM events")}
        assert {"store.write_failed", "store.writes_resumed"} <= kinds, sorted(kinds)
        assert b.stop() == 0
    finally:
        for x in (a, b):
            if x is not None and x.proc.poll() is None:
                x.proc.kill()
                x.proc.wait(5)
        reap_sims(tmp_path / "sim-state")
