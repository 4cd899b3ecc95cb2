"""GET /metrics over one kept-alive HTTP/1.1 connection: the scrape's request without a client library per GET.

aiohttp's client cost the event loop ~1.4 ms of CPU per GET of a DP=8 page (~0.3 MB) on the shared 2-core
machine: request and response objects, header multidicts, timers, a stream per response, the pool's bookkeeping
(issue 29.3). The scrape sends the same request to the same server every second, so `PageConnection` keeps one
connection open and reads each answer with a few `StreamReader` calls.

Invariants: the body is never buffered past the caller's `limit` (announced, chunked or read to the end); only a
200 is a page (any other status, redirects included, is the caller's failed scrape, never followed); an answer
that is not HTTP/1.x, or ends early, raises; the connection is dropped after any failure, a cancellation or an
answer that does not keep it, so the next GET never reads the remains of an earlier one. A kept connection the
server closed while idle (its keep-alive timeout: uvicorn's is 5 s) is opened again once, before any byte of the
answer was read: GET is safe to send twice.
"""

from __future__ import annotations

import asyncio
import zlib

MAX_HEAD_BYTES = 64 * 1024  # status line and headers of one answer; vLLM's are ~200 bytes
_READ_LIMIT = 256 * 1024  # the reader's buffer mark: large enough that a page arrives in a few reads
_DECODERS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


class AnswerRefused(Exception):
    """The server answered, but not with a page to read (status, size, framing); `str` says what."""


class StatusRefused(AnswerRefused):
    """An answer other than 200 (`status`): the caller's failed scrape, redirects included."""

    def __init__(self, status: int):
        super().__init__(f"HTTP {status}")
        self.status = status


class PageTooLarge(AnswerRefused):
    """A page over the caller's limit: `announced` by its Content-Length, or None when it grew past it."""

    def __init__(self, limit: int, announced: int | None = None):
        super().__init__(f"page cut off: {announced} bytes announced, over the {limit} byte limit"
                         if announced is not None else f"page cut off: larger than {limit} bytes")
        self.limit, self.announced = limit, announced


class PageConnection:
    """One server's page over one kept-alive connection. One GET at a time (the scrape's); `connects` counts the
    connections opened (tests hold a steady server to one)."""

    def __init__(self, host: str, port: int, target: str):
        self.host, self.port = host, port
        authority = f"[{host}]" if ":" in host else host
        self._request = (f"GET {target} HTTP/1.1\r\nHost: {authority}:{port}\r\nAccept: */*\r\n"
                         "Accept-Encoding: identity\r\nUser-Agent: lynxtop\r\n\r\n").encode("latin-1")
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self.connects = 0

    async def get(self, limit: int) -> bytes:
        """The body of a 200 answer, at most `limit` bytes; AnswerRefused, OSError, IncompleteReadError or
        LimitOverrunError otherwise. The caller bounds the time (asyncio.timeout)."""
        done = False
        try:
            body, keep = await self._answer(limit)
            done = True
        finally:
            if not done:  # failed, refused, timed out or cancelled: whatever is left on the wire is not read
                self.close()
        if not keep:
            self.close()
        return body

    async def _answer(self, limit: int) -> tuple[bytes, bool]:
        reused = self._writer is not None and not self._reader.at_eof()  # type: ignore[union-attr]
        if not reused:
            await self._open()
        try:
            self._writer.write(self._request)  # type: ignore[union-attr]
            head = await self._head()
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            if not reused or (isinstance(exc, asyncio.IncompleteReadError) and exc.partial):
                raise
            await self._open()  # the server closed the idle connection: once more on a new one
            self._writer.write(self._request)  # type: ignore[union-attr]
            head = await self._head()
        return await self._body(head, limit)

    async def _open(self) -> None:
        self.close()
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port, limit=_READ_LIMIT)
        self.connects += 1

    async def _head(self) -> tuple[int, bool, dict[str, str]]:
        """(status, HTTP/1.1, headers lower-cased) of the next final answer; 1xx answers are skipped."""
        reader = self._reader
        assert reader is not None
        while True:
            raw = await reader.readuntil(b"\r\n\r\n")
            if len(raw) > MAX_HEAD_BYTES:
                raise AnswerRefused(f"answer's headers over {MAX_HEAD_BYTES} bytes")
            lines = raw.decode("latin-1").split("\r\n")
            version, _, rest = lines[0].partition(" ")
            code = rest[:3]
            if not version.startswith("HTTP/1.") or not code.isdigit():
                raise AnswerRefused(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
            if not 100 <= int(code) < 200:
                break
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if colon:
                name, value = name.strip().lower(), value.strip()
                if name in headers and name in ("content-length", "transfer-encoding"):
                    raise AnswerRefused(f"two {name} headers")
                headers[name] = value
        return int(code), version == "HTTP/1.1", headers

    async def _body(self, head: tuple[int, bool, dict[str, str]], limit: int) -> tuple[bytes, bool]:
        code, http11, headers = head
        if code != 200:
            raise StatusRefused(code)
        reader = self._reader
        assert reader is not None
        keep = http11 and "close" not in headers.get("connection", "").lower()
        coding = headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        if coding:
            if coding != "chunked":
                raise AnswerRefused(f"transfer encoding {coding!r} not read")
            body = await self._chunked(limit)
        elif length is not None:
            if not length.isdigit():
                raise AnswerRefused(f"content length {length[:40]!r} is no size")
            if int(length) > limit:
                raise PageTooLarge(limit, int(length))
            body = await reader.readexactly(int(length))
        else:  # neither: the page ends with the connection
            body, keep = await self._to_end(limit), False
        encoding = headers.get("content-encoding", "identity").lower()
        if encoding != "identity":
            body = _decoded(body, encoding, limit)
        return body, keep

    async def _chunked(self, limit: int) -> bytes:
        reader = self._reader
        assert reader is not None
        parts: list[bytes] = []
        size = 0
        while True:
            line = await reader.readuntil(b"\r\n")
            try:
                n = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise AnswerRefused(f"chunk size {line[:40]!r} is no size") from None
            if n == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, if any
                    pass
                return b"".join(parts)
            size += n
            if size > limit:
                raise PageTooLarge(limit)
            parts.append(await reader.readexactly(n))
            if await reader.readexactly(2) != b"\r\n":
                raise AnswerRefused("chunk not ended by CRLF")

    async def _to_end(self, limit: int) -> bytes:
        reader = self._reader
        assert reader is not None
        parts: list[bytes] = []
        size = 0
        while chunk := await reader.read(1 << 16):
            size += len(chunk)
            if size > limit:
                raise PageTooLarge(limit)
            parts.append(chunk)
        return b"".join(parts)

    def close(self) -> None:
        """Drop the connection (no wait: nothing more is read from it)."""
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.transport.abort()


def _decoded(body: bytes, encoding: str, limit: int) -> bytes:
    """A compressed body (a server that ignored `Accept-Encoding: identity`), inflated to at most `limit` bytes."""
    wbits = _DECODERS.get(encoding)
    if wbits is None:
        raise AnswerRefused(f"content encoding {encoding!r} not read")
    inflate = zlib.decompressobj(wbits)
    try:
        out = inflate.decompress(body, limit + 1)
    except zlib.error as exc:
        raise AnswerRefused(f"{encoding} body not readable: {exc}") from None
    if len(out) > limit:
        raise PageTooLarge(limit)
    return out
