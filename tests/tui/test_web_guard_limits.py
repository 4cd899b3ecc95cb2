"""`lynxtop dashboard --web`: the listener's bounds (cli/web.py).

- at most MAX_SESSIONS dashboards at once (each websocket is a process): one more is closed with a reason (1013),
  the page says so, and a closed tab frees its slot (its process ends);
- the terminal size a client asks for (the websocket's query, its resize messages) is clamped, a non-number refused;
- a request whose headers never finish is closed after WEB_REQUEST_TIMEOUT_S, and idle connections are capped.

The bounds of the server itself run against the stand-in app; the listener's timeouts against the real `lynxtop
dashboard --web` process.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import aiohttp
import psutil
import pytest
from support.ports import free_port
from support.web_app import web_dashboard

from lynxtop.cli import web

pytestmark = pytest.mark.timeout(120)

SESSIONS = 4  # cli/web.py MAX_SESSIONS (checked below)
COLUMNS, ROWS = 500, 200  # cli/web.py MAX_COLUMNS, MAX_ROWS
TIMEOUT_S, CONNECTIONS = 10.0, 32  # cli/web.py WEB_REQUEST_TIMEOUT_S, WEB_MAX_CONNECTIONS

# records its environment's size, then every packet the server writes to its stdin (textual-serve's framing:
# a type byte, a 4-byte length, the payload), one JSON line each
APP = r"""
import json, os, sys
d = sys.argv[1]
out = open(f"{d}/{os.getpid()}.json", "w")
out.write(json.dumps({"COLUMNS": os.environ.get("COLUMNS"), "ROWS": os.environ.get("ROWS")}) + "\n"); out.flush()
sys.stdout.write("__GANGLION__\n"); sys.stdout.flush()
inp = sys.stdin.buffer
while True:
    head = inp.read(5)
    if len(head) < 5:
        break
    payload = inp.read(int.from_bytes(head[1:], "big"))
    if head[:1] == b"M":
        meta = json.loads(payload)
        out.write(json.dumps(meta) + "\n"); out.flush()
        if meta.get("type") == "quit":
            break
