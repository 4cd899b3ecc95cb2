"""The seam between the control API and whatever carries out actions (the supervisor behind `node.py`).

The API only parses, authorizes and maps errors to HTTP; the controller owns state and policy. Tests can drive
the API with a small fake controller and the supervisor without HTTP.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, Protocol, TypeAlias

from lynxtop.agent.api.pending import EventsAnswer
from lynxtop.contract.events import Event
from lynxtop.contract.processes import GpuProcesses
from lynxtop.contract.records import ProfileList, RunInfo
from lynxtop.contract.status import Status


class ActionError(Exception):
    """A refused control action. `code` is machine-readable, `http_status` what the API answers."""

    def __init__(self, code: str, message: str, http_status: int = 409, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.http_status = http_status
        self.details = details or {}


class AnyRun(enum.Enum):
    """No `expect_run` in the request: the action acts on whatever run is current (scripts, older callers)."""

    ANY = "any"


ANY_RUN = AnyRun.ANY
# The run the caller saw (`ServingStatus.run_id`; None: it saw none), or ANY_RUN. A confirmation is given to what
# the caller was shown; an action that lands after the run changed (another operator's switch) must not act on a
# run nobody confirmed, such as a 20-minute load.
ExpectRun: TypeAlias = int | None | AnyRun


class Controller(Protocol):
    """What `node.Node` answers. Status and profiles come from memory (sync); the history and the logs are read
    from disk in a thread (async: a slow disk never stalls the control socket)."""

    def status(self) -> Status: ...

    def profiles(self) -> ProfileList: ...

    async def runs(self, limit: int) -> list[RunInfo]: ...

    # the events alone, or with why the stored ones are missing (agent/api/pending.py: EventsAnswer)
    async def events(self, since_ms: int | None, limit: int) -> list[Event] | EventsAnswer: ...

    # One of the store reader's reads, `read(reader)`, on the agent's history reader (the TCP endpoint's History)
    async def history(self, read: Callable[[Any], Any]) -> Any: ...

    # `after`/`inode`: a follower's previous answer's `next` and `inode`; only the lines written since (logtail.py)
    async def logs(self, run_id: int | None, lines: int, *, after: int | None = None,
                   inode: int | None = None) -> dict[str, Any]: ...

    # The processes on the GPUs at the last tick, with their user, command and SM share (GET /v1/processes).
    async def processes(self) -> GpuProcesses: ...

    # Mutating actions return at once (202) with a message; progress shows in status and events.
    # `by` names the peer ("uid 1000 (alice) pid 4242") for the event log. `expect_run` (passed only when the
    # request names it): refused with 409 "run_changed", nothing done, unless it is the current run.
    async def start(self, profile: str | None, by: str, expect_run: ExpectRun = ANY_RUN) -> str: ...

    async def stop(self, by: str, cluster: bool = False, expect_run: ExpectRun = ANY_RUN) -> str: ...

    async def restart(self, by: str, expect_run: ExpectRun = ANY_RUN) -> str: ...

    async def switch(self, profile: str, by: str, expect_run: ExpectRun = ANY_RUN) -> str: ...

    # This node's Ray (agent.role head or worker); refused on a single node.
    async def ray_start(self, by: str) -> str: ...

    async def ray_stop(self, by: str, reason: str | None) -> str: ...

    # `lynxtop bench` hands each finished level to the agent, the database's one writer (docs/bench.md).
    async def store_bench(self, result: dict[str, Any], by: str) -> str: ...
