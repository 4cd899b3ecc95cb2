"""The dashboard's side of the control API: JSON over the agent's unix socket (docs/contracts.md).

Every failure becomes one of two exceptions so screens never see aiohttp: `AgentUnreachable` (nothing answers,
or the answer is not the API) and `AgentRefused` (the agent answered with an error code and a message).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp

MUTATING_ACTIONS = ("start", "stop", "restart", "switch")


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
    """One keep-alive connection pool per dashboard; must be used from the app's event loop."""

    def __init__(self, socket_path: str | Path, timeout_s: float = 3.0):
        self.socket_path = str(socket_path)
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    def _get_session(self) -> aiohttp.ClientSession:
        if self._closed:
            raise AgentUnreachable(f"{self.socket_path}: client closed")
        if self._session is None or self._session.closed:
            connector = aiohttp.UnixConnector(path=self.socket_path)
            # The host part is ignored on a unix socket; the timeout bounds a hung agent.
            self._session = aiohttp.ClientSession(
                base_url="http://lynxtop-agent",
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            )
        return self._session

    async def _request(self, method: str, path: str, params: dict[str, Any] | None = None,
                       body: dict[str, Any] | None = None) -> dict[str, Any]:
        session = self._get_session()
        clean = {k: str(v) for k, v in (params or {}).items() if v is not None}
        try:
            async with session.request(method, path, params=clean, json=body) as resp:
                text = await resp.text()
                status = resp.status
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
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
        body: dict[str, Any] = {"profile": profile} if profile else {}
        return await self._request("POST", f"/v1/{action}", body=body)

    async def close(self) -> None:
        self._closed = True
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer (timed out)"
    if isinstance(exc, aiohttp.ClientConnectorError):
        err = exc.os_error
        if isinstance(err, FileNotFoundError):
            return "no such socket (is the agent running?)"
        if isinstance(err, ConnectionRefusedError):
            return "connection refused (agent not running?)"
        if isinstance(err, PermissionError):
            return "permission denied (are you in the operators' group?)"
        return str(err) or type(err).__name__
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "agent closed the connection"
    return str(exc) or type(exc).__name__
