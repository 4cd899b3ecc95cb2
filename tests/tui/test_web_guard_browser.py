"""`lynxtop dashboard --web --web-control` in a real browser (headless Chromium over the DevTools protocol): a page of
another origin, and a foreign name that resolves to loopback (Chromium resolves *.localhost to 127.0.0.1 itself, the
shape of DNS rebinding), reach no dashboard; the address with the token printed on the terminal does.

The real `lynxtop dashboard --web` process against the FAKE agent. Without chromium it skips saying why; under
LYNXTOP_REQUIRE_REAL=1 (CI) it fails.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import shutil
import subprocess
import sys

import aiohttp
import psutil
import pytest
from support.ports import free_port
from support.real import needs_tools
from support.waits import wait_for_async

WAIT_S = 60.0
CHROMIUM_HINT = "apt-get install -y -q --no-install-recommends chromium (Debian)"

EVIL_PAGE = """<!DOCTYPE html><html><body><script>
function attempt(url) {
  return new Promise(done => {
    let opened = false;
    const ws = new WebSocket(url);
    ws.onopen = () => { opened = true; ws.send(JSON.stringify(["stdin", "X"])); };
    ws.onclose = e => done({url, opened, code: e.code});
    setTimeout(() => { try { ws.close(); } catch (e) {} done({url, opened, code: -1}); }, 8000);
  });
}
window.done = Promise.all([attempt("ws://127.0.0.1:PORT/ws?width=80&height=24"),
                           attempt("ws://localhost:PORT/ws?width=80&height=24")]);
</script></body></html>"""


class Page:
    """One page of headless Chromium; the websocket frames it received are kept (the app's output)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse):
        self.ws, self._id, self.frames = ws, 0, bytearray()

    async def call(self, method: str, **params) -> dict:
        self._id += 1
        await self.ws.send_json({"id": self._id, "method": method, "params": params})
        while True:
            msg = await self.ws.receive_json(timeout=WAIT_S)
            if msg.get("method") == "Network.webSocketFrameReceived":
                resp = msg["params"]["response"]
                data = resp["payloadData"]
                self.frames += base64.b64decode(data) if resp.get("opcode") == 2 else data.encode()
            elif msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    async def evaluate(self, expression: str) -> object:
        result = await self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        return result.get("result", {}).get("value")

    async def open(self, url: str) -> str:
        """Navigate and return the body's text once the document has loaded."""
        await self.call("Page.navigate", url=url)
        await asyncio.sleep(0.3)  # the old document may still say complete
        deadline = asyncio.get_running_loop().time() + WAIT_S  # chromium loads slowly on a loaded machine
        while asyncio.get_running_loop().time() < deadline:
            if await self.evaluate("document.readyState") == "complete":
                break
            await asyncio.sleep(0.1)
        return str(await self.evaluate("document.body ? document.body.innerText : ''"))


def _dashboards(server: subprocess.Popen) -> list[list[str]]:
    """The argv of each dashboard the server runs; one that exits while it is read is not running (its /proc entry
    can vanish between two reads, as CI saw in test_web_guard_limits)."""
    out = []
    for c in psutil.Process(server.pid).children():
        try:
            cmd = c.cmdline()
            if c.status() != psutil.STATUS_ZOMBIE and "dashboard" in cmd:
                out.append(cmd)
        except psutil.NoSuchProcess:
            continue
    return out


def _stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        proc.terminate()
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err or ""


@pytest.mark.timeout(240)
@needs_tools("chromium", hint=CHROMIUM_HINT)
async def test_only_the_token_address_reaches_the_controls_in_a_real_browser(agent, tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text("")
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "lynxtop", "dashboard", "--config", str(cfg), "--socket",
                               str(agent.socket_path), "--database", str(tmp_path / "h.db"),
                               "--web", f"127.0.0.1:{port}", "--web-control"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    async def evil_page(request: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(text=EVIL_PAGE.replace("PORT", str(port)), content_type="text/html")

    evil = aiohttp.web.Application()
    evil.router.add_get("/", evil_page)
    evil_runner = aiohttp.web.AppRunner(evil)
    await evil_runner.setup()
    evil_port = free_port()
    await aiohttp.web.TCPSite(evil_runner, "127.0.0.1", evil_port).start()
    profile = tmp_path / "chromium-profile"
    chrome = subprocess.Popen(
        [shutil.which("chromium") or "chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--remote-debugging-port=0", f"--user-data-dir={profile}", "--window-size=1280,800", "about:blank"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(server.stdout.readline), WAIT_S)
        m = re.search(rf"(http://127\.0\.0\.1:{port}/\?token=[A-Za-z0-9_-]+)", line)
        assert m, line
        port_file = profile / "DevToolsActivePort"
        await wait_for_async(lambda: port_file.exists() and port_file.read_text().strip(), WAIT_S,
                             what="chromium's DevTools port")
        dport = int(port_file.read_text().split()[0])
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{dport}/json/list") as resp:
                target = next(t for t in await resp.json() if t["type"] == "page")
            async with s.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Page(ws)
                await page.call("Network.enable")
                await page.call("Page.enable")
                # a page of another origin opens the dashboard's websocket (browsers apply no CORS to them)
                await page.open(f"http://127.0.0.1:{evil_port}/")
                tries = json.loads(str(await page.evaluate("window.done.then(r => JSON.stringify(r))")))
                assert tries and not any(t["opened"] for t in tries), tries
                # a foreign name that resolves to loopback: refused, nothing of the page served
                body = await page.open(f"http://rebind-test.localhost:{port}/")
                assert "refused" in body and "Host" in body, body
                # the plain address: the page says the token is needed
                body = await page.open(f"http://127.0.0.1:{port}/")
                assert "token" in body, body
                assert not _dashboards(server)
                # the printed address: the dashboard, with controls
                await page.open(m.group(1))
                async with asyncio.timeout(WAIT_S):
                    while b"Tensor" not in page.frames:
                        await page.call("Runtime.evaluate", expression="1")
                        await asyncio.sleep(0.2)
                started = _dashboards(server)
                assert len(started) == 1 and "--readonly" not in started[0], started
        assert not agent.posts()  # the cross-origin page's X reached nothing
    finally:
        err = _stop(server)
        chrome.terminate()
        try:
            chrome.wait(20)
        except subprocess.TimeoutExpired:
            chrome.kill()
        await evil_runner.cleanup()
    assert "Traceback" not in err
    assert "refusing" in err  # the operator's terminal says a page of another origin tried
    assert m.group(1).split("token=")[1] not in err

