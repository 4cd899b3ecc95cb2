"""The HTTP/1.1 client that carries `lynxtop bench`'s streamed requests: keep-alive connections to one server,
each answer's bytes handed to the event-stream reader the moment the event loop reads them.

Through aiohttp a streamed token cost the client ~25 µs (its stream reader wakes the reading coroutine once per
chunk), half a core at 512 streams and 20,000 tokens/s on a machine the server shares, and the wait for that
coroutine was added to every gap the client measured. Here a protocol's `data_received` feeds the reader with
the time of the read itself: no coroutine per token, and no queueing between the socket and the clock.

What it speaks: a POST with a Content-Length body; answers with chunked, Content-Length or close-delimited
bodies; http and https. A reused connection that the server had closed while idle is retried once on a new one.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_HEAD = 64 * 1024  # status line and headers
MAX_ERROR_BODY = 64 * 1024  # what is kept of a non-200 answer (for its message)

OnBody = Callable[[bytes, float], None]  # a piece of a 200 answer's body, and when it was read


class ProtocolError(Exception):
    """The answer is not HTTP/1.1 this client can read; the message says what."""


class ConnectFailed(OSError):
    """No connection to the server (refused, unresolvable, timed out)."""


@dataclass
class Answer:
    status: int
    body: bytes  # a non-200 answer's body (at most MAX_ERROR_BODY); empty for 200
    keep_alive: bool


class _Reply:
    """One answer: status line and headers, then a body that is chunked, has a length, or ends at close."""

    def __init__(self, on_body: OnBody, done: asyncio.Future[Answer]):
        self.on_body, self.done = on_body, done
        self.head = b""
        self.status = 0
        self.keep_alive = True
        self.chunked = False
        self.left: int | None = None  # Content-Length still to read; None: chunked or until close
        self.buf = b""  # chunked: bytes not yet framed
        self.need = 0  # chunked: payload bytes of the current chunk still to come
        self.last_chunk = False  # chunked: the zero-size chunk was read, its trailer section is next
        self.error_body = b""
        self.started = False  # any byte of the answer arrived

    def feed(self, data: bytes, now: float) -> None:
        self.started = True
        if not self.status:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                if len(self.head) > MAX_HEAD:
                    raise ProtocolError(f"no end of the headers in the first {MAX_HEAD} bytes")
                return
            data = self.head[end + 4:]
            self._parse_head(self.head[:end])
            self.head = b""
            if self.left == 0:
                self._finish()
                return
        if self.chunked:
            self._chunks(data, now)
        elif self.left is not None:
            take = data[:self.left]
            self.left -= len(take)
            self._body(take, now)
            if self.left == 0:
                self._finish()
        else:
            self._body(data, now)

    def eof(self, exc: BaseException | None) -> None:
        """The connection closed: the end of a close-delimited body, else an answer cut short."""
        if self.done.done():
            return
        if self.status and not self.chunked and self.left is None:
            self.keep_alive = False
            self._finish()
            return
        what = "mid-answer" if self.started else "before answering"
        err = ConnectionResetError(f"the server closed the connection {what}" + (f" ({exc})" if exc else ""))
        self.done.set_exception(err)

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        self.status = int(parts[1])
        self.keep_alive = parts[0] == b"HTTP/1.1"
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise ProtocolError(f"bad header line: {line[:80]!r}")
            name, value = name.strip().lower(), value.strip().lower()
            if name == b"transfer-encoding":
                self.chunked = value.endswith(b"chunked")
            elif name == b"content-length":
                if not value.isdigit():
                    raise ProtocolError(f"bad Content-Length: {value[:40]!r}")
                self.left = int(value)
            elif name == b"connection":
                self.keep_alive = value != b"close" and (self.keep_alive or value == b"keep-alive")
        if self.chunked:
            self.left = None

    def _chunks(self, data: bytes, now: float) -> None:
        buf = self.buf + data if self.buf else data
        while buf:
            if self.need > 0:
                take = buf[:self.need]
                self.need -= len(take)
                buf = buf[len(take):]
                self._body(take, now)
                if self.need:
                    break
                self.need = -2  # the CRLF after the payload
                continue
            if self.need < 0:  # CRLF after a payload; it may come split across reads
                drop = min(-self.need, len(buf))
                if buf[:drop] != b"\r\n"[2 + self.need:2 + self.need + drop]:
                    raise ProtocolError("chunk not followed by CRLF")
                self.need += drop
                buf = buf[drop:]
                continue
            if self.last_chunk:  # trailers (usually none), then the blank line that ends the answer
                if buf.startswith(b"\r\n") or b"\r\n\r\n" in buf:
                    buf = b""
                    self._finish()
                break
            eol = buf.find(b"\r\n")
            if eol < 0:
                if len(buf) > 1024:
                    raise ProtocolError("chunk size line too long")
                break
            try:
                size = int(buf[:eol].split(b";", 1)[0], 16)
            except ValueError:
                raise ProtocolError(f"bad chunk size line: {buf[:eol][:40]!r}") from None
            buf = buf[eol + 2:]
            if size == 0:
                self.last_chunk = True
            else:
                self.need = size
        self.buf = buf

    def _body(self, part: bytes, now: float) -> None:
        if not part:
            return
        if self.status == 200:
            self.on_body(part, now)
        elif len(self.error_body) < MAX_ERROR_BODY:
            self.error_body += part[:MAX_ERROR_BODY - len(self.error_body)]

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(Answer(self.status, self.error_body, self.keep_alive))


class _Conn(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reply: _Reply | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        reply = self.reply
        if reply is None or reply.done.done():  # bytes nobody asked for: this connection cannot be trusted
            self.close()
            return
        try:
            reply.feed(data, now)
        except Exception as exc:  # noqa: BLE001 - a bad answer or the reader's own verdict (an error event)
            if not reply.done.done():
                reply.done.set_exception(exc)
            self.close()

    def eof_received(self) -> bool:
        return False  # close: a half-closed connection is of no further use

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.reply is not None:
            self.reply.eof(exc)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class StreamPool:
    """Keep-alive connections to the server of `url` (scheme, host, port and a path prefix)."""

    def __init__(self, url: str, timeout_s: float, connect_timeout_s: float = 5.0):
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/")
        self.ssl = ssl.create_default_context() if u.scheme == "https" else None
        default = self.port == (443 if u.scheme == "https" else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if default else f"{host}:{self.port}"
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s
        self._idle: list[_Conn] = []
        self._all: set[_Conn] = set()

    async def post(self, path: str, body: bytes, headers: dict[str, str] | None, on_body: OnBody) -> Answer:
        """POST `body` (JSON) to prefix + path; a 200 answer's body goes to `on_body` as it is read.

        Raises ConnectFailed, TimeoutError (the whole answer took longer than `timeout_s`), ProtocolError,
        ConnectionResetError (closed mid-answer), or whatever `on_body` raised."""
        head = [f"POST {self.prefix}{path} HTTP/1.1", f"Host: {self.host_header}", "User-Agent: lynxtop-bench",
                "Content-Type: application/json", "Accept: text/event-stream", f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        async with asyncio.timeout(self.timeout_s):
            conn, reused = await self._conn()
            try:
                return await self._exchange(conn, request, on_body)
            except ConnectionResetError as exc:
                if not reused or "before answering" not in str(exc):
                    raise
            # the server had closed the idle connection: once more on a new one
            conn, _ = await self._conn(fresh=True)
            return await self._exchange(conn, request, on_body)

    async def close(self) -> None:
        for conn in list(self._all):
            conn.close()
        self._all.clear()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports run their close callbacks

    async def _conn(self, fresh: bool = False) -> tuple[_Conn, bool]:
        while self._idle and not fresh:
            conn = self._idle.pop()
            if not conn.closed:
                return conn, True
            self._all.discard(conn)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(_Conn, self.host, self.port, ssl=self.ssl,
                                                       server_hostname=self.host if self.ssl else None)
        except TimeoutError:
            raise ConnectFailed(f"no connection to {self.host}:{self.port} within {self.connect_timeout_s:g} s") \
                from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {self.host}:{self.port}: {exc.strerror or exc}") from exc
        self._all.add(conn)
        return conn, False

    async def _exchange(self, conn: _Conn, request: bytes, on_body: OnBody) -> Answer:
        done: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        conn.reply = _Reply(on_body, done)
        ok = False
        try:
            assert conn.transport is not None
            conn.transport.write(request)
            answer = await done
            ok = answer.keep_alive and not conn.closed
            return answer
        finally:
            conn.reply = None
            if ok:
                self._idle.append(conn)
            else:  # cut, cancelled, timed out or not to be kept: never reused
                conn.close()
                self._all.discard(conn)
