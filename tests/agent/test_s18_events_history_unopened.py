"""`GET /v1/events` while the history database cannot be opened at all (session 18).

An agent started on a full disk runs with its store writer unopened (store/writer.py: `_start_unopened`) and keeps
its events in memory: `store.write_failed` among them, the one that says why there is no history. The route read
the database first and, unable to open it, answered 503 `store`: the held events were hidden exactly while they
were the only account of the outage. Now it answers 200 with the held events (marked pending) and
`history_error` saying why the history cannot be read; `lynxtop events` prints them and says so. A real agent
process, its real socket, a real 20 MB tmpfs (root only) filled to the last byte, the real `lynxtop events`.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.agent_proc import Agent, e2e_config
from support.small_fs import fill, mounted


@pytest.fixture
def small_fs(tmp_path):
    """A 20m tmpfs (support/small_fs.py)."""
    with mounted(tmp_path / "small", "20m") as mnt:
        yield mnt


async def _events(a: Agent) -> tuple[int, dict]:
    return await a.api("GET", "/v1/events?limit=10000")


def _kinds(body: dict) -> list[tuple[str, bool]]:
    return [(e["kind"], e.get("pending", False)) for e in body.get("events", [])]


@pytest.mark.timeout(200)
async def test_events_answer_held_events_and_why_while_the_history_cannot_be_opened(tmp_path, small_fs, cleanup):
    db = small_fs / "lynxtop.db"
    cfg = e2e_config(tmp_path, autostart=False, extra_agent="min_free_mb = 0")
    cfg.write_text(cfg.read_text().replace(str(tmp_path / "state" / "lynxtop.db"), str(db)))
    first = Agent(tmp_path, cfg)
    cleanup.append(first)
    await first.wait_state(lambda s: True, what="up")
    assert first.stop() == 0  # a clean stop: the last close removes -wal/-shm, which a full disk cannot remake
    assert not Path(f"{db}-shm").exists()
    filler = fill(small_fs)

    a = Agent(tmp_path, cfg, name="agent2")
    cleanup.append(a)
    await a.wait_state(lambda s: True, what="up on a full disk")
    st = await a.status()
    assert "history unavailable" in (st["agent"]["store"]["last_error"] or ""), st["agent"]["store"]  # unopened

    deadline = time.monotonic() + 60  # the writer's first failed try is told a moment after the agent is up
    while True:
        code, body = await _events(a)
        assert code == 200, body
        if any(e["kind"] == "store.write_failed" for e in body["events"]) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    why = body.get("history_error") or ""
    assert "history unavailable" in why and str(db) in why, body
    failed = [e for e in body["events"] if e["kind"] == "store.write_failed"]
    assert failed and all(e["pending"] is True and e["id"] is None for e in failed), _kinds(body)
    assert "no space left" in failed[0]["message"], failed[0]
    assert all(e.get("pending") for e in body["events"]), _kinds(body)  # nothing stored is readable now
    code, newest = await a.api("GET", "/v1/events?limit=1")
    assert code == 200 and len(newest["events"]) == 1 and newest["history_error"] == why, newest

    out = subprocess.run([sys.executable, "-m", "lynxtop", "events", "--socket", a.sock_path],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    line = next((x for x in out.stdout.splitlines() if "store.write_failed" in x), "")
    assert "[pending]" in line, out.stdout + out.stderr
    assert "history unavailable" in out.stderr and "cannot be read" in out.stderr, out.stderr

    filler.unlink()  # space returns: the database opens, the held events are written, nothing is pending
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        code, body = await _events(a)
        if code == 200 and body["history_error"] is None and not any(e.get("pending") for e in body["events"]) \
                and any(e["kind"] == "store.write_failed" for e in body["events"]):
            break
        await asyncio.sleep(0.5)
    else:
        raise AssertionError(f"{code} {body.get('history_error')} {_kinds(body)}\n{a.output()[-1500:]}")
    failed = [e for e in body["events"] if e["kind"] == "store.write_failed"]
    assert [e["id"] is not None for e in failed] == [True] * len(failed), failed  # each once, from the database
    assert a.stop() == 0
