"""The fleet behind the head's dashboard: each Ray node with its agent's own status, read-only.

The head's status lists the nodes Ray knows (`cluster.nodes`); it does not know the other agents. Each node's agent
is read at its read-only TCP endpoint, `http://<node ip>:<port>/v1/status` (the `[agent] metrics_listen` listener,
which has no control route), `port` being the head's own metrics_listen port unless the dashboard is told another
(`--node-port`): a fleet shares one config. The head's own row is its control socket. Every node is read at once,
each with a short timeout, so a node that does not answer costs its own row, never the others'.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lynxtop.contract.client import AgentClient, AgentRefused, AgentUnreachable
from lynxtop.contract.events import Event
from lynxtop.contract.records import RecordError, RunInfo, read_list
from lynxtop.contract.status import ClusterNode, Role, Status
from lynxtop.contract.terminal import terminal_safe
from lynxtop.tui.foreign import DisplayReader
from lynxtop.tui.history_source import HistorySource, HistoryUnavailable
from lynxtop.tui.source import LiveSource

NODE_TIMEOUT_S = 2.0  # one node's status; the list redraws when all have answered or timed out


@dataclass(frozen=True)
class NodeRow:
    """One node: Ray's view of it, where its agent is read, and what that agent said (or why it said nothing)."""

    node: ClusterNode
    endpoint: str | None  # the head's socket path, or http://IP:PORT; None: no way to read it
    status: Status | None = None
    error: str | None = None

    @property
    def label(self) -> str:
        return self.node.name or self.node.ip or self.node.node_id[:8]

    @property
    def ttft_p99_ms(self) -> float | None:
        return self.status.serving_metrics.metric("ttft_p99_ms") if self.status is not None else None


@dataclass(frozen=True)
class Fleet:
    """The head's answer and a row per node; `problem` says why there are no rows (not a head, head down)."""

    head: Status | None
    rows: tuple[NodeRow, ...] = ()
    problem: str | None = None


def endpoint_of(node: ClusterNode, head_socket: str | Path, port: int | None) -> str | None:
    """Where `node`'s agent is read: the head through its socket, another node at http://IP:PORT."""
    if node.head:
        return str(head_socket)
    if port is None or not node.ip:
        return None
    return f"http://[{node.ip}]:{port}" if ":" in node.ip else f"http://{node.ip}:{port}"


def no_endpoint_reason(node: ClusterNode, port: int | None) -> str:
    if not node.ip:
        return "Ray reports no address for this node"
    return "no read-only endpoint: set [agent] metrics_listen (one port on every node) or --node-port"


async def _read(endpoint: str) -> Status:
    client = LiveSource(endpoint, read_only="another node's read-only endpoint", timeout_s=NODE_TIMEOUT_S)
    try:
        return await client.status()
    finally:
        await client.close()


class ElsewhereHistory(HistorySource):
    """Another node's history when this dashboard has no read token for it: every view that reads history says
    where the database is and what to configure (`problem`: why the token could not be read)."""

    def __init__(self, label: str, problem: str | None = None):
        super().__init__(None)
        self.label = f"node {label}"
        # the fix first: a view shows this on one line, and cuts what is past its width
        self.why = (f"node {label}'s history database is on that node: set --node-token-file to its [agent] "
                    "tcp_token_file (tcp_reads = true there)" + (f"; the token file {problem}" if problem else ""))

    @contextmanager
    def reader(self) -> Iterator[Any]:
        raise HistoryUnavailable(self.why)
        yield  # a generator, as the context manager needs


class ClusterSource:
    """Reads the head, then every node Ray lists, at once."""

    def __init__(self, head_socket: str | Path, port: int | None):
        self.head_socket = str(head_socket)
        self.port = port

    async def poll(self) -> Fleet:
        try:
            head = await _read(self.head_socket)
        except (AgentUnreachable, AgentRefused) as exc:
            return Fleet(None, problem=f"the head's agent: {exc}")
        cluster = head.cluster
        if cluster.role != Role.HEAD:
            return Fleet(head, problem=f"this node is not a Ray head (agent.role = {cluster.role.value}): there "
                                       "is no cluster to list")
        if not cluster.nodes:
            return Fleet(head, problem=cluster.view_error or "Ray lists no node yet")
        nodes = [n for n in cluster.nodes if n.alive or n in cluster.lost_nodes]  # not a rejoined node's old entry
        rows = await asyncio.gather(*(self._row(n, head) for n in nodes))
        return Fleet(head, tuple(rows))

    async def _row(self, node: ClusterNode, head: Status) -> NodeRow:
        endpoint = endpoint_of(node, self.head_socket, self.port)
        if node.head:
            return NodeRow(node, endpoint, head)
        if not node.alive:
            return NodeRow(node, endpoint, error=f"lost: {node.state_message or 'dead in Ray'}")
        if endpoint is None:
            return NodeRow(node, None, error=no_endpoint_reason(node, self.port))
        try:
            return NodeRow(node, endpoint, await _read(endpoint))
        except AgentRefused as exc:
            return NodeRow(node, endpoint, error=f"{endpoint} answered {exc.status}: {exc.message}")
        except (AgentUnreachable, ValueError) as exc:
            return NodeRow(node, endpoint, error=str(exc))


