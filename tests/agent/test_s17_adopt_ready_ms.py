"""An adopted ready model whose serving.json lacks `ready_ms` (its save at READY failed: a full disk).

A restarted agent used to adopt it as a load whose readiness deadline (counted from the process's start) ran out
long ago, and the first `GET /health` without a 200 within 3 s stopped a model that had served for hours. Now:
the run's row in the history gives `ready_ms` back (adopted as ready), and without it the run gets the health
failure allowance (`health_fail_threshold` failed probes in a row) before it is judged not ready.
A SIGSTOP of the API server stands in for a busy one (the probe gets no answer).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest
from support.agent_config import sim_profile, write_agent_config
from support.agent_proc import Agent, reap_sims

from lynxtop.agent.serving import procs


async def _ready_then_restart(tmp_path: Path, row_ready_ms: bool, paused_s: float) -> tuple[Agent, Agent, int, int]:
    """Agent A loads a model to READY and ends (live restore); the record loses `ready_ms` (and the row too unless
    `row_ready_ms`), the server is paused for `paused_s`, and agent B adopts it. (a, b, pid, ready_ms of A)."""
    db = tmp_path / "state" / "lynxtop.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    prof = sim_profile("v4", startup_s=2, readiness_timeout_s=6, sim_args=("--sim-log-interval", "1"))
    cfg = write_agent_config(tmp_path / "config.toml", db, tmp_path / "run" / "agent.sock", fake_nvml="sim",
                             sample_interval_s=0.2, default_profile="v4", autostart=True, profiles=[prof])
    a = Agent(tmp_path, cfg)
    st = await a.wait_state(lambda s: s["state"] == "ready", timeout=20, what="ready")
    pid, run_id = st["serving"]["pid"], st["serving"]["run_id"]
    await asyncio.sleep(7)  # older than its readiness timeout, as after hours of serving
    assert a.stop() == 0  # live_restore: the model keeps serving
    record = db.parent / "serving.json"
    data = json.loads(record.read_text())
    ready_ms = data.pop("ready_ms")
    assert ready_ms is not None
    record.write_text(json.dumps(data))  # the save at READY that failed on a full disk
    conn = sqlite3.connect(db)
    try:
        row = conn.execute("SELECT ready_ms FROM runs WHERE id = ?", (run_id,)).fetchone()
        assert row == (ready_ms,), row
        if not row_ready_ms:  # the history's update was lost too (the same full disk)
            conn.execute("UPDATE runs SET ready_ms = NULL WHERE id = ?", (run_id,))
            conn.commit()
    finally:
        conn.close()
    os.kill(pid, signal.SIGSTOP)  # a busy API server: GET /health gets no answer within 3 s
    b = Agent(tmp_path, cfg, name="agent2")
    await asyncio.sleep(paused_s)
    os.kill(pid, signal.SIGCONT)
    return a, b, pid, ready_ms


async def _serving_after(b: Agent, pid: int, timeout: float = 25) -> dict:
    deadline = time.monotonic() + timeout
    st: dict = {}
    while time.monotonic() < deadline:
        try:
            st = await b.status()
        except Exception:  # noqa: BLE001 - not listening yet
            await asyncio.sleep(0.5)
            continue
        if st["serving"]["state"] == "ready" or not procs.alive(pid):
            break
        await asyncio.sleep(0.5)
    return st.get("serving", {})


def _cleanup(tmp_path: Path, agents: tuple[Agent | None, ...], pid: int | None) -> None:
    if pid is not None:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    for ag in agents:
        if ag is not None and ag.proc.poll() is None:
            ag.proc.kill()
            ag.proc.wait(5)
    reap_sims(tmp_path / "sim-state")


@pytest.mark.timeout(150)
async def test_record_without_ready_ms_takes_it_from_the_runs_row(tmp_path):
    """Paused longer than the failure allowance (3 probes of 3 s): only an adoption as ready survives it."""
    a = b = pid = None
    try:
        a, b, pid, ready_ms = await _ready_then_restart(tmp_path, row_ready_ms=True, paused_s=16)
        srv = await _serving_after(b, pid)
        assert procs.alive(pid), f"the adopter stopped a model that had been ready: {srv.get('reason')}"
        assert srv["state"] == "ready" and srv["pid"] == pid, srv
        record = json.loads((tmp_path / "state" / "serving.json").read_text())
        assert record.get("ready_ms") == ready_ms, record  # adopted as ready: the record is whole again
    finally:
        _cleanup(tmp_path, (a, b), pid)


@pytest.mark.timeout(150)
async def test_adopted_past_its_deadline_survives_one_slow_health_probe(tmp_path):
    """Neither the record nor the row has `ready_ms`: one probe without an answer does not stop it."""
    a = b = pid = None
    try:
        a, b, pid, _ = await _ready_then_restart(tmp_path, row_ready_ms=False, paused_s=5)
        srv = await _serving_after(b, pid)
        assert procs.alive(pid), f"the adopter stopped a model that had been ready: {srv.get('reason')}"
        assert srv["state"] == "ready" and srv["pid"] == pid, srv
    finally:
        _cleanup(tmp_path, (a, b), pid)
