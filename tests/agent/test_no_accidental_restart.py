"""Audit of paths that could stop or restart a healthy, ready vLLM without an operator asking.

Each test here failed against the code before its fix (see the commit that added it).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest

from lynxtop.agent import procs

wait_for = db_rows = None  # bound from the `h` fixture (tests import only lynxtop.*)


@pytest.fixture(autouse=True)
def _helpers(h):
    global wait_for, db_rows
    wait_for, db_rows = h.wait_for, h.db_rows


def events(store, kind_prefix: str) -> list[dict]:
    store.flush()
    return [e for e in db_rows(store.path, "SELECT * FROM events ORDER BY id") if e["kind"].startswith(kind_prefix)]


async def start_ready(sup, profile="alpha"):
    await sup.start(profile, by="uid 0 (root) pid 1")
    await wait_for(lambda: sup.state == "ready" and sup.action is None, 15, what="ready")


async def test_adopted_ready_server_survives_a_slow_first_health(make_sup, store):
    """Agent restart while serving: the server got ready an hour ago, far past its 20 s readiness timeout.
    Its first /health after the adoption does not answer (busy server): that must not count as a readiness
    timeout and kill it."""
    a = make_sup()
    await start_ready(a)
    pid = a.proc.pid
    await a.shutdown(stop_serving=False)
    rec = json.loads(a.state_path.read_text())
    hour_ago = int(time.time() * 1000) - 3600_000
    rec["started_ms"], rec["ready_ms"] = hour_ago, hour_ago + 600_000
    a.state_path.write_text(json.dumps(rec))
    os.kill(pid, signal.SIGSTOP)  # /health hangs until the client gives up (3 s)
    try:
        b = make_sup()
        assert await b.adopt_previous()
        deadline = time.monotonic() + 3.6
        while time.monotonic() < deadline:
            assert b.state == "starting", (b.state, b.reason)
            await asyncio.sleep(0.1)
    finally:
        os.kill(pid, signal.SIGCONT)
    await wait_for(lambda: b.state == "ready", 10, what="adopted server ready again")
    assert procs.alive(pid) and b.proc.pid == pid
    assert not events(store, "serving.readiness_timeout")
    await b.shutdown(stop_serving=True)