"""


def serving(tmp_path: Path) -> AbstractAsyncContextManager[int]:
    """The real server (make_server) on a free loopback port, its app the stand-in."""
    return web_dashboard([sys.executable, "-c", APP, str(tmp_path)])


def _apps() -> list[psutil.Process]:
    """The stand-in apps still running; one that exits while it is read is not (CI saw /proc/PID vanish mid-read)."""
    apps = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "__GANGLION__" in " ".join(p.cmdline()):
                apps.append(p)
        except psutil.NoSuchProcess:
            continue
    return apps


async def _until(pred, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (value := pred()) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return value


async def test_at_most_max_sessions_dashboards_and_a_closed_tab_frees_its_slot(tmp_path):
    """The auditors' 40 websockets started 40 processes. Now 4 run; the others are closed at once with 1013 and a
    reason, and the page says why; closing a tab ends its process and the next tab gets one."""
    n = 12
    async with serving(tmp_path) as port, aiohttp.ClientSession() as s:
        url = f"http://127.0.0.1:{port}/ws"
        sockets = [await s.ws_connect(url) for _ in range(n)]
        await _until(lambda: len(list(tmp_path.glob("*.json"))) >= SESSIONS)
        refused = []
        for ws in sockets[SESSIONS:]:
            msg = await ws.receive(timeout=10)
            assert msg.type == aiohttp.WSMsgType.CLOSE, msg
            refused.append((msg.data, msg.extra))
        await asyncio.sleep(1.0)  # any process a refused socket started would have written its file by now
        assert len(list(tmp_path.glob("*.json"))) == SESSIONS
        assert len(_apps()) == SESSIONS
        assert all(code == 1013 and f"{SESSIONS}" in reason and "close" in reason for code, reason in refused), refused
        async with s.get(f"http://127.0.0.1:{port}/") as r:  # a new tab's page says why before it tries
            assert r.status == 503 and f"{SESSIONS}" in await r.text()
        for ws in sockets[:SESSIONS]:
            await ws.close()
        assert await _until(lambda: not _apps(), 20) or not _apps(), [p.pid for p in _apps()]
        # the server frees a slot once it has reaped the tab's process and left its handler: a moment after the
        # process stops counting here (under load a GET at that moment got 503), so the page is waited for
        statuses: list[int] = []
        deadline = time.monotonic() + 30
        while not statuses or statuses[-1] != 200:
            assert time.monotonic() < deadline, f"no slot freed after every tab closed: {statuses[-5:]}"
            if statuses:
                await asyncio.sleep(0.1)
            async with s.get(f"http://127.0.0.1:{port}/") as r:
                statuses.append(r.status)
        assert set(statuses) <= {200, 503}, statuses
        ws = await s.ws_connect(url)
        assert await _until(lambda: len(list(tmp_path.glob("*.json"))) == SESSIONS + 1)
        await ws.close()
        for ws in sockets:
            await ws.close()
    assert web.MAX_SESSIONS == SESSIONS


async def test_the_terminal_size_is_clamped_and_a_non_number_refused(tmp_path):
    """width=height=1000000 reached the app (1500x1500 took 80 MiB and 24 MiB of traffic in 25 s); the query and
    the resize messages are clamped to 500x200; a size that is not a number is refused before any process."""
    async with serving(tmp_path) as port, aiohttp.ClientSession() as s:
        for query in ("width=abc&height=24", "width=80&height=1e9", "width=-5&height=24", "width=٣&height=24"):
            with pytest.raises(aiohttp.WSServerHandshakeError) as exc:
                await s.ws_connect(f"http://127.0.0.1:{port}/ws?{query}")
            assert exc.value.status == 400, query
        assert not list(tmp_path.glob("*.json"))
        ws = await s.ws_connect(f"http://127.0.0.1:{port}/ws?width=1000000&height=1000000")
        first = await _until(lambda: list(tmp_path.glob("*.json")))
        await ws.send_json(["resize", {"width": 10**9, "height": 10**9}])
        await ws.send_json(["resize", {"width": 0, "height": -3}])
        await ws.send_json(["resize", {"width": "wide", "height": None}])
        await ws.send_json(["resize", {"width": 132, "height": 43}])
        path = first[0]
        await _until(lambda: path.read_text().count("resize") >= 3, 10)
        await ws.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0] == {"COLUMNS": str(COLUMNS), "ROWS": str(ROWS)}
    sizes = [(m["width"], m["height"]) for m in lines[1:] if m.get("type") == "resize"]
    assert sizes == [(COLUMNS, ROWS), (1, 1), (132, 43)], sizes  # the non-numbers are dropped
    assert (web.MAX_COLUMNS, web.MAX_ROWS) == (COLUMNS, ROWS)


def _lynxtop_web(tmp_path: Path, port: int) -> subprocess.Popen:
    cfg = tmp_path / "config.toml"
    cfg.write_text("")
    return subprocess.Popen([sys.executable, "-m", "lynxtop", "dashboard", "--config", str(cfg), "--socket",
                             str(tmp_path / "no-agent.sock"), "--database", str(tmp_path / "none.db"),
                             "--web", f"127.0.0.1:{port}"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _established(pid: int, port: int) -> int:
    return sum(1 for c in psutil.Process(pid).net_connections("tcp")
               if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED)


@pytest.mark.timeout(150)
async def test_the_listener_times_out_half_sent_requests_and_caps_connections(tmp_path):
    """A request whose headers never finish was held 40 s+; now it is closed after WEB_REQUEST_TIMEOUT_S (10 s,
    as the agent's listeners). 3x the connection cap of idle connections hold at most the cap, and a real request
    still gets its page (the idle ones give way)."""
    port = free_port()
    proc = _lynxtop_web(tmp_path, port)
    idle: list[socket.socket] = []
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        assert f"127.0.0.1:{port}" in line, line + (proc.stderr.read() if proc.poll() is not None else "")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        await writer.drain()
        t0 = time.monotonic()
        try:
            data = await asyncio.wait_for(reader.read(1000), 30)
        except TimeoutError:
            data = None
        held = time.monotonic() - t0
        writer.close()
        assert data is not None, "a half-sent request was held 30 s"
        assert held < TIMEOUT_S + 3, held
        cap = CONNECTIONS
        for _ in range(3 * cap):
            c = socket.create_connection(("127.0.0.1", port), timeout=5)
            idle.append(c)
        await asyncio.sleep(1.5)  # past the guard's grace: idle connections may give way to new ones
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/") as r:
            assert r.status == 200
        held_open = _established(proc.pid, port)
        assert held_open <= cap, f"{held_open} connections held for a cap of {cap}"
    finally:
        for c in idle:
            c.close()
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert "Traceback" not in err, err
    assert (web.WEB_REQUEST_TIMEOUT_S, web.WEB_MAX_CONNECTIONS) == (TIMEOUT_S, CONNECTIONS)
