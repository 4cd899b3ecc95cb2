"""The scrape's own GET (agent/metrics/pageconn.py): one kept-alive connection, within the same limits as before.

Real sockets: a raw asyncio server answers each request as the test scripts it (framing, status, closing), so
every answer a server may give is on the wire exactly as written.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import aiohttp
import pytest
from support.vllm_pages import sim_page

from lynxtop.agent.metrics import fetch
from lynxtop.agent.metrics.pageconn import PageConnection, PageTooLarge, StatusRefused
from lynxtop.agent.metrics.scrape import MetricsScraper

PAGE = sim_page(2, seed=3).encode()

Answer = Callable[[int], bytes | None]  # request number (from 0) -> bytes to write, None: close the connection


def _plain(body: bytes = PAGE, extra: str = "") -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def _chunked(body: bytes, size: int = 4000) -> bytes:
    parts = [f"{len(body[i:i + size]):x}\r\n".encode() + body[i:i + size] + b"\r\n" for i in range(0, len(body), size)]
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"".join(parts) + b"0\r\n\r\n"


class Server:
    """Counts connections and requests; answers each request with `answer(n)`."""

    def __init__(self, answer: Answer):
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                n = len(self.requests)
                self.requests.append(head)
                out = self.answer(n)
                if out is None:
                    break
                writer.write(out)
                await writer.drain()
                if out.startswith(b"HTTP/1.0"):  # no length: the page ends with the connection
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def served(answer: Answer) -> AsyncIterator[tuple[Server, str]]:
    srv = Server(answer)
    server = await asyncio.start_server(srv.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield srv, f"http://127.0.0.1:{port}"
    finally:
        server.close()


class NoSession:
    """A session that must not be used: the scrape's GET of an http:// page does not go through aiohttp."""

    def __init__(self) -> None:
        self.used = 0

    def get(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        self.used += 1
        raise AssertionError("the session was used for the page")


async def test_a_steady_server_is_read_over_one_kept_connection_without_the_session():
    async with served(lambda n: _plain()) as (srv, url):
        s = MetricsScraper(url, timeout_s=5)
        session = NoSession()
        for i in range(5):
            row = await s.scrape(session, now=float(i))  # type: ignore[arg-type]
            assert row["scrape_ok"] == 1, s.last_error
        assert session.used == 0
        assert srv.connections == 1 and len(srv.requests) == 5
        head = srv.requests[0].decode()
        assert head.startswith("GET /metrics HTTP/1.1\r\n") and "Accept-Encoding: identity" in head
        assert f"Host: {url.removeprefix('http://')}" in head
        s.close()


async def test_a_redirect_is_a_failed_scrape_not_followed():
    elsewhere = b"HTTP/1.1 302 Found\r\nLocation: /other\r\nContent-Length: 0\r\n\r\n"
    async with served(lambda n: elsewhere) as (srv, url):
        s = MetricsScraper(url, timeout_s=5)
        row = await s.scrape(NoSession(), now=0.0)  # type: ignore[arg-type]
        assert row["scrape_ok"] == 0 and s.last_error == f"HTTP 302 from {url}/metrics"
        assert len(srv.requests) == 1  # /other never asked for


async def test_refusals_carry_their_kind_not_only_words():
    """The fetcher words a refusal by its kind (status, size announced or streamed), never by parsing its text."""
    answers = [b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n", _plain(), _chunked(PAGE)]
    async with served(lambda n: answers[n]) as (_srv, url):
        host, port = url.removeprefix("http://").split(":")
        conn = PageConnection(host, int(port), "/metrics")
        with pytest.raises(StatusRefused) as status:
            await conn.get(len(PAGE))
        assert status.value.status == 503 and str(status.value) == "HTTP 503"
        with pytest.raises(PageTooLarge) as announced:
            await conn.get(len(PAGE) - 1)
        assert (announced.value.announced, announced.value.limit) == (len(PAGE), len(PAGE) - 1)
        with pytest.raises(PageTooLarge) as streamed:
            await conn.get(len(PAGE) - 1)
        assert streamed.value.announced is None
        assert str(streamed.value) == f"page cut off: larger than {len(PAGE) - 1} bytes"
        conn.close()


async def test_chunked_and_unframed_pages_are_read_and_each_cap_holds(monkeypatch):
    answers = [_chunked(PAGE), b"HTTP/1.0 200 OK\r\n\r\n" + PAGE, _chunked(PAGE), _plain(), _plain()]
    async with served(lambda n: answers[n]) as (srv, url):
        s = MetricsScraper(url, timeout_s=5)
        assert (await s.scrape(NoSession(), now=0.0))["scrape_ok"] == 1, s.last_error  # chunked
        conn = s._fetch.conn
        assert conn is not None and conn.connects == 1
        monkeypatch.setattr(fetch, "MAX_PAGE_BYTES", len(PAGE) + 10)
        row = await s.scrape(NoSession(), now=1.0)  # HTTP/1.0, no length: read to the end, not kept
        assert row["scrape_ok"] == 1, s.last_error
        monkeypatch.setattr(fetch, "MAX_PAGE_BYTES", len(PAGE) - 1)
        row = await s.scrape(NoSession(), now=2.0)  # chunked, over the cap while streamed
        assert row["scrape_ok"] == 0
        assert s.last_error == f"page cut off: larger than {len(PAGE) - 1} bytes at {url}/metrics"
        row = await s.scrape(NoSession(), now=3.0)  # announced over the cap: not read
        assert row["scrape_ok"] == 0 and s.last_error == (
            f"page cut off: {len(PAGE)} bytes announced, over the {len(PAGE) - 1} byte limit, at {url}/metrics")
        monkeypatch.setattr(fetch, "MAX_PAGE_BYTES", 8 << 20)
        row = await s.scrape(NoSession(), now=4.0)  # a fresh connection: nothing of the cut-off pages is read
        assert row["scrape_ok"] == 1, s.last_error
        assert conn.connects == 4 and srv.connections == 4


async def test_a_kept_connection_the_server_closed_is_opened_again_once():
    async with served(lambda n: None if n == 1 else _plain()) as (srv, url):
        s = MetricsScraper(url, timeout_s=5)
        assert (await s.scrape(NoSession(), now=0.0))["scrape_ok"] == 1
        row = await s.scrape(NoSession(), now=1.0)  # request 1 is read and the connection closed, unanswered
        assert row["scrape_ok"] == 1, s.last_error
        assert s._fetch.conn is not None and s._fetch.conn.connects == 2 and len(srv.requests) == 3


async def test_an_answer_that_closes_before_its_head_fails_once_on_a_fresh_connection():
    async with served(lambda n: None) as (srv, url):  # accepts, reads the request, closes
        s = MetricsScraper(url, timeout_s=5)
        row = await s.scrape(NoSession(), now=0.0)
        assert row["scrape_ok"] == 0 and s.last_error.startswith(f"cannot read {url}/metrics: the answer ended")
        assert srv.connections == 1  # a fresh connection is not tried twice


async def test_not_http_a_short_page_and_a_slow_page_are_failed_scrapes_and_the_next_one_reads():
    script = [b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
              _plain()[:-100].replace(b"HTTP/1.1", b"HTTP/1.0"),  # 100 bytes short, then the server closes
              b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n",  # 10 bytes announced, none sent
              _plain()]
    async with served(lambda n: script[n]) as (srv, url):
        s = MetricsScraper(url, timeout_s=0.5)
        row = await s.scrape(NoSession(), now=0.0)
        assert row["scrape_ok"] == 0 and "not an HTTP/1.x answer" in s.last_error
        row = await s.scrape(NoSession(), now=1.0)
        assert row["scrape_ok"] == 0 and "the answer ended after" in s.last_error
        row = await s.scrape(NoSession(), now=2.0)
        assert row["scrape_ok"] == 0 and s.last_error == f"page cut off: timed out after 0.5 s reading {url}/metrics"
        row = await s.scrape(NoSession(), now=3.0)
        assert row["scrape_ok"] == 1, s.last_error
        assert srv.connections == 4  # each failure dropped its connection: no answer read from a stale one


async def test_a_gzip_page_is_inflated_within_the_cap(monkeypatch):
    packed = gzip.compress(PAGE)
    answer = (f"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {len(packed)}\r\n\r\n".encode() + packed)
    async with served(lambda n: answer) as (_srv, url):
        s = MetricsScraper(url, timeout_s=5)
        assert (await s.scrape(NoSession(), now=0.0))["scrape_ok"] == 1, s.last_error
        monkeypatch.setattr(fetch, "MAX_PAGE_BYTES", len(PAGE) // 2)  # small on the wire, too large inflated
        row = await s.scrape(NoSession(), now=1.0)
        assert row["scrape_ok"] == 0 and "page cut off: larger than" in s.last_error


async def test_https_and_credentials_in_the_url_go_through_the_session():
    for url in ("https://127.0.0.1:1", "http://user:pw@127.0.0.1:1"):
        s = MetricsScraper(url, timeout_s=0.5)
        assert s._fetch.conn is None
        async with aiohttp.ClientSession() as session:
            row = await s.scrape(session, now=0.0)
        assert row["scrape_ok"] == 0 and s.last_error.startswith("cannot read ")
