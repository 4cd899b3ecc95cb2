"""`lynxtop dashboard --web`: only the page's own origin reaches the dashboard (cli/web.py).

A web page the operator visits can reach the loopback port through an `ssh -L` tunnel: browsers apply no CORS to
websockets, and a DNS-rebound name arrives as `Host: evil.example:PORT`. So a request whose Host is not a loopback
name (or the configured one) is refused, as is a websocket whose Origin is not the page's own; with --web-control
the page and its websocket also need the random token printed on the terminal. Each refusal is made before any
dashboard process starts.

The served app is a stand-in argv (a tiny Python that records its start and waits) started by the real server,
except in the --web-control test, which runs the real `lynxtop dashboard --web` against the FAKE agent.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import aiohttp
import pytest
from support.ports import free_port
from support.web_app import web_dashboard
from tui_fake_agent import FakeAgent

pytestmark = pytest.mark.timeout(120)

# records its start (one file per process), says it is a Textual app, and waits for the server to end it
APP = ("import os, sys, time; open(f'{sys.argv[1]}/{os.getpid()}.started', 'w').close(); "
       "sys.stdout.write('__GANGLION__\\n'); sys.stdout.flush(); time.sleep(60)")


def serving(tmp_path: Path) -> AbstractAsyncContextManager[int]:
    """The real server (make_server) on a free loopback port, its app the stand-in."""
    return web_dashboard([sys.executable, "-c", APP, str(tmp_path)])


def started(tmp_path: Path) -> int:
    return len(list(tmp_path.glob("*.started")))


async def wait_started(tmp_path: Path, n: int, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while started(tmp_path) < n and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return started(tmp_path)


async def refused_ws(session: aiohttp.ClientSession, url: str, **kw) -> int:
    """The HTTP status a websocket handshake was refused with (fails if it was accepted)."""
    try:
        ws = await session.ws_connect(url, **kw)
    except aiohttp.WSServerHandshakeError as exc:
        return exc.status
    await ws.close()
    raise AssertionError(f"websocket {url} {kw} was accepted")


async def test_a_foreign_host_is_refused_and_never_reflected_into_the_page(tmp_path):
    """DNS rebinding: evil.example resolved to 127.0.0.1 sends `Host: evil.example:PORT`. Refused (403) on the page
    and the websocket, and no dashboard starts. The names a browser uses for a loopback port (a tunnel's local port
    may differ from the served one) are served."""
    async with serving(tmp_path) as port, aiohttp.ClientSession() as s:
        for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}", f"10.0.0.7:{port}",
                     f"localhost.evil:{port}", ""):
            async with s.get(f"http://127.0.0.1:{port}/", headers={"Host": host}) as r:
                body = await r.text()
                assert r.status == 403, (host, r.status)
                assert "ws://" not in body and "Host" in body, body  # says why, reflects nothing
        assert await refused_ws(s, f"http://127.0.0.1:{port}/ws", headers={"Host": f"evil.example:{port}"}) == 403
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "localhost:9000", f"LOCALHOST:{port}",
                     f"localhost.:{port}"):
            async with s.get(f"http://127.0.0.1:{port}/", headers={"Host": host}) as r:
                assert r.status == 200, (host, r.status)
                assert f'data-session-websocket-url="ws://{host}/ws"' in await r.text()
    assert started(tmp_path) == 0


async def test_a_cross_origin_websocket_starts_no_dashboard(tmp_path):
    """A page of another origin (another site, another local port, a sandboxed frame) opens no session; nor does a
    browser-like request with no Origin. The page's own origin and a non-browser client (no Origin) do."""
    async with serving(tmp_path) as port, aiohttp.ClientSession() as s:
        url = f"http://127.0.0.1:{port}/ws"
        for origin in ("https://evil.example", f"http://evil.example:{port}", f"http://localhost:{port}",
                       f"http://127.0.0.1:{port + 1}", "null", f"file://127.0.0.1:{port}", "http://127.0.0.1"):
            assert await refused_ws(s, url, origin=origin) == 403, origin
        browser_like = {"User-Agent": "Mozilla/5.0 (X11; Linux x86_64) Chrome/120.0", "Sec-Fetch-Mode": "websocket"}
        assert await refused_ws(s, url, headers=browser_like) == 403
        assert started(tmp_path) == 0
        ws = await s.ws_connect(url, origin=f"http://127.0.0.1:{port}")  # the page's own origin
        assert await wait_started(tmp_path, 1) == 1
        await ws.close()
        ws = await s.ws_connect(url, origin="http://localhost:9000", headers={"Host": "localhost:9000"})  # tunnel
        assert await wait_started(tmp_path, 2) == 2
        await ws.close()
        ws = await s.ws_connect(url)  # a script's client: no Origin, not a browser
        assert await wait_started(tmp_path, 3) == 3
        await ws.close()


