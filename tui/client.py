"""The dashboard's side of the control API: JSON over HTTP/1.1 on the agent's unix socket (docs/contracts.md).

A small HTTP client on asyncio streams instead of aiohttp: the dashboard only ever sends a handful of
JSON requests to one local socket, and importing aiohttp's client costs a quarter of a second of start-up
(the first frame must come within one). One connection per request: a unix connect costs microseconds.

Every failure becomes one of two exceptions so screens never see the transport: `AgentUnreachable`
(nothing answers, or the answer is not the API) and `AgentRefused` (the agent answered an error).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

MUTATING_ACTIONS = ("start", "stop", "restart", "switch")
MAX_BODY = 64 * 1024 * 1024  # a status or log answer is far smaller; more means something else answers


class AgentUnreachable(Exception):
    """The socket is absent, refuses connections, times out, or answers something that is not the API."""


class AgentRefused(Exception):
    """The agent answered with an error: `status` is the HTTP code, `code` the API's error code."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{message} ({status} {code})")
        self.status = status
        self.code = code
        self.message = message


class AgentClient:
    def __init__(self, socket_path: str | Path, timeout_s: float = 3.0):
        self.socket_path = str(socket_path)
        self.timeout_s = timeout_s
        self._closed = False

    async def _request(self, method: str, path: str, params: dict[str, Any] | None = None,
                       body: dict[str, Any] | None = None) -> dict[str, Any]:
        if self._closed:
            raise AgentUnreachable(f"{self.socket_path}: client closed")
        query = urlencode({k: v for k, v in (params or {}).items() if v is not None})
        target = f"{path}?{query}" if query else path
        try:
            status, text = await asyncio.wait_for(self._exchange(method, target, body), self.timeout_s)
        except TimeoutError as exc:
            raise AgentUnreachable(f"{self.socket_path}: no answer within {self.timeout_s:g} s") from exc
        except FileNotFoundError as exc:
            raise AgentUnreachable(f"{self.socket_path}: no such socket (is the agent running?)") from exc
        except ConnectionRefusedError as exc:
            raise AgentUnreachable(f"{self.socket_path}: connection refused (agent not running?)") from exc
        except PermissionError as exc:
            raise AgentUnreachable(f"{self.socket_path}: permission denied "
                                   "(are you in the operators' group?)") from exc
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            raise AgentUnreachable(f"{self.socket_path}: {_describe(exc)}") from exc
        try:
            data = json.loads(text) if text else {}
        except ValueError as exc:
            raise AgentUnreachable(f"{self.socket_path}: answer to {path} is not JSON (HTTP {status})") from exc
        if not isinstance(data, dict):
            raise AgentUnreachable(f"{self.socket_path}: answer to {path} is not a JSON object")
        if status >= 400:
            raise AgentRefused(status, str(data.get("error", "error")), str(data.get("message", text.strip())))
        return data

    async def _exchange(self, method: str, target: str, body: dict[str, Any] | None) -> tuple[int, str]:
        reader, writer = await asyncio.open_unix_connection(self.socket_path)
        try:
            payload = json.dumps(body).encode() if body is not None else b""
            head = (f"{method} {target} HTTP/1.1\r\nHost: lynxtop-agent\r\nConnection: close\r\n"
                    "Accept: application/json\r\n")
            if body is not None:
                head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
            writer.write(head.encode() + b"\r\n" + payload)
            await writer.drain()
            status_line = await reader.readline()
            parts = status_line.decode("latin-1").split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
                raise ValueError(f"not an HTTP answer: {status_line[:60]!r}")
            status = int(parts[1])
            headers: dict[str, str] = {}
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            if headers.get("transfer-encoding", "").lower() == "chunked":
                data = await _read_chunked(reader)
            elif "content-length" in headers:
                length = int(headers["content-length"])
                if length > MAX_BODY:
                    raise ValueError(f"answer of {length} bytes is too large")
                data = await reader.readexactly(length)
            else:
                data = await reader.read(MAX_BODY)
            return status, data.decode("utf-8", errors="replace")
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass

    async def status(self) -> dict[str, Any]:
        return await self._request("GET", "/v1/status")

    async def profiles(self) -> dict[str, Any]:
        return await self._request("GET", "/v1/profiles")

    async def runs(self, limit: int = 50) -> list[dict[str, Any]]:
        return list((await self._request("GET", "/v1/runs", {"limit": limit})).get("runs", []))

    async def events(self, since_ms: int | None = None, limit: int = 500) -> list[dict[str, Any]]:
        data = await self._request("GET", "/v1/events", {"since": since_ms, "limit": limit})
        return list(data.get("events", []))

    async def logs(self, run_id: int | None = None, lines: int = 2000) -> dict[str, Any]:
        return await self._request("GET", "/v1/logs", {"run": run_id, "lines": lines})

    async def action(self, action: str, profile: str | None = None) -> dict[str, Any]:
        """POST a mutating call; returns the 202 answer ({"accepted", "action", "message"})."""
        if action not in MUTATING_ACTIONS:
            raise ValueError(f"unknown action {action!r}")
        return await self._request("POST", f"/v1/{action}", body={"profile": profile} if profile else {})

    async def close(self) -> None:
        self._closed = True


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while True:
        size_line = await reader.readline()
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            await reader.readline()
            return bytes(out)
        out += await reader.readexactly(size)
        await reader.readline()
        if len(out) > MAX_BODY:
            raise ValueError("answer is too large")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.IncompleteReadError):
        return "agent closed the connection mid-answer"
    if isinstance(exc, ConnectionResetError):
        return "agent closed the connection"
    return str(exc) or type(exc).__name__
