"""What a refused connection costs the event loop: benchmarks/slowloris.py's flood is ~2,500 connections a second
refused, and an operator's `lynxtop status` waits in the kernel's accept queue behind all those queued before it,
so its p99 is the queue times the cost of one refusal (issue 27). The cost is counted as Python-level work (calls
and lines run per refusal), never timed."""

from __future__ import annotations

import asyncio
import socket
import sys

import pytest
from agent_io_helpers import FakeController

from lynxtop.agent.api import connguard
from lynxtop.agent.api.routes import ApiServer

pytestmark = pytest.mark.timeout(60)


async def test_a_refusal_builds_no_socket_wrapper_and_no_text(sock_dir, monkeypatch):
    monkeypatch.setattr(connguard, "REFUSAL_TEXTS_PER_S", 0)  # the few 503 texts a second are not counted here
    server = ApiServer(FakeController(), sock_dir / "agent.sock", group="users", log=lambda _: None,
                       max_connections=8, request_timeout_s=30)
    await server.start()
    site = server._site
    site._texts_left = 0
    lsock = site.sockets[0]
    loop = asyncio.get_running_loop()
    loop.remove_reader(lsock.fileno())  # the test takes the queue itself, batch by batch
    flood: list[socket.socket] = []
    calls: list[str] = []
    lines = 0

    def profile(frame, event, _arg):
        nonlocal lines
        if event == "call":
            calls.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")
        elif event == "line":
            lines += 1
        return profile

    try:
        for _ in range(300):  # one process over its share (2 of 8): queued before any is taken
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            flood.append(s)
            s.connect(str(sock_dir / "agent.sock"))
        site._accept(lsock)  # the first batch admits the client's share; every later one is refused
        assert server.guard.accepted == server.guard.per_client
        refused0, batches = server.guard.refused, 0
        while server.guard.refused - refused0 < 250:
            accepted = server.guard.accepted
            sys.settrace(profile)
            try:
                site._accept(lsock)
            finally:
                sys.settrace(None)
            assert server.guard.accepted == accepted, "evicted"  # within the grace second: refused, none evicted
            batches += 1
        refused = server.guard.refused - refused0
        assert refused >= 250
        # the socket module's Python wrapper (its __init__, close, _real_close) is not built for a refusal
        assert not [c for c in calls if c.startswith(socket.__file__)], calls[:20]
        # the peer's key, admit, _refuse, the episode's count, the refusal-text rate: 5 calls and ~37 lines a
        # refusal; were 8 and ~49 with the wrapper, and a reason and a message formatted per refusal
        assert len(calls) / refused <= 5.5, sorted(set(calls))
        assert lines / refused <= 44, lines / refused
    finally:
        sys.settrace(None)
        for s in flood:
            s.close()
        await server.stop()