def _lynxtop_web(agent: FakeAgent, tmp_path: Path, port: int, *extra: str) -> subprocess.Popen:
    cfg = tmp_path / "config.toml"
    cfg.write_text("")
    return subprocess.Popen([sys.executable, "-m", "lynxtop", "dashboard", "--config", str(cfg), "--socket",
                             str(agent.socket_path), "--database", str(tmp_path / "none.db"),
                             "--web", f"127.0.0.1:{port}", *extra],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def _drain(ws: aiohttp.ClientWebSocketResponse, seconds: float) -> int:
    frames = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            msg = await asyncio.wait_for(ws.receive(), 0.2)
        except TimeoutError:
            continue
        if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
            break
        frames += 1
    return frames


@pytest.mark.timeout(150)
async def test_web_control_needs_the_token_printed_on_the_terminal(tmp_path, sock_dir):
    """With --web-control the page address printed on the terminal holds a random token; the page and its
    websocket need it, so a cross-site page (which cannot read the terminal) drives nothing: the auditors' X, Tab,
    Enter that stopped serving reach no dashboard. With the token, from the page's origin, the controls work."""
    agent = FakeAgent(sock_dir / "agent.sock").start()
    port = free_port()
    proc = _lynxtop_web(agent, tmp_path, port, "--web-control")
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        m = re.search(rf"http://127\.0\.0\.1:{port}/\?token=([A-Za-z0-9_-]{{20,}})", line)
        assert m, line + (proc.stderr.read() if proc.poll() is not None else "")
        token = m.group(1)
        base = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as s:
            for query in ("", "?token=", "?token=" + token[:-1] + ("A" if token[-1] != "A" else "B")):
                async with s.get(f"{base}/{query}") as r:
                    assert r.status == 403, (query, r.status)
                    assert "token" in await r.text()
            async with s.get(f"{base}/?token={token}") as r:
                assert r.status == 200
                page = await r.text()
            ws_url = re.search(r'data-session-websocket-url="([^"]+)"', page).group(1)
            assert token in ws_url and ws_url.startswith(f"ws://127.0.0.1:{port}/")
            # the auditors' attack: a cross-site page's websocket, no token, then X, Tab, Enter
            assert await refused_ws(s, f"{base}/ws?width=120&height=40", origin="https://evil.example") == 403
            assert await refused_ws(s, f"{base}/ws?width=120&height=40", origin=base) == 403  # no token
            assert await refused_ws(s, f"{base}/ws/{'x' * len(token)}?width=120&height=40", origin=base) in (403, 404)
            assert await refused_ws(s, f"{ws_url}?width=120&height=40", origin="https://evil.example") == 403
            assert not agent.posts()
            # the operator's own tab: the token's page, its origin
            async with s.ws_connect(f"{ws_url}?width=120&height=40", origin=base) as ws:
                assert await _drain(ws, 12) > 0  # the dashboard starts and draws
                for data in ("X", "\t", "\r"):
                    await ws.send_json(["stdin", data])
                    await _drain(ws, 2)
                end = time.monotonic() + 15
                while not agent.posts() and time.monotonic() < end:
                    await _drain(ws, 0.5)
        assert [path for path, _ in agent.posts()] == ["/v1/stop"]
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        agent.stop()
    assert token not in err  # printed once, on stdout, and nowhere else
    assert "Traceback" not in err


@pytest.mark.timeout(150)
async def test_the_read_only_default_needs_no_token(tmp_path, sock_dir):
    """Read-only (no --web-control) stays usable from the plain address: no token is printed or asked for."""
    agent = FakeAgent(sock_dir / "agent.sock").start()
    port = free_port()
    proc = _lynxtop_web(agent, tmp_path, port)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        assert f"http://127.0.0.1:{port}" in line and "token" not in line, line
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{port}/") as r:
                assert r.status == 200
            async with s.ws_connect(f"ws://127.0.0.1:{port}/ws?width=100&height=30",
                                    origin=f"http://127.0.0.1:{port}") as ws:
                assert await _drain(ws, 10) > 0
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        agent.stop()
