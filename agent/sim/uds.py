"""A tiny HTTP client for the agent's unix control socket (aiohttp's UnixConnector), for the demo's status."""

from __future__ import annotations

import json
from typing import Any

import aiohttp


class AgentUnreachable(Exception):
    """The socket is absent, refuses, or the answer is not JSON; the message says which."""


async def call(socket_path: str, method: str, path: str, body: dict | None = None,
               timeout_s: float = 5.0) -> tuple[int, Any]:
    """(HTTP status, decoded JSON) of one control API call."""
    try:
        conn = aiohttp.UnixConnector(path=socket_path)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=timeout_s)) as s, \
                s.request(method, "http://lynxtop-agent" + path, json=body) as r:
            text = await r.text()
            try:
                return r.status, json.loads(text) if text else None
            except ValueError:
                raise AgentUnreachable(f"{socket_path}: {method} {path}: answer is not JSON: {text[:120]!r}") from None
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise AgentUnreachable(f"{socket_path}: {method} {path}: {type(exc).__name__}: {exc}") from None
