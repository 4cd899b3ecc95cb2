"""Events held in memory while the history cannot be written are served (session 17).

While the database's disk is full the writer keeps events in memory until writes resume; `GET /v1/events` read only
the database, so `store.write_failed` (and everything else of the outage) was invisible over the socket exactly
when the operator needed it. Now the held events are answered too, marked `"pending": true`, and once space
returns each is listed once, from the database. A real agent process, its real socket, a real 20 MB tmpfs (root
only) filled to the last byte, and the real `lynxtop events` command.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
from support.agent_proc import Agent, e2e_config
from support.small_fs import fill, mounted


@pytest.fixture
def small_fs(tmp_path):
    """A 20m tmpfs (support/small_fs.py)."""
    with mounted(tmp_path / "small", "20m") as mnt:
        yield mnt


async def _events(a: Agent, query: str = "since=0&limit=10000") -> list[dict]:
    code, body = await a.api("GET", f"/v1/events?{query}")
    assert code == 200, body
    return body["events"]


async def _until(a: Agent, pred, timeout: float, what: str) -> list[dict]:
    deadline = time.monotonic() + timeout
    events: list[dict] = []
    while time.monotonic() < deadline:
        events = await _events(a)
        if pred(events):
            return events
        await asyncio.sleep(0.3)
    raise AssertionError(f"{what}: {[(e['kind'], e.get('pending')) for e in events]}")


def _of(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["kind"] == kind]


@pytest.mark.timeout(150)
async def test_events_held_during_a_full_disk_are_served_pending_then_once_stored(tmp_path, small_fs, cleanup):
    db = small_fs / "lynxtop.db"
    # min_free_mb = 0: the free-space preflight must not hold the start on a small disk
    cfg = e2e_config(tmp_path, autostart=False, extra_agent="min_free_mb = 0")
    cfg.write_text(cfg.read_text().replace(str(tmp_path / "state" / "lynxtop.db"), str(db)))
    a = Agent(tmp_path, cfg)
    cleanup.append(a)
    await a.wait_state(lambda s: True, what="up")
    await _until(a, lambda ev: _of(ev, "agent.started"), 20, "agent.started stored")
    before = int(time.time() * 1000)
    filler = fill(small_fs)

    # the ticks hit the full disk: store.write_failed is held in memory, and served marked pending
    events = await _until(a, lambda ev: _of(ev, "store.write_failed"), 30, "store.write_failed served")
    failed = _of(events, "store.write_failed")
    assert len(failed) == 1 and failed[0]["pending"] is True and failed[0]["id"] is None, failed
    assert failed[0]["ts_ms"] >= before
    assert all("pending" not in e for e in _of(events, "agent.started")), events  # the stored ones: as before
    assert [e["ts_ms"] for e in events] == sorted(e["ts_ms"] for e in events)  # merged in time order
    # the route's own filters and limit apply to the held ones too
    assert _of(await _events(a, f"since={before}"), "store.write_failed")
    assert not _of(await _events(a, f"since={failed[0]['ts_ms'] + 3_600_000}"), "store.write_failed")
    newest = await _events(a, "limit=1")
    assert len(newest) == 1 and newest[0]["ts_ms"] >= failed[0]["ts_ms"], newest

    # `lynxtop events` (through the socket) marks it
    out = subprocess.run([sys.executable, "-m", "lynxtop", "events", "--socket", a.sock_path],
                         capture_output=True, text=True, timeout=60)
    line = next((x for x in out.stdout.splitlines() if "store.write_failed" in x), "")
    assert "[pending]" in line, out.stdout + out.stderr
    assert "[pending]" not in next(x for x in out.stdout.splitlines() if "agent.started" in x)

    filler.unlink()  # space returns: the held events are written, and listed once, from the database
    events = await _until(a, lambda ev: _of(ev, "store.writes_resumed") and not any(e.get("pending") for e in ev),
                          30, "writes resumed and nothing pending")
    failed = _of(events, "store.write_failed")
    assert len(failed) == 1 and "pending" not in failed[0] and failed[0]["id"] is not None, failed
    assert a.stop() == 0
