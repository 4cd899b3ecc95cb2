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

from lynxtop.contract.client import AgentRefused, AgentUnreachable
from lynxtop.contract.status import ClusterNode, Role, Status
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
    """Another node's history: its database is on that node, so every view that reads history says where."""

    def __init__(self, label: str):
        super().__init__(None)
        self.why = (f"node {label}'s history database is on that node (its read-only endpoint serves live status "
                    "only): open a dashboard there for its history, events and logs")

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