class RemoteHistory(HistorySource):
    """Another node's history read over its TCP endpoint with the read token (`GET /v1/history`, served by that
    agent's own store reader: agent/api/tcpreads.py): the History, Events and Compare views work as on the node.

    `reader()` yields a reader with the store reader's methods the screens call, each one request (blocking: the
    screens read history in worker threads). A refusal is a HistoryUnavailable saying why and what to configure.
    """

    def __init__(self, label: str, endpoint: str, token: str, timeout_s: float = 10.0):
        super().__init__(None)
        self.label = f"node {label} ({endpoint})"
        self.node = label
        self._client = AgentClient(endpoint, timeout_s=timeout_s, token=token)

    @contextmanager
    def reader(self) -> Iterator[Any]:
        yield DisplayReader(RemoteReader(self))

    def get(self, read: str, **params: Any) -> dict[str, Any]:
        try:
            return self._client.request("GET", "/v1/history", {"read": read, **params})
        except AgentRefused as exc:
            filters = [k for k, v in params.items() if k in FILTERS and v is not None]
            if exc.status == 400 and exc.code == "unknown_parameter" and filters:
                raise FiltersUnsupported(self.node, read, filters) from None
            if exc.status == 400 and exc.code == "unknown_read":
                raise ReadUnsupported(f"node {self.node}'s agent serves no read={read} (an agent older than this "
                                      f"dashboard): {terminal_safe(exc.message)}") from None
            raise HistoryUnavailable(refusal_text(self.node, exc)) from None
        except AgentUnreachable as exc:
            if "HTTP 404" in str(exc):  # an agent from before tcp_reads: its listener's plain-text 404
                raise HistoryUnavailable(f"node {self.node}'s agent serves no history over TCP (404: an agent older "
                                         "than this dashboard?)") from None
            raise HistoryUnavailable(f"node {self.node}: {terminal_safe(exc)}") from None


# gpu_identities' segments at most, as the agent caps them (agent/api/tcpreads.py MAX_SEGMENTS)
MAX_SEGMENTS = 4096
# The history reads' filters (agent/api/tcpreads.py) an agent from before s21 refuses as unknown parameters
FILTERS = frozenset({"kinds", "severities", "kind_family", "text", "run_ids"})


class ReadUnsupported(HistoryUnavailable):
    """The node's agent is older and knows no such read (its 400 unknown_read): a view that can do without it
    (the History view's board changes) goes on without; any other is told, as another refusal."""


class FiltersUnsupported(TypeError):
    """The node's agent is older and takes no filter on this read. A TypeError saying "unexpected keyword", as a
    reader without the parameter raises: the views then read the newest rows and filter them, saying so."""

    def __init__(self, node: str, read: str, filters: list[str]):
        super().__init__(f"unexpected keyword argument(s) {', '.join(filters)}: node {node}'s agent filters no "
                         f"read={read} (an agent older than this dashboard)")


def _csv(values: Any) -> str | None:
    """A list parameter as the agent reads it (comma-separated); None (not sent) for no filter."""
    return None if values is None else ",".join(str(v) for v in values)


def _rows(rows: Any) -> list[dict[str, Any]]:
    """Series rows as the charts take them: numbers (or null) by column; anything else is refused, never drawn."""
    if not isinstance(rows, list):
        raise ValueError("rows is not a list")
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"row {i} is not an object")
        for key, v in row.items():
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise ValueError(f"row {i}: {key} is not a number")
        out.append(dict(row))
    return out


