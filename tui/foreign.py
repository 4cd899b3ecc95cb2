"""Foreign text on the dashboard: everything the agent answers and the history database holds reaches the
widgets with its control characters escaped (contract/terminal.py), and as Text, never as markup.

The screen's segments are written to the terminal as they are: a vLLM version or a log line holding
`\\x1b[2J` would clear it, and a bidi override would reverse what follows. Escaping at the two doors the
text comes in by (the agent's socket, the database) keeps every widget safe, present and future; the
widgets themselves hand strings to Textual only as Text or with markup off, so `[/]` in a model name is
shown, not parsed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from lynxtop.contract.client import AgentRefused, AsyncAgentClient, parse_status, typed
from lynxtop.contract.status import Status
from lynxtop.contract.terminal import terminal_safe, terminal_safe_json

# StoreReader methods whose rows carry text (names, models, messages, flags); series are numbers only.
TEXT_READS = frozenset({"runs", "run", "events", "bench_results"})


class DisplayClient(AsyncAgentClient):
    """The dashboard's agent client: every answer (status, profiles, runs, events, logs, a refusal) comes back
    with its strings escaped. Profile names the agent accepts hold no control characters (the config refuses them), so
    a name sent back in a switch is the one the agent knows."""

    async def request(self, method: str, path: str, params: Mapping[str, Any] | None = None,
                      body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return await escaped(super().request(method, path, params, body))

    async def status(self) -> Status:
        """The status; one the contract cannot read (a field of another type: contract/status.py) is
        `AgentUnreadable` naming the field, shown as the outage it is, never a crash in the widget it reaches."""
        data = await self.status_json()
        return typed(self.socket_path, "GET /v1/status", lambda d: parse_status(d, self.socket_path), data)


async def escaped(answer: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    """An answer with its strings escaped; a refusal's words too (shown in a notification, in the header)."""
    try:
        return terminal_safe_json(await answer)
    except AgentRefused as exc:
        raise AgentRefused(exc.status, terminal_safe(exc.code), terminal_safe(exc.message),
                           terminal_safe_json(dict(exc.details))) from None


class DisplayReader:
    """A history reader whose text reads come back escaped; everything else (series, the CSV export's
    stream, close) is the reader's own, so an export still writes the stored text exactly."""

    def __init__(self, reader: Any):
        self._reader = reader

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._reader, name)
        if name not in TEXT_READS:
            return attr
        return _escaped(attr)


def _escaped(read: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        return _safe(read(*args, **kwargs))

    return call


def _safe(data: Any) -> Any:
    """`data` escaped; a typed record (a run, an event: contract/records.py) escaped through its JSON, so it stays
    the same type with every string in it escaped."""
    if isinstance(data, list):
        return [_safe(x) for x in data]
    if hasattr(data, "to_json") and hasattr(type(data), "from_json"):
        return type(data).from_json(terminal_safe_json(data.to_json()))
    return terminal_safe_json(data)
