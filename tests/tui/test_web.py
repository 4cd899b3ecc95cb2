"""`lynxtop dashboard --web`: the same dashboard in a browser (textual-serve), loopback only, read-only by default,
and no shell between the server and the dashboard it starts.

The browser test is a real stage: `lynxtop dashboard --web 127.0.0.1:PORT` as a process against a FAKE agent on a
real unix socket, loaded in headless Chromium (Debian `chromium`) driven over the DevTools protocol with aiohttp.
It waits until the app's output to the page holds the GPU table, saves a screenshot and checks it is not blank.
Without chromium it skips saying why; under LYNXTOP_REQUIRE_REAL=1 (CI) it fails.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import pwd
import shutil
import signal
import socket
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import aiohttp
import psutil
import pytest
from support.ports import free_port, short_dir
from support.real import needs_tools
from support.waits import wait_for_async

from lynxtop.cli.parser import build_parser
from lynxtop.cli.web import WebUsageError, control_refusal, dashboard_argv, make_server, parse_address

CHROMIUM_HINT = "apt-get install -y -q --no-install-recommends chromium (Debian)"
BROWSER_WAIT_S = 60.0  # a loaded 2-core machine: chromium's start and the dashboard's first frame take seconds
GPU_TABLE_TEXT = ("Tensor", "DRAM bw")  # the GPU table's header, as the app writes it to the page


def _lynxtop(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "lynxtop", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _config(tmp_path: Path) -> Path:
    cfg = tmp_path / "config.toml"
    cfg.write_text("")
    return cfg


# ---------------------------------------------------------------------------------------------- options


@pytest.mark.parametrize("address", ["0.0.0.0:8765", "10.1.2.3:8765", "[::]:8765", "node7:8765"])
def test_web_refuses_an_address_that_is_not_loopback_and_names_web_listen(tmp_path, address):
    port = free_port()
    proc = _lynxtop("dashboard", "--config", str(_config(tmp_path)), "--web", address.replace("8765", str(port)))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert "--web" in err and "loopback" in err and "--web-listen" in err and "Traceback" not in err
    assert out == ""  # nothing was served


def test_web_address_parsing_names_what_is_wrong():
    assert parse_address("127.0.0.1:8765", "--web", loopback_only=True) == ("127.0.0.1", 8765)
    assert parse_address("[::1]:9000", "--web", loopback_only=True) == ("::1", 9000)
    assert parse_address("0.0.0.0:8765", "--web-listen", loopback_only=False) == ("0.0.0.0", 8765)
    for bad, words in (("8765", "HOST:PORT"), ("127.0.0.1:99999", "out of range"), ("127.0.0.1:x", "HOST:PORT")):
        with pytest.raises(WebUsageError, match=words):
            parse_address(bad, "--web", loopback_only=True)


def test_web_control_is_refused_for_a_user_who_may_not_control_the_agent():
    """The socket's own rule, from the invoking user's side: root may; `nobody` (not root, not the agent's user,
    not in its group) may not, and is told why. The check runs in a forked child that became `nobody`."""
    if os.getuid() != 0:
        pytest.skip("needs root to become another user")
    with short_dir() as d, socket.socket(socket.AF_UNIX) as sock:
        os.chmod(d, 0o755)  # under /tmp, which nobody may search
        path = d / "agent.sock"
        sock.bind(str(path))  # owned by root: the agent's user here
        assert control_refusal(path, "lynxtop-no-such-group") is None  # root may
        nobody = pwd.getpwnam("nobody")
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: become nobody, answer through the pipe, leave without pytest's clean-up
            try:
                os.setgroups([])
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)
                os.write(write, (control_refusal(path, "lynxtop-no-such-group") or "ALLOWED").encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read) as answer:
            why = answer.read()
        os.waitpid(pid, 0)
    assert "nobody" in why and "may not control" in why and "lynxtop-no-such-group" in why, why


def test_web_on_a_port_in_use_exits_1_saying_so_and_never_claims_to_serve(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _lynxtop("dashboard", "--config", str(_config(tmp_path)), "--web", f"127.0.0.1:{port}")
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "in use" in err and "Traceback" not in err
    assert "serving" not in out


def test_the_served_dashboard_is_read_only_unless_control_was_granted():
    args = build_parser().parse_args(["dashboard", "--web", "127.0.0.1:8765", "--config", "/etc/l x.toml", "--utc",
                                      "--node-port", "9464"])
    argv = dashboard_argv(args, Path("/run/a.sock"), Path("/var/h.db"), control=False)
    assert argv[:4] == [sys.executable, "-m", "lynxtop", "dashboard"] and argv[-1] == "--readonly"
    for pair in (["--socket", "/run/a.sock"], ["--database", "/var/h.db"], ["--config", "/etc/l x.toml"],
                 ["--node-port", "9464"]):
        i = argv.index(pair[0])
        assert argv[i:i + 2] == pair
    assert "--utc" in argv
    assert "--readonly" not in dashboard_argv(args, Path("/run/a.sock"), Path("/var/h.db"), control=True)


def test_web_control_only_with_web(tmp_path):
    proc = _lynxtop("dashboard", "--config", str(_config(tmp_path)), "--web-control")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "--web-control applies only with --web" in err


# ---------------------------------------------------------------------------------------------- no shell


async def test_the_served_app_is_an_argv_started_without_a_shell(tmp_path):
    """textual-serve would run its command through /bin/sh: an argument holding `; touch FILE` would run. The
    server starts the argv itself: the app gets the argument verbatim and nothing else runs."""
    marker = tmp_path / "shell-ran"
    seen = tmp_path / "argv.json"
    app = ("import json, sys; json.dump(sys.argv[1:], open(sys.argv[1], 'w')); "
           "sys.stdout.write('__GANGLION__\\n'); sys.stdout.flush()")
    argv = [sys.executable, "-c", app, str(seen), f"a b; touch {marker}", "$(touch x)"]
    port = free_port()
    server = make_server(argv, "127.0.0.1", port)
    runner = aiohttp.web.AppRunner(await server._make_app())
    await runner.setup()
    await aiohttp.web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with aiohttp.ClientSession() as session, session.ws_connect(f"http://127.0.0.1:{port}/ws") as ws:
            await wait_for_async(seen.exists, timeout=30, what="the app to start")
            await ws.close()
    finally:
        await runner.cleanup()
    assert json.loads(seen.read_text()) == [str(seen), f"a b; touch {marker}", "$(touch x)"]
    assert not marker.exists()


async def test_the_page_reaches_back_through_the_address_the_browser_used(tmp_path):
    """Over `ssh -L 9000:127.0.0.1:8765` the browser asks localhost:9000: the page's websocket must go there, not to
    the server's own 127.0.0.1:8765 (textual-serve's default), which the laptop cannot reach."""
    port = free_port()
    server = make_server([sys.executable, "-c", "pass"], "127.0.0.1", port)
    runner = aiohttp.web.AppRunner(await server._make_app())
    await runner.setup()
    await aiohttp.web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/", headers={"Host": "localhost:9000"}) as resp:
                page = await resp.text()
            async with session.get(f"http://127.0.0.1:{port}/") as resp:
                direct = await resp.text()
    finally:
        await runner.cleanup()
    assert "ws://localhost:9000/ws" in page and f"127.0.0.1:{port}" not in page
    assert f"ws://127.0.0.1:{port}/ws" in direct


# ---------------------------------------------------------------------------------------------- the browser


class DevTools:
    """One page of headless Chromium over the DevTools protocol (a websocket; aiohttp's client)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse):
        self.ws = ws
        self._id = 0
        self.frames: list[bytes] = []  # what the page's websocket received (the app's output)

    async def call(self, method: str, **params) -> dict:
        self._id += 1
        await self.ws.send_json({"id": self._id, "method": method, "params": params})
        while True:
            msg = await self.ws.receive_json(timeout=BROWSER_WAIT_S)
            if msg.get("method") == "Network.webSocketFrameReceived":
                resp = msg["params"]["response"]
                data = resp["payloadData"]
                self.frames.append(base64.b64decode(data) if resp.get("opcode") == 2 else data.encode())
            elif msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def received_text(self) -> str:
        return b"".join(self.frames).decode("utf-8", "replace")


def png_pixels(png: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit RGB or RGBA PNG: zlib and the five scanline filters."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(png):
        (length,), kind = struct.unpack(">I", png[pos:pos + 4]), png[pos + 4:pos + 8]
        body = png[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6), f"PNG depth {depth} colour type {colour}"
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if kind == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif kind == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prev, strict=True))
        elif kind == 3:
            for i in range(stride):
                line[i] = (line[i] + ((line[i - bpp] if i >= bpp else 0) + prev[i]) // 2) & 0xFF
        elif kind == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b, c = prev[i], prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, rows


def colour_census(png: bytes) -> tuple[int, float]:
    """(distinct colours, share of pixels not of the most common colour, the background)."""
    width, height, rows = png_pixels(png)
    bpp = len(rows[0]) // width
    counts: dict[bytes, int] = {}
    for row in rows:
        for i in range(0, len(row), bpp):
            px = row[i:i + 3]
            counts[px] = counts.get(px, 0) + 1
    total = width * height
    return len(counts), 1 - max(counts.values()) / total


def test_colour_census_reads_a_png_of_known_pixels():
    """The checker itself: a 4x2 RGB image with three colours (background 6 pixels), every filter type used."""
    def png(rows: list[bytes], filters: list[int]) -> bytes:
        def chunk(kind: bytes, body: bytes) -> bytes:
            return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        raw = b"".join(bytes([f]) + r for f, r in zip(filters, rows, strict=True))
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 4, len(rows), 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    bg, red, white = b"\x0c\x18\x1f", b"\xff\x00\x00", b"\xff\xff\xff"
    plain = [bg + red + bg + bg, bg + bg + white + bg]
    assert colour_census(png(plain, [0, 0])) == (3, 2 / 8)
    # "Sub" filtered: each byte stored as the difference to the pixel on its left
    sub = [bytes((row[i] - (row[i - 3] if i >= 3 else 0)) & 0xFF for i in range(12)) for row in plain]
    assert colour_census(png(sub, [1, 1])) == (3, 2 / 8)
    # "Up" filtered: a row equal to the one above is stored as zeros
    assert colour_census(png([bg * 4, bytes(12)], [0, 2])) == (1, 0.0)


async def _devtools_port(profile: Path, chrome: subprocess.Popen) -> int:
    port_file = profile / "DevToolsActivePort"
    await wait_for_async(lambda: port_file.exists() and port_file.read_text().strip() or chrome.poll() is not None,
                         timeout=BROWSER_WAIT_S, what="chromium's DevTools port")
    assert chrome.poll() is None, f"chromium exited {chrome.returncode}"
    return int(port_file.read_text().split()[0])


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.mark.timeout(240)
@needs_tools("chromium", hint=CHROMIUM_HINT)
async def test_web_dashboard_loads_in_headless_chromium_and_shows_the_gpu_table(agent, tmp_path):
    port = free_port()
    server = _lynxtop("dashboard", "--config", str(_config(tmp_path)), "--socket", str(agent.socket_path),
                      "--database", str(tmp_path / "history.db"), "--web", f"127.0.0.1:{port}")
    profile = tmp_path / "chromium-profile"
    chrome = subprocess.Popen(
        [shutil.which("chromium") or "chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
         "--no-first-run", "--remote-debugging-port=0", f"--user-data-dir={profile}", "--window-size=1280,800",
         "about:blank"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(server.stdout.readline), BROWSER_WAIT_S)
        assert f"http://127.0.0.1:{port}" in line, line + (server.stderr.read() if server.poll() is not None else "")
        dport = await _devtools_port(profile, chrome)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{dport}/json/list") as resp:
                page = next(t for t in await resp.json() if t["type"] == "page")
            async with session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                tools = DevTools(ws)
                await tools.call("Network.enable")
                await tools.call("Page.enable")
                await tools.call("Page.navigate", url=f"http://127.0.0.1:{port}/")

                async with asyncio.timeout(BROWSER_WAIT_S):  # frames arrive while the page answers a call
                    while not all(t in tools.received_text() for t in GPU_TABLE_TEXT):
                        await tools.call("Runtime.evaluate", expression="1")
                        await asyncio.sleep(0.2)
                text = tools.received_text()
                assert "READ-ONLY" in text  # the served dashboard says it cannot control
                # The page has drawn what it received: xterm.js paints on an animation frame
                await tools.call("Runtime.evaluate", awaitPromise=True, expression=(
                    "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r("
                    "document.body.classList.contains('-first-byte')))))"))
                shot = await tools.call("Page.captureScreenshot", format="png")
        png = base64.b64decode(shot["data"])
        (tmp_path / "web-dashboard.png").write_bytes(png)
        colours, drawn = colour_census(png)
        assert colours >= 8 and drawn >= 0.02, f"screenshot looks blank: {colours} colours, {drawn:.1%} drawn"
        # The dashboard the server started: this Python with the dashboard's argv, read-only, no shell between
        children = psutil.Process(server.pid).children()
        assert children, "no dashboard process under the web server"
        cmd = children[0].cmdline()
        assert cmd[:4] == [sys.executable, "-m", "lynxtop", "dashboard"] and "--readonly" in cmd, cmd
        assert any(p == "/v1/status" for _, p, _ in agent.requests)
        assert not agent.posts()
        pids = [c.pid for c in psutil.Process(server.pid).children(recursive=True)]
        server.send_signal(signal.SIGTERM)  # with the tab still open: the server ends it and its dashboard
        await asyncio.to_thread(server.wait, 30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)
        _stop(chrome)
    assert server.returncode == 0, server.stderr.read()
    await wait_for_async(lambda: not [p for p in pids if _alive(p)], timeout=30, what="the dashboard processes to end")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
