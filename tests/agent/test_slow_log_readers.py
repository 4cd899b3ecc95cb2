"""50 clients open `GET /v1/logs` on a real agent and never read: the agent stays small (issue 24.5).

Before, each answer was built whole and held until read (about 20 MB for a 4 MB tail), busy and so never
timed out: 50 such readers took the agent from 54 MB to 1.9 GB, never released.
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import aiohttp
import pytest
from support.agent_proc import Agent, e2e_config
from support.ports import free_port

pytestmark = pytest.mark.timeout(120)

READERS = 50
RSS_LIMIT = 150 * 2**20
TIMEOUT_S = 2  # [agent] request_timeout_s: a reader that takes nothing for this long is dropped


def peak_rss(pid: int) -> int:
    """The process's peak resident size (VmHWM): a transient spike between two looks counts too."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def stalled_reader(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(path)
    s.sendall(b"GET /v1/logs?lines=5000 HTTP/1.1\r\nHost: agent\r\n\r\n")
    return s


def ended(s: socket.socket) -> bool:
    """Read what the kernel holds for this client; True once the agent has closed or reset it."""
    s.setblocking(False)
    try:
        while True:
            if not s.recv(1 << 20):
                return True
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


async def test_fifty_stalled_log_readers_keep_the_agent_small(tmp_path, cleanup):
    port = free_port()
    a = Agent(tmp_path, e2e_config(tmp_path, extra_agent=f"request_timeout_s = {TIMEOUT_S}\n"
                                                     f'metrics_listen = "127.0.0.1:{port}"'), "a1")
    cleanup.append(a)
    await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    code, body = await a.api("GET", "/v1/logs?lines=1")
    assert code == 200
    wanted = [f"{i:05d} " + "x" * 793 for i in range(6000)]  # 4.8 MB: over the 4 MB the tail reads
    with open(body["path"], "a") as f:  # the run's log is opened O_APPEND by the agent too
        f.write("\n".join(wanted) + "\n")
    code, body = await a.api("GET", "/v1/logs?lines=5000")  # a client that reads gets the whole tail
    assert code == 200 and body["lines"] == wanted[-5000:]

    readers = [stalled_reader(a.sock_path) for _ in range(READERS)]
    try:
        deadline = time.monotonic() + 10 * TIMEOUT_S
        dropped = 0
        while time.monotonic() < deadline and dropped < READERS:
            st = await a.status()  # the control socket answers meanwhile
            dropped = st["agent"]["connections"]["api"].get("dropped_slow", 0)
            await asyncio.sleep(0.2)
        peak = peak_rss(a.proc.pid)
        assert peak < RSS_LIMIT, f"agent peak RSS {peak / 2**20:.0f} MB with {READERS} stalled log readers"
        assert dropped == READERS, st["agent"]["connections"]
        open_ = list(readers)
        deadline = time.monotonic() + 10  # the agent closes them on its loop's next turn
        while open_ and time.monotonic() < deadline:
            open_ = [s for s in open_ if not ended(s)]
            await asyncio.sleep(0.1)
        assert not open_, f"{len(open_)} stalled readers never closed by the agent"
    finally:
        for s in readers:
            s.close()
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
        page = await r.text()
    assert 'lynxtop_agent_connections_dropped_slow_total{listener="api"} 50.0' in page
    code, body = await a.api("GET", "/v1/logs?lines=3")
    assert code == 200 and body["lines"] == wanted[-3:]
    assert a.stop() == 0
