"""The real agent keeps every tick when an operator opens its live database read-write from outside.

Repro of issue 11 section 1: the agent serves /v1/runs (its in-process reader opens the file), then
`sqlite3 DB 'PRAGMA quick_check'` runs from another process. The agent used to lose its locks to the
reader's header check, the outside process unlinked the -wal/-shm, and every tick after that was gone
after the next agent restart.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.agent_proc import Agent, e2e_config, state_db
from support.waits import wait_for_async

pytestmark = pytest.mark.timeout(120)

SQLITE3 = shutil.which("sqlite3")


def outside_rw_open(path: Path) -> str:
    if SQLITE3:
        cmd = [SQLITE3, str(path), "PRAGMA quick_check"]
    else:
        print("sqlite3 CLI not found: using a python -c sqlite3 subprocess as the outside process")
        cmd = [sys.executable, "-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
               "print(c.execute('PRAGMA quick_check').fetchone()[0]); c.close()", str(path)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout.strip()


async def tick_for(agent: Agent, seconds: float) -> None:
    """Let the agent run, reading its sd_notify messages (a full notify socket would stall its loop)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        agent.drain()
        await asyncio.sleep(0.1)


def holes(ts: list[int], until_ms: int, interval_ms: int = 200) -> int:
    """Ticks missing between consecutive samples taken before `until_ms`."""
    before = [t for t in ts if t <= until_ms]
    return sum(round((y - x) / interval_ms) - 1 for x, y in zip(before, before[1:], strict=False)
               if y - x > 1.5 * interval_ms)


def deleted_fds(pid: int, path: Path) -> list[str]:
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(f"{os.path.realpath(path)}-") and target.endswith(" (deleted)"):
            out.append(target)
    return out


async def test_outside_sqlite3_on_a_live_agent_loses_no_tick_across_a_restart(tmp_path, cleanup):
    cfg = e2e_config(tmp_path, autostart=False)  # sampling needs no server: host samples every 0.2 s
    path = tmp_path / "state" / "lynxtop.db"
    a = Agent(tmp_path, cfg)
    cleanup.append(a)
    await a.wait_notify("READY=1")
    await tick_for(a, 1.0)
    for call in ("/v1/runs", "/v1/events"):  # the agent's own reader opens the file
        code, _ = await a.api("GET", call)
        assert code == 200
    assert await asyncio.to_thread(outside_rw_open, path) == "ok"
    outside_ms = int(time.time() * 1000)
    await tick_for(a, 5.0)  # ticks after the outside open: the ones that used to be lost
    assert deleted_fds(a.proc.pid, path) == [], "the agent is writing into an unlinked WAL"
    st = (await a.status())["agent"]
    assert st["healthy"] and st["store"]["wal_unlinked"] is None, st
    stop_ms = int(time.time() * 1000)
    assert a.stop() == 0, a.output()
    missed = st["missed_ticks"] + 10  # the clock's own skips on a loaded box (and the last moments before stop)

    b = Agent(tmp_path, cfg, name="agent2")  # the restart
    cleanup.append(b)
    await b.wait_notify("READY=1")
    await wait_for_async(lambda: len(state_db(tmp_path, "SELECT 1 FROM events WHERE kind = 'agent.started'")) >= 2,
                         10, what="the restarted agent's start event stored")
    assert b.stop() == 0, b.output()

    second = max(r["ts_ms"] for r in state_db(tmp_path, "SELECT ts_ms FROM events WHERE kind = 'agent.started'"))
    ts = [r["ts_ms"] for r in state_db(tmp_path, "SELECT ts_ms FROM host_samples WHERE ts_ms < ? ORDER BY ts_ms",
                                 (second,))]
    # every tick the agent took is there: the only holes are ticks its clock skipped (counted as missed)
    n = holes(ts, stop_ms)
    assert n <= missed, (f"{n} ticks missing after the first agent's restart (it missed {missed - 10}); "
                             f"outside open at {outside_ms}, first {ts[0]}, stop {stop_ms}, gaps "
                             f"{[(x, y - x) for x, y in zip(ts, ts[1:], strict=False) if y - x > 300]}\n"
                             f"{(tmp_path / 'agent.log').read_text(errors='replace')[-3000:]}")
    assert ts[-1] >= stop_ms - 2500, (f"the first agent's last surviving tick is {stop_ms - ts[-1]} ms before "
                                      f"it stopped ({ts[-1] - outside_ms} ms after the outside open)")
    assert ts[0] < outside_ms
    assert state_db(tmp_path, "SELECT count(*) AS n FROM events WHERE kind = 'agent.stopped'")[0]["n"] == 2


async def test_agent_notices_an_unlinked_wal_reports_it_and_keeps_every_tick(tmp_path, cleanup):
    """An operator's `rm lynxtop.db-wal lynxtop.db-shm` on a live node: noticed, reported, nothing lost."""
    cfg = e2e_config(tmp_path, autostart=False)
    path = tmp_path / "state" / "lynxtop.db"
    a = Agent(tmp_path, cfg)
    cleanup.append(a)
    await a.wait_notify("READY=1")
    assert (await a.api("GET", "/v1/runs"))[0] == 200
    await tick_for(a, 1.0)
    for side in ("-wal", "-shm"):
        os.unlink(f"{path}{side}")
    unlinked_ms = int(time.time() * 1000)
    deadline = time.monotonic() + 20
    store: dict = {}
    while time.monotonic() < deadline:
        st = await a.status()
        store = st["agent"]["store"]
        if store.get("wal_recovered"):
            break
        await asyncio.sleep(0.1)
    assert store.get("wal_unlinked") and store["wal_recovered"] is True, store
    assert st["agent"]["healthy"], st["agent"]
    assert deleted_fds(a.proc.pid, path) == []
    code, body = await a.api("GET", f"/v1/events?since={unlinked_ms - 5000}")
    assert code == 200
    crit = [e for e in body["events"] if e["kind"] == "store.wal_unlinked"]
    assert len(crit) == 1 and crit[0]["severity"] == "critical", body["events"]
    text = subprocess.run([sys.executable, "-m", "lynxtop", "status", "--socket", a.sock_path], capture_output=True,
                          text=True, timeout=30).stdout
    assert "WAL UNLINKED" in text and "recovered" in text, text
    await tick_for(a, 1.5)
    missed = (await a.status())["agent"]["missed_ticks"] + 10  # the clock's own skips on a loaded box
    stop_ms = int(time.time() * 1000)
    assert a.stop() == 0, a.output()
    ts = [r["ts_ms"] for r in state_db(tmp_path, "SELECT ts_ms FROM host_samples ORDER BY ts_ms")]
    n = holes(ts, stop_ms)
    assert n <= missed, f"{n} ticks lost around the unlink at {unlinked_ms} (missed {missed - 10})"
    assert ts[0] < unlinked_ms - 500 and ts[-1] >= stop_ms - 2500
