"""A full disk under the history and the run logs (issue 11, item 4): a run that starts is always recorded,
and a log that cannot be written is an event, never a crash of serving.

The end-to-end test mounts a 20 MB tmpfs (root only, as in CI), fills it, and restarts serving through the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import time

import pytest
from support.agent_proc import Agent, e2e_config, sim_processes
from support.db import db_rows
from support.small_fs import fill, mounted
from support.waits import holds_async

from lynxtop.agent.serving import procs


def _events(store, kind: str) -> list[dict]:
    assert store.flush(10)
    return db_rows(store.path, "SELECT * FROM events WHERE kind = ? ORDER BY id", (kind,))


async def test_adoption_restores_a_run_row_that_never_reached_the_file(make_sup, store, h):
    """The previous agent ended while the disk was full: serving.json knows the run, the history does not.
    The adopting agent writes the row from the record, and the next run's id stays above it."""
    a = make_sup()
    await a.start("alpha", by="test")
    await h.wait_for(lambda: a.state == "ready" and a.action is None, 15, what="ready")
    run_id, pid, started = a.run_id, a.proc.pid, a.started_ms
    await a.shutdown(stop_serving=False)
    assert store.flush(10)
    conn = sqlite3.connect(store.path)
    conn.execute("DELETE FROM runs")  # as if the INSERT had been queued when the old agent died
    conn.commit()
    conn.close()
    b = make_sup()
    assert await b.adopt_previous()
    assert b.run_id == run_id and b.proc.pid == pid
    assert store.flush(10)
    rows = h.db_rows(store.path, "SELECT id, profile, pid, started_ms, argv FROM runs")
    assert [(r["id"], r["profile"], r["pid"], r["started_ms"]) for r in rows] == [(run_id, "alpha", pid, started)]
    await h.wait_for(lambda: b.state == "ready", 15, what="adopted ready")
    await b.restart(by="test")
    await h.wait_for(lambda: b.state == "ready" and b.action is None and b.run_id != run_id, 20,
                     what="restarted")
    assert b.run_id == run_id + 1
    await b.shutdown(stop_serving=True)


async def test_log_that_cannot_be_created_is_an_event_and_serving_starts(make_sup, store, h, tmp_path):
    """The log directory is unusable (here: a file stands where the directory should be): the server still
    starts, with its output discarded, and an event and the status say why."""
    a = make_sup()
    a.cfg.agent.run_log_dir.parent.mkdir(parents=True, exist_ok=True)
    if a.cfg.agent.run_log_dir.is_dir():
        a.cfg.agent.run_log_dir.rmdir()
    a.cfg.agent.run_log_dir.write_text("not a directory")
    await a.start("alpha", by="test")
    await h.wait_for(lambda: a.state == "ready" and a.action is None, 15, what="ready without a log")
    ev = _events(store, "serving.log_unwritable")
    assert len(ev) == 1 and "cannot create the run's log" in ev[0]["message"] and ev[0]["run_id"] == a.run_id
    assert "serving goes on" in ev[0]["message"]
    assert "cannot create" in a.serving_status().log_problem
    await a.shutdown(stop_serving=True)


# ------------------------------------------------------------------------------- a real full file system


@pytest.fixture
def small_fs(tmp_path):
    """A 20m tmpfs (support/small_fs.py)."""
    with mounted(tmp_path / "small", "20m") as mnt:
        yield mnt


@pytest.mark.timeout(150)
async def test_restart_on_a_full_disk_records_the_run_and_keeps_serving(tmp_path, small_fs, cleanup):
    db_path = small_fs / "lynxtop.db"
    # min_free_mb = 0: the free-space preflight (diskspace.py) would refuse this restart; what is tested here is
    # a run that starts while the disk is full (it filled after the checks) being recorded. No progress bar: on a
    # disk full before the load began vLLM's (and the simulator's) re-raises ENOSPC, and the load dies
    cfg = e2e_config(tmp_path, extra_agent="min_free_mb = 0", sim_args=("--no-use-tqdm-on-load",))
    cfg.write_text(cfg.read_text().replace(str(tmp_path / "state" / "lynxtop.db"), str(db_path)))
    a = Agent(tmp_path, cfg)
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    run1 = st["serving"]["run_id"]
    filler = fill(small_fs)

    code, body = await a.api("POST", "/v1/restart", {})
    assert code == 202, body
    # the new run has its id as soon as it is started: no 30 s wait on the store in "stopping", no "run None"
    st = await a.wait_state(lambda s: s["state"] in ("starting", "ready") and s["pid"] is not None
                            and s["run_id"] != run1, timeout=20, what="the new run starting")
    run2, pid2 = st["serving"]["run_id"], st["serving"]["pid"]
    assert run2 == run1 + 1
    st = await a.wait_state(lambda s: s["state"] == "ready", timeout=30, what="the new run ready on a full disk")
    assert st["serving"]["run_id"] == run2 and st["serving"]["pid"] == pid2
    assert st["serving"]["log_problem"] and "full" in st["serving"]["log_problem"]
    await holds_async(lambda: procs.alive(pid2), 2, what="serving going on while its log cannot be written")
    assert (await a.status())["serving"]["state"] == "ready"

    filler.unlink()  # space returns: everything kept in memory reaches the file
    deadline = time.monotonic() + 30
    runs: list = []
    while time.monotonic() < deadline:
        code, body = await a.api("GET", "/v1/runs?limit=10")
        runs = body.get("runs", []) if code == 200 else []
        kinds = [e["kind"] for e in (await a.api("GET", "/v1/events?since=0&limit=1000"))[1].get("events", [])]
        if any(r["id"] == run2 for r in runs) and "serving.log_writable" in kinds:
            break
        await asyncio.sleep(0.5)
    assert [r["id"] for r in runs if r["id"] in (run1, run2)] == [run2, run1], runs
    new = next(r for r in runs if r["id"] == run2)
    assert new["pid"] == pid2 and new["profile"] == "v4-tp8" and new["ended_ms"] is None
    code, body = await a.api("GET", "/v1/events?since=0&limit=1000")
    by_kind = {}
    for e in body["events"]:
        by_kind.setdefault(e["kind"], []).append(e)
    assert not any(e["run_id"] == run2 for e in by_kind.get("serving.crash", []))
    assert any(e["run_id"] == run2 for e in by_kind["serving.log_unwritable"])
    assert any(e["run_id"] == run2 for e in by_kind["serving.log_writable"])
    assert any(e["run_id"] == run2 for e in by_kind["serving.ready"])
    assert (await a.status())["serving"]["log_problem"] is None
    assert a.stop() == 0
    with contextlib.suppress(ProcessLookupError):
        for pid in sim_processes(tmp_path / "sim-state"):
            os.kill(pid, signal.SIGKILL)
