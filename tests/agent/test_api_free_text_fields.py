"""A free-text field of a request (ray/stop's `reason`) is served in every status and written to the events and the
log: 60,000 characters, terminal escapes, a forged log line or a lone surrogate are refused with a 400 (all were
taken, 202). And an event whose message holds a lone surrogate (a foreign process's title) is stored, escaped,
not dropped with the store's error set."""

from __future__ import annotations

import sqlite3

import aiohttp
import pytest

from lynxtop.agent.api.routes import ApiServer
from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.contract.records import ProfileInfo, ProfileList

pytestmark = pytest.mark.timeout(60)


class Ctl:
    def __init__(self):
        self.reasons = []

    def profiles(self):
        return ProfileList("tp8", (ProfileInfo("tp8", "", ["vllm"]),))

    async def ray_stop(self, by, reason):
        self.reasons.append(reason)
        return "stopping Ray on this node"


@pytest.fixture
async def post(sock_dir):
    ctl = Ctl()
    server = ApiServer(ctl, sock_dir / "agent.sock", group="users", log=lambda m: None)
    await server.start()
    session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sock_dir / "agent.sock")))

    async def call(raw: bytes):
        async with session.post("http://agent/v1/ray/stop", data=raw,
                                headers={"Content-Type": "application/json"}) as r:
            return r.status, await r.json(content_type=None)

    yield call, ctl
    await session.close()
    await server.stop()


@pytest.mark.parametrize("raw", [
    b'{"reason": "maintenance \\ud800"}',  # lone surrogate: valid JSON, not encodable text
    b'{"reason": "' + b"x" * 60_000 + b'"}',  # no length cap
    b'{"reason": "ok\\n2025-01-01 accepted: uid 0 (root) asked restart\\u001b[2J"}',  # forged log line + escape
], ids=["lone_surrogate", "60k_chars", "newline_escape"])
async def test_ray_stop_reason_is_checked(post, raw):
    call, ctl = post
    code, body = await call(raw)
    assert code == 400, (code, body, [r[:80] for r in ctl.reasons])
    assert ctl.reasons == []


def test_an_event_message_with_a_lone_surrogate_is_stored_escaped(tmp_path):
    from lynxtop.store.writer import StoreWriter

    w = StoreWriter(tmp_path / "x.db")
    w.start()
    try:
        w.record(Event(EventKind.ACTION_STOP, Severity.INFO, "stop of Ray requested by uid 0 (root) pid 1: \ud800"))
        w.flush(5)
        stats = w.stats()
    finally:
        w.close()
    n = sqlite3.connect(tmp_path / "x.db").execute("SELECT count(*) FROM events WHERE kind='action.stop'").fetchone()
    assert n[0] == 1, stats["last_error"]
