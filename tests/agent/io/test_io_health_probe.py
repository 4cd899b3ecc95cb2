"""The /health probe's own GET (agent/serving/health.py, HttpClient.status): one kept-alive connection, and for
every answer a server may give the same status and events as the aiohttp GET it replaced (HttpClient.get).

Real sockets: a raw asyncio server writes each answer exactly as the test scripts it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from lynxtop.agent.serving.health import MAX_BODY_BYTES, Health, HealthProbe, HttpClient

pytestmark = pytest.mark.timeout(30)

Answer = Callable[[bytes], bytes | None]  # request head -> bytes to write (None: close without answering)


class Server:
    """Counts connections and requests; answers each request with `answer(head)`; `close_after` closes the
    connection after each answer (a server's keep-alive timeout running out while the client is idle)."""

    def __init__(self, answer: Answer, close_after: bool = False):
        self.answer, self.close_after = answer, close_after
        self.connections = 0
        self.requests = 0
        self.agents: set[bytes] = set()  # User-Agent headers seen

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests += 1
                self.agents.update(ln[12:] for ln in head.split(b"\r\n") if ln.lower().startswith(b"user-agent: "))
                out = self.answer(head)
                if out is None:
                    break
                writer.write(out)
                await writer.drain()
                if self.close_after or out.startswith(b"HTTP/1.0") or b"\r\nX-Close: 1\r\n" in out:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def served(answer: Answer, close_after: bool = False) -> AsyncIterator[tuple[Server, str]]:
    srv = Server(answer, close_after)
    server = await asyncio.start_server(srv.handle, "127.0.0.1", 0)
    try:
        yield srv, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


def _answer(status: str, body: bytes = b"", headers: str = "", length: bool = True) -> bytes:
    cl = f"Content-Length: {len(body)}\r\n" if length else ""
    return f"HTTP/1.1 {status}\r\n{cl}{headers}\r\n".encode() + body


def _chunked(body: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
            + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")


def _redirect(head: bytes) -> bytes:
    if head.startswith(b"GET /health "):
        return _answer("302 Found", headers="Location: /ok\r\n")
    return _answer("200 OK", b"fine", "Content-Type: text/plain\r\n")


BIG_JSON = b'{"x": "' + b"y" * (MAX_BODY_BYTES + 10) + b'"}'

ANSWERS: dict[str, Answer] = {
    "200 empty (vLLM's)": lambda _h: _answer("200 OK"),
    "200 text": lambda _h: _answer("200 OK", b"ok", "Content-Type: text/plain\r\n"),
    "503 empty": lambda _h: _answer("503 Service Unavailable"),
    "500 small JSON": lambda _h: _answer("500 Internal Server Error", b'{"detail": "x"}',
                                         "Content-Type: application/json\r\n"),
    "200 JSON over the cap": lambda _h: _answer("200 OK", BIG_JSON, "Content-Type: application/json\r\n"),
    "200 text over the cap": lambda _h: _answer("200 OK", b"z" * (MAX_BODY_BYTES + 10), "Content-Type: text/plain\r\n"),
    "302 to a 200": _redirect,
    "200 chunked text": lambda _h: _chunked(b"ok"),
    "HTTP/1.0 200, no length": lambda _h: b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nok",
    "200 Connection: close": lambda _h: _answer("200 OK", b"ok", "Connection: close\r\n"),
    "100 then 204": lambda _h: b"HTTP/1.1 100 Continue\r\n\r\n" + _answer("204 No Content", length=False),
    "200, body cut short": lambda _h: b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nX-Close: 1\r\n\r\nok",
    "200, body never sent": lambda _h: b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n",
    "503 with a body": lambda _h: _answer("503 Service Unavailable", b"engine dead", "Content-Type: text/plain\r\n"),
    "not HTTP": lambda _h: b"FOO BAR\r\n\r\n",
    "closed without an answer": lambda _h: None,
}


@pytest.mark.parametrize("name", list(ANSWERS))
async def test_the_probe_gives_what_the_aiohttp_get_gave(name):
    async with served(ANSWERS[name]) as (_srv, url):
        old, new = HttpClient(), HttpClient()
        try:
            for _ in range(2):  # the second on the kept connection, where there is one
                before = (await old.get(url + "/health"))[0]
                assert await new.status(url + "/health") == before, name
                assert [e["details"] for e in new.drain_events()] == [e["details"] for e in old.drain_events()]
        finally:
            await old.close()
            await new.close()


async def test_a_steady_server_is_probed_over_one_connection():
    async with served(ANSWERS["200 empty (vLLM's)"]) as (srv, url):
        http = HttpClient()
        try:
            probe = HealthProbe(http, url, fail_threshold=2)
            for _ in range(5):
                assert (await probe.probe()).health is Health.HEALTHY
            assert await probe.ok()
            assert srv.connections == 1 and srv.requests == 6
            assert srv.agents == {b"lynxtop"}  # the probe's own request, not aiohttp's
        finally:
            await http.close()


async def test_a_connection_the_server_closed_while_idle_is_opened_again():
    async with served(ANSWERS["200 empty (vLLM's)"], close_after=True) as (srv, url):
        http = HttpClient()
        try:
            for _ in range(3):
                assert await http.status(url + "/health") == 200
                await asyncio.sleep(0.05)  # the close has arrived: the next probe opens a connection at once
            assert await http.status(url + "/health") == 200  # maybe before the close: sent once more
            assert srv.connections == 4
        finally:
            await http.close()


async def test_a_frozen_server_is_no_answer_and_so_is_a_dead_one():
    async def never(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # reads the request, never answers

    server = await asyncio.start_server(never, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    http = HttpClient()
    try:
        assert await http.status(url + "/health", timeout_s=0.3) is None  # it never answers: the timeout ends it
        server.close()
        await server.wait_closed()
        assert await http.status(url + "/health", timeout_s=0.3) is None  # the port refuses now
        probe = HealthProbe(http, url, fail_threshold=2, hang_timeout_s=0.0)
        assert (await probe.probe()).health is Health.HUNG
    finally:
        await http.close()


async def test_a_new_url_drops_the_older_runs_connection():
    async with served(ANSWERS["200 empty (vLLM's)"]) as (srv1, url1), \
            served(ANSWERS["503 empty"]) as (srv2, url2):
        http = HttpClient()
        try:
            assert await http.status(url1 + "/health") == 200
            assert await http.status(url2 + "/health") == 503
            assert await http.status(url1 + "/health") == 200
            assert (srv1.connections, srv2.connections) == (2, 1)
        finally:
            await http.close()
