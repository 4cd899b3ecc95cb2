"""Where the dashboard reads a node from: the `NodeSource` protocol and its implementations (issue 27).

Screens ask `self.app.source`, never a client: live over the agent's socket (`LiveSource`), another node's
read-only TCP endpoint (`LiveSource(..., read_only=...)`), or a history database replayed read-only
(`ReplaySource`). Tests drive the screens with an in-memory source, without a socket or an agent.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from lynxtop.contract.client import (
    CLI_TIMEOUT_S,
    AgentRefused,
    AgentUnreachable,
    AgentUnreadable,
    _action_body,
    decode,
    typed,
    unreachable,
)
from lynxtop.contract.status import Status
from lynxtop.tui.foreign import DisplayClient, escaped

if TYPE_CHECKING:  # the records are imported with the first answer holding one (contract/client.py)
    from concurrent.futures import Future

    from lynxtop.contract.events import Event
    from lynxtop.contract.processes import GpuProcesses
    from lynxtop.contract.records import ActionAnswer, ProfileList, RunInfo


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


# A control waits for its answer as long as the CLI does: the agent answers at once (202), but a loop busy for a
# moment must not turn an accepted restart into a failure; reads keep their short timeout (DASHBOARD_TIMEOUT_S).
CONTROL_TIMEOUT_S = CLI_TIMEOUT_S
# Failures to connect: the request never left, so the control was not sent. Anything later may have reached it.
NOT_SENT = (FileNotFoundError, ConnectionRefusedError, PermissionError)


class ControlUnanswered(AgentUnreachable):
    """A control request went out and no answer came back (none in time, or the connection broke mid-answer):
    the agent may have acted on it, so it is never reported as 'not sent', and never retried."""


def read_only_refusal(action: str, reason: str) -> AgentRefused:
    """The refusal a read-only source gives an action: a 403 like the agent's own, so the app shows it the same way
    (and turns read-only)."""
    return AgentRefused(403, "read_only", f"{action} not sent: {reason}")


def lynxtop_status(status: Status, where: str) -> Status:
    """`status` if it can be a lynxtop agent's answer, else `AgentUnreadable` (shown as the node's error, never as
    a node). Every agent's status has its time (`ts_ms`) and its host from its first answer on (it answers once it
    runs: agent/status_view.py); JSON with neither, `{"serving": {"state": "nope"}}` from another program on the
    port, would otherwise read as an idle node: every field defaulted, STOPPED."""
    if status.ts_ms is None and not status.agent.host:
        raise AgentUnreadable(f"{where}: answer not a lynxtop status: it has no ts_ms and no agent.host (another "
                              "program on this socket or port?)")
    return status


class LiveSource(DisplayClient):
    """The agent over its unix socket, or another node's read-only TCP endpoint `http://HOST:PORT`
    (`read_only` then says why); every answer's strings escaped for the screen (`DisplayClient`)."""

    def __init__(self, endpoint: str | Path, *, read_only: str | None = None, **kw: Any):
        super().__init__(endpoint, **kw)
        self.label = str(endpoint)
        self.read_only = read_only
        self._early: Future[Status] | None = None  # the status asked for by prefetch_status(), not yet taken
        self.control_timeout_s = CONTROL_TIMEOUT_S  # controls wait longer than reads (timeout_s)

    def prefetch_status(self) -> None:
        """Ask for the status now, in a thread, while the dashboard's modules import (cli/dashboard_cmd.py): the
        answer is there when the app starts, so its first paint is the full frame rather than empty panels waiting
        a round trip for the agent. The thread reads as `status()` does (same escaping, typing, checks and timeout as a
        poll); the next `status()` or `first_status()` takes its answer."""
        import threading
        from concurrent.futures import Future

        early: Future[Status] = Future()

        def fetch() -> None:
            import asyncio

            try:
                early.set_result(asyncio.run(self._read_status()))
            except BaseException as exc:  # handed to the poll that takes it, as its own request would raise it
                early.set_exception(exc)

        self._early = early
        threading.Thread(target=fetch, name="lynxtop-first-status", daemon=True).start()

    def first_status(self) -> Status | None:
        """The prefetched status if it has already arrived (never waits; a failure is left to the first poll)."""
        early = self._early
        if early is None or not early.done() or early.exception() is not None:
            return None
        self._early = None
        return early.result()

    async def _read_status(self) -> Status:
        return lynxtop_status(await DisplayClient.status(self), self.label)

    async def status(self) -> Status:
        early, self._early = self._early, None
        if early is None:
            return await self._read_status()
        import asyncio

        return await asyncio.wrap_future(early)  # the thread's request has its own timeout

    async def action(self, action: str, profile: str | None = None, **extra: Any) -> ActionAnswer:
        """POST a control with `expect_run` as given, null included (the run the operator saw, or none); a
        failure after the request left is `ControlUnanswered`, never 'not sent'."""
        from lynxtop.contract.records import ActionAnswer

        # Refused here, not sent: another node's endpoint has no control route, and its 404 would say less.
        if self.read_only:
            raise read_only_refusal(action, self.read_only)
        body = _action_body(action, profile, extra)
        if "expect_run" in extra:  # null means "saw no run", which the shared body builder would drop
            body["expect_run"] = extra["expect_run"]
        path = f"/v1/{action}"
        data = await escaped(self._post_control(path, body))
        return typed(self.socket_path, f"POST {path}", ActionAnswer.from_json, data)

    async def _post_control(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """The POST within `control_timeout_s`; only a failure to connect is `AgentUnreachable` (not sent)."""
        import asyncio

        if self._closed:
            raise AgentUnreachable(f"{self.socket_path}: client closed")
        timeout_s = self.control_timeout_s
        try:
            status, raw = await asyncio.wait_for(self._exchange("POST", path, body), timeout_s)
        except NOT_SENT as exc:
            raise unreachable(exc, self.socket_path, timeout_s) from None
        except TimeoutError:  # before OSError: it is one
            raise ControlUnanswered(f"no answer within {timeout_s:g} s") from None
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            raise ControlUnanswered(f"no answer: {unreachable(exc, self.socket_path, timeout_s)}") from None
        return decode(status, raw, self.socket_path)


REPLAY_HOST = "replay"


class ReplaySource:
    """A history database read as a node, read-only (`lynxtop.store` through `HistorySource`): the status is
    rebuilt from the newest stored samples and the newest run, events and runs come from their tables. Nothing
    is live, so there are no logs, no processes and no actions; each says so as a refusal.

    Each read opens a short-lived reader in a worker thread (history_source.py says why).
    """

    def __init__(self, database: str | Path):
        from lynxtop.tui.history_source import HistorySource

        self.history = HistorySource(database)
        self.label = f"replay of {database}"
        self.read_only = self.label  # the header's READ-ONLY flag names the replay

    async def _read(self, what: str, read: Any) -> Any:
        import asyncio

        from lynxtop.contract.client import AgentUnreachable
        from lynxtop.tui.history_source import HistoryUnavailable

        def run() -> Any:
            with self.history.reader() as reader:
                return read(reader)

        try:
            return await asyncio.to_thread(run)
        except HistoryUnavailable as exc:
            raise AgentUnreachable(f"{self.label}: {exc}") from None
        except Exception as exc:  # a damaged database reads as an unreachable node, never a traceback
            raise AgentUnreachable(f"{self.label}: cannot read {what}: {type(exc).__name__}: {exc}") from None

    async def status(self) -> Status:
        return await self._read("the newest samples", _replayed_status)

    async def events(self, since_ms: int | None = None, limit: int = 500) -> list[Event]:
        return await self._read("events", lambda r: r.events(since_ms=since_ms, limit=limit))

    async def runs(self, limit: int = 50) -> list[RunInfo]:
        return await self._read("runs", lambda r: r.runs(limit=limit))

    async def profiles(self) -> ProfileList:
        raise read_only_refusal("profiles", f"{self.label} is read-only")

    async def logs(self, run_id: int | None = None, lines: int = 2000, after: int | None = None,
                   inode: int | None = None) -> dict[str, Any]:
        raise AgentRefused(404, "not_stored", f"{self.label}: logs are not stored in the history database")

    async def processes(self) -> GpuProcesses:
        raise AgentRefused(404, "not_stored", f"{self.label}: processes are not replayed")

    async def action(self, action: str, profile: str | None = None, **extra: Any) -> ActionAnswer:
        raise read_only_refusal(action, "replay is read-only")

    async def close(self) -> None:
        pass


def _replayed_status(reader: Any) -> Status:
    """A `Status` from the newest stored GPU, host and serving samples and the newest run; raises
    ValueError when the database holds no samples at all (read as an unreachable node)."""
    gpu_rows = reader.latest("gpu")
    host = reader.latest("host")
    serving = reader.latest("serving")
    if not (gpu_rows or host or serving):
        raise ValueError("no samples stored")
    facts = {f.get("idx"): f for f in reader.gpus()}
    runs = reader.runs(limit=1)
    run = runs[0] if runs else None
    ts_ms = max(row["ts_ms"] for row in (*gpu_rows, *host, *serving))
    gpus = []
    for row in sorted(gpu_rows, key=lambda r: r["gpu"]):
        fact = facts.get(row["gpu"]) or {}
        gpu = {**{k: v for k, v in fact.items() if k != "idx"}, **row, "index": row["gpu"]}
        if gpu.get("gpm_supported") is not None:  # SQLite gives the stored flag back as 0/1; the status holds a bool
            gpu["gpm_supported"] = bool(gpu["gpm_supported"])
        gpus.append(gpu)
    state = "stopped" if run is None or run.ended_ms is not None else "ready" if run.ready_ms else "starting"
    return Status.from_json({
        "ts_ms": ts_ms,
        "agent": {"host": (run.host if run else None) or REPLAY_HOST, "simulated": bool(run and run.simulated)},
        "serving": {"state": state, "profile": run.profile if run else None, "run_id": run.id if run else None,
                    "model": run.model if run else None, "started_ms": run.started_ms if run else None,
                    "ready_ms": run.ready_ms if run else None, "vllm_version": run.vllm_version if run else None},
        "gpus": gpus,
        "host": host[0] if host else {},
        "serving_metrics": serving[0] if serving and state == "ready" else {},
    })
