"""Where the dashboard reads a node from: the `NodeSource` protocol and its implementations (issue 27).

Screens ask `self.app.source`, never a client: live over the agent's socket (`LiveSource`), another node's
read-only TCP endpoint (`LiveSource(..., read_only=...)`), or a history database replayed read-only
(`ReplaySource`). Tests drive the screens with an in-memory source, without a socket or an agent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from lynxtop.contract.client import AgentRefused
from lynxtop.contract.events import Event
from lynxtop.contract.processes import GpuProcesses
from lynxtop.contract.records import ActionAnswer, ProfileList, RunInfo
from lynxtop.contract.status import Status
from lynxtop.tui.foreign import DisplayClient


@runtime_checkable
class NodeSource(Protocol):
    """The reads the screens need and the control actions, as the contract's typed records.

    Failures are the client's two exceptions (`AgentUnreachable`, `AgentRefused`), whatever the source, so a
    screen handles a replay's refusal exactly as an agent's.
    """

    label: str  # where the data comes from, for a title or a message

    async def status(self) -> Status: ...

    async def events(self, since_ms: int | None = None, limit: int = 500) -> list[Event]: ...

    async def runs(self, limit: int = 50) -> list[RunInfo]: ...

    async def profiles(self) -> ProfileList: ...

    async def logs(self, run_id: int | None = None, lines: int = 2000, after: int | None = None,
                   inode: int | None = None) -> dict[str, Any]: ...

    async def processes(self) -> GpuProcesses: ...

    async def action(self, action: str, profile: str | None = None, **extra: Any) -> ActionAnswer: ...

    async def close(self) -> None: ...


def read_only_refusal(action: str, reason: str) -> AgentRefused:
    """The refusal a read-only source gives an action: a 403 like the agent's own, so the app shows it the same way
    (and turns read-only)."""
    return AgentRefused(403, "read_only", f"{action} not sent: {reason}")


class LiveSource(DisplayClient):
    """The agent over its unix socket, or another node's read-only TCP endpoint `http://HOST:PORT`
    (`read_only` then says why); every answer's strings escaped for the screen (`DisplayClient`)."""

    def __init__(self, endpoint: str | Path, *, read_only: str | None = None, **kw: Any):
        super().__init__(endpoint, **kw)
        self.label = str(endpoint)
        self.read_only = read_only

    async def action(self, action: str, profile: str | None = None, **extra: Any) -> ActionAnswer:
        # Refused here, not sent: another node's endpoint has no control route, and its 404 would say less.
        if self.read_only:
            raise read_only_refusal(action, self.read_only)
        return await super().action(action, profile, **extra)