def _board_segments(segs: Any) -> list[dict[str, Any]]:
    """gpu_identities' segments as the History view takes them: {gpu, uuid, since_ms, until_ms}, the index and
    times integers (or null), the UUID a string, escaped here: another node's text, and DisplayReader leaves this
    read alone (a local export writes the stored UUIDs exactly). Anything else is refused, never shown; a longer
    list than the agent's cap is no answer of ours."""
    if not isinstance(segs, list):
        raise ValueError("segments is not a list")
    if len(segs) > MAX_SEGMENTS:
        raise ValueError(f"{len(segs)} segments (at most {MAX_SEGMENTS})")
    out = []
    for i, s in enumerate(segs):
        if not isinstance(s, dict):
            raise ValueError(f"segment {i} is not an object")
        if not isinstance(s.get("uuid"), str):
            raise ValueError(f"segment {i}: uuid is not a string")
        for key in ("gpu", "since_ms", "until_ms"):
            v = s.get(key)
            if (v is None and key != "gpu") or (isinstance(v, int) and not isinstance(v, bool)):
                continue
            raise ValueError(f"segment {i}: {key} is not an integer")
        out.append({"gpu": s["gpu"], "uuid": terminal_safe(s["uuid"]), "since_ms": s.get("since_ms"),
                    "until_ms": s.get("until_ms")})
    return out


def refusal_text(node: str, exc: AgentRefused) -> str:
    """What a refusal of another node's reads means, and what to configure; its message (foreign text) escaped."""
    if exc.status == 401:
        return (f"node {node} refused this dashboard's read token (401): give --node-token-file that node's "
                "[agent] tcp_token_file")
    if exc.status == 403:
        return f"node {node} serves no history over TCP (403): {terminal_safe(exc.message)}"
    if exc.status == 404:
        return f"node {node}'s agent serves no history over TCP (404: an agent older than this dashboard?)"
    return f"node {node} answered {exc.status}: {terminal_safe(exc.message)}"


class RemoteReader:
    """The store reader's reads the screens use (runs, run, events, series, bench_results, gpu_identities), over
    HTTP."""

    def __init__(self, source: RemoteHistory):
        self._source = source

    def _typed(self, what: str, read: Any, data: Any) -> Any:
        try:
            return read(data)
        except (RecordError, ValueError, TypeError, KeyError) as exc:
            raise HistoryUnavailable(f"node {self._source.node} answered {what} that this lynxtop cannot read: "
                                     f"{terminal_safe(exc)}") from None

    def runs(self, limit: int = 50, text: str | None = None) -> list[RunInfo]:
        data = self._source.get("runs", limit=limit, text=text or None)
        return self._typed("runs", lambda d: read_list(RunInfo, d["runs"], "runs"), data)

    def run(self, run_id: int, summary: bool = True) -> RunInfo | None:
        data = self._source.get("run", id=run_id, summary=int(bool(summary)))
        return self._typed("a run", lambda d: RunInfo.from_json(d["run"]) if d["run"] is not None else None, data)

    def events(self, since_ms: int | None = None, until_ms: int | None = None, run_id: int | None = None,
               limit: int = 500, kinds: list[str] | None = None, severities: list[str] | None = None,
               kind_family: str | None = None, text: str | None = None) -> list[Event]:
        """As StoreReader.events: every filter applied in that node's database, before the limit."""
        data = self._source.get("events", since=since_ms, until=until_ms, run=run_id, limit=limit,
                                kinds=_csv(kinds or None), severities=_csv(severities or None),
                                kind_family=kind_family or None, text=text or None)
        return self._typed("events", lambda d: read_list(Event, d["events"], "events"), data)

    def series(self, table: str, columns: list[str] | tuple[str, ...] | None, start_ms: int, end_ms: int,
               gpu: int | None = None, max_points: int = 2000) -> tuple[str, list[dict[str, Any]]]:
        data = self._source.get("series", table=table, columns=",".join(columns or ()) or None, start=start_ms,
                                end=end_ms, gpu=gpu, max_points=max_points)
        return self._typed("series", lambda d: (str(d["resolution"]), _rows(d["rows"])), data)

    def gpu_identities(self) -> list[dict[str, Any]]:
        """As StoreReader.gpu_identities: which board each index held when, for the History view's board changes.
        An agent from before s24 knows no such read: none told, as for a file that records none."""
        try:
            data = self._source.get("gpu_identities")
        except ReadUnsupported:
            return []
        return self._typed("board segments", lambda d: _board_segments(d["segments"]), data)

    def bench_results(self, limit: int = 50, run_ids: Any = None) -> list[dict[str, Any]]:
        """As StoreReader.bench_results: `run_ids` (an iterable of run ids) chosen in that node's database."""
        data = self._source.get("bench_results", limit=limit, run_ids=_csv(run_ids))
        return self._typed("bench results", lambda d: [dict(r) for r in d["results"]], data)
