"""bench's streaming HTTP client against a scripted real socket server, and its framing on every split of a read."""

from __future__ import annotations

import asyncio

import pytest
from support.ports import free_port
from support.waits import wait_for_async

from lynxtop.cli.bench_http import ConnectFailed, ProtocolError, StreamPool, _Reply
from lynxtop.cli.bench_load import Workload, one_request

CHUNKED = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"d\r\ndata: one\r\n\r\n\r\n" b"D;ext=1\r\ndata: two\r\n\r\n\r\n" b"0\r\nX-Trailer: t\r\n\r\n")


def _feed_split(raw: bytes, cuts: list[int]) -> tuple[bytes, asyncio.Future]:
    loop = asyncio.new_event_loop()
    try:
        done = loop.create_future()
        got: list[bytes] = []
        r = _Reply(lambda b, _t: got.append(b), done)
        last = 0
        for c in [*cuts, len(raw)]:
            if c > last:
                r.feed(raw[last:c], 0.0)
            last = c
        return b"".join(got), done
    finally:
        loop.close()


@pytest.mark.parametrize("raw,body", [
    (CHUNKED, b"data: one\r\n\r\ndata: two\r\n\r\n"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello worldEXTRA", b"hello world"),
])
def test_framing_is_the_same_however_the_reads_are_cut(raw, body):
    for a in range(len(raw)):
        for b in (a, a + 1, a + 7, len(raw) - 1):
            got, done = _feed_split(raw, sorted({a, min(b, len(raw))}))
            assert got == body, (a, b)
            assert done.done() and done.result().status == 200 and done.result().keep_alive


def test_bad_answers_are_protocol_errors():
    for raw in (b"SSH-2.0-OpenSSH\r\n\r\n", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                b"HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\n", b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n"):
        with pytest.raises(ProtocolError):
            _feed_split(raw, [])


class Scripted:
    """A TCP server answering each request from a list of (raw answer, then close?) steps; counts connections."""

    def __init__(self, steps: list[tuple[bytes | None, bool]]):
        self.steps = steps
        self.connections = 0
        self.closed = 0  # connections this server has closed
        self.requests: list[bytes] = []
        self.port = free_port()

    async def __aenter__(self) -> Scripted:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.steps:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                self.requests.append(head + await reader.readexactly(length))
                answer, close = self.steps.pop(0)
                if answer is None:  # never answer
                    await asyncio.sleep(30)
                writer.write(answer)
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self.closed += 1


async def _post(pool: StreamPool) -> tuple[int, bytes, bytes]:
    got: list[bytes] = []
    ans = await pool.post("/v1/completions", b'{"x":1}', {"Authorization": "Bearer k"}, lambda b, _t: got.append(b))
    return ans.status, b"".join(got), ans.body


async def test_keep_alive_reuses_one_connection_and_sends_a_proper_request():
    async with Scripted([(CHUNKED, False), (CHUNKED, False)]) as srv:
        pool = StreamPool(f"http://127.0.0.1:{srv.port}/prefix", timeout_s=5)
        try:
            assert await _post(pool) == (200, b"data: one\r\n\r\ndata: two\r\n\r\n", b"")
            assert (await _post(pool))[0] == 200
        finally:
            await pool.close()
    assert srv.connections == 1
    first = srv.requests[0]
    assert first.startswith(b"POST /prefix/v1/completions HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{srv.port}\r\n".encode() in first and b"Authorization: Bearer k\r\n" in first
    assert first.endswith(b'\r\n\r\n{"x":1}')


async def test_an_idle_connection_the_server_closed_is_retried_once_on_a_new_one():
    async with Scripted([(CHUNKED, True), (CHUNKED, False)]) as srv:  # closes after the first answer, silently
        pool = StreamPool(f"http://127.0.0.1:{srv.port}", timeout_s=5)
        try:
            await _post(pool)
            await wait_for_async(lambda: srv.closed == 1, 5, what="the server closing the idle connection")
            assert (await _post(pool))[0] == 200
        finally:
            await pool.close()
    assert srv.connections == 2


async def test_errors_with_bodies_close_delimited_bodies_and_cuts():
    err = b'HTTP/1.1 404 Not Found\r\nContent-Length: 28\r\n\r\n{"error":{"message":"nope"}}'
    close_delimited = b"HTTP/1.0 200 OK\r\n\r\ndata: x\n\n"
    cut = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n8\r\ndata: x\n"
    async with Scripted([(err, False), (close_delimited, True), (cut, True)]) as srv:
        pool = StreamPool(f"http://127.0.0.1:{srv.port}", timeout_s=5)
        try:
            assert await _post(pool) == (404, b"", b'{"error":{"message":"nope"}}')
            assert await _post(pool) == (200, b"data: x\n\n", b"")
            with pytest.raises(ConnectionResetError, match="mid-answer"):
                await _post(pool)
        finally:
            await pool.close()


async def test_timeout_refused_and_a_raising_reader():
    async with Scripted([(None, False)]) as srv:
        pool = StreamPool(f"http://127.0.0.1:{srv.port}", timeout_s=0.3)
        with pytest.raises(TimeoutError):
            await _post(pool)
        await pool.close()
    pool = StreamPool(f"http://127.0.0.1:{free_port()}", timeout_s=5)
    with pytest.raises(ConnectFailed, match="cannot connect"):
        await _post(pool)

    async with Scripted([(CHUNKED, False), (CHUNKED, False)]) as srv:
        pool = StreamPool(f"http://127.0.0.1:{srv.port}", timeout_s=5)

        def refuse(_b: bytes, _t: float) -> None:
            raise ValueError("the reader says no")

        try:
            with pytest.raises(ValueError, match="the reader says no"):
                await pool.post("/x", b"{}", None, refuse)
            assert await _post(pool) == (200, b"data: one\r\n\r\ndata: two\r\n\r\n", b"")
        finally:
            await pool.close()
    assert srv.connections == 2  # the connection of the refused answer was not reused


def test_only_http_urls():
    with pytest.raises(ValueError, match="not an http"):
        StreamPool("ftp://x/", 1)


async def test_a_malformed_event_fails_the_request_with_a_reason_not_the_level():
    bad = b'data: {"choices":[],"usage":{oops}\n\n'
    body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(bad), bad)
    async with Scripted([(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body, False)]) as srv:
        pool = StreamPool(f"http://127.0.0.1:{srv.port}", timeout_s=5)
        try:
            res = await one_request(pool, Workload(f"http://127.0.0.1:{srv.port}", "m", 4, 4), {"prompt": [1]})
        finally:
            await pool.close()
    assert not res.ok and res.error.startswith("bad event in the stream")
