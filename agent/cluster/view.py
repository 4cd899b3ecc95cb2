"""The head's view of the Ray cluster: Ray's own state API, read over HTTP, and what it means for serving.

Ray's dashboard on the head serves its state API (`GET /api/v0/nodes`, what `ray list nodes` reads) on
127.0.0.1; the agent reads it with its HTTP session and never imports ray. The answer names every node Ray has
known since its GCS started, alive or dead, with the GPUs each declared and, for a dead one, Ray's reason (Ray
2.60: "Unexpected termination: health check failed due to missing too many heartbeats" about 12 s after a
worker's raylet was killed). From it: node lost/joined events, and the gate that holds `vllm serve` back until
Ray has the GPUs the profile needs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Callable
from typing import Any, Protocol

import aiohttp

from lynxtop.agent.serving.run import now_ms
from lynxtop.contract.config import Profile
from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.contract.status import ClusterNode, NodeSet, describe_node, gpus_text

log = logging.getLogger(__name__)

NODES_PATH = "/api/v0/nodes?detail=1&limit=10000"
VIEW_TIMEOUT_S = 5.0
FAILED_READS_BEFORE_EVENT = 5  # the dashboard answers a few seconds after `ray start` says Ray is up


class ClusterViewError(Exception):
    pass


class NodeSource(Protocol):
    async def nodes(self) -> list[ClusterNode]: ...


def parse_nodes(body: Any) -> list[ClusterNode]:
    """Ray's `/api/v0/nodes` answer as nodes; ClusterViewError names what is wrong with another shape."""
    try:
        if not body.get("result", False):
            raise ClusterViewError(f"Ray's state API refused: {body.get('msg') or 'no reason given'}")
        rows = body["data"]["result"]["result"]
    except (AttributeError, KeyError, TypeError) as exc:
        raise ClusterViewError(f"Ray's state API answered an unexpected shape (no {exc})") from None
    if not isinstance(rows, list):
        raise ClusterViewError(f"Ray's state API answered an unexpected shape (nodes as {type(rows).__name__})")
    out = []
    for r in rows:
        if not isinstance(r, dict) or not r.get("node_id"):
            continue
        res = r.get("resources_total")
        gpus = res.get("GPU") if isinstance(res, dict) else None
        message = r.get("state_message")
        out.append(ClusterNode(
            node_id=str(r["node_id"]), ip=str(r.get("node_ip") or ""), name=str(r.get("node_name") or ""),
            head=bool(r.get("is_head_node")), alive=r.get("state") == "ALIVE",
            gpus=_gpus(gpus),
            state_message=message if isinstance(message, str) else None,
            start_ms=_ms(r.get("start_time_ms")), end_ms=_ms(r.get("end_time_ms"))))
    return sorted(out, key=lambda n: (not n.head, not n.alive, n.ip, n.node_id))


def _gpus(v: Any) -> float:
    """Ray's GPU count for a node: a finite number >= 0, else 0 (absent, or a type Ray does not send)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return 0.0
    try:
        n = float(v)
    except OverflowError:
        return 0.0
    return n if math.isfinite(n) and n >= 0 else 0.0


def _ms(v: Any) -> int | None:
    """A time in ms from Ray's answer: a positive integer, else None (0 is Ray's "not set"; another type, unread)."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


class RayStateApi:
    """The real source: the head's dashboard on loopback, through the agent's HTTP session."""

    def __init__(self, session: Callable[[], aiohttp.ClientSession], port: int | Callable[[], int]):
        self.session = session
        self._port = port  # a callable: the port of the Ray that runs (an adopted one keeps its own; raynode.py)

    @property
    def url(self) -> str:
        port = self._port() if callable(self._port) else self._port
        return f"http://127.0.0.1:{port}{NODES_PATH}"

    async def nodes(self) -> list[ClusterNode]:
        url = self.url
        try:
            async with self.session().get(url, timeout=aiohttp.ClientTimeout(total=VIEW_TIMEOUT_S)) as resp:
                text = await resp.text()
                if resp.status != 200:
                    raise ClusterViewError(f"Ray's state API at {url} answered HTTP {resp.status}")
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise ClusterViewError(f"Ray's state API at {url} did not answer ({type(exc).__name__}: "
                                   f"{exc or 'timeout'})") from None
        try:
            return parse_nodes(json.loads(text))
        except ValueError:
            raise ClusterViewError(f"Ray's state API at {url} answered something that is not JSON") from None


def _head_id(nodes: tuple[ClusterNode, ...] | list[ClusterNode]) -> str | None:
    return next((n.node_id for n in nodes if n.head), None)


def _changes(before: dict[str, ClusterNode], nodes: list[ClusterNode]) -> list[Event]:
    """Lost: alive in the last view and not now. Joined: alive now and not in the last view."""
    view = NodeSet(tuple(nodes))
    alive = view.alive
    size = f"{len(alive)} node(s), {gpus_text(view.gpus_alive)}"
    now = {n.node_id: n for n in nodes}
    out = [_lost(old, now.get(node_id), size) for node_id, old in before.items()
           if node_id not in now or not now[node_id].alive]
    out += [Event(EventKind.CLUSTER_NODE_JOINED, Severity.INFO,
                  f"node {describe_node(n)} joined the Ray cluster: {size}",
                  details={"node_id": n.node_id, "ip": n.ip, "name": n.name, "gpus": n.gpus})
            for n in alive if n.node_id not in before]
    return out


def _lost(old: ClusterNode, now: ClusterNode | None, size: str) -> Event:
    """A node alive in the last view and not now: dead in Ray's view (`now`, with Ray's reason) or absent."""
    gone = now or old
    why = (now.state_message if now is not None else None) or "no longer in Ray's view"
    return Event(EventKind.CLUSTER_NODE_LOST, Severity.ERROR,
                 f"Ray lost node {describe_node(gone)}: {why}; the cluster has {size} left",
                 details={"node_id": gone.node_id, "ip": gone.ip, "name": gone.name, "gpus": gone.gpus,
                          "state_message": why, "end_ms": now.end_ms if now is not None else None})


class ClusterWatch:
    """Reads Ray's view every `interval_s` (head only); records nodes lost and joined; gates serving."""

    def __init__(self, source: NodeSource, record: Callable[[Event], None], *, interval_s: float,
                 ray_running: Callable[[], str | None], address: str | Callable[[], str] = "",
                 on_change: Callable[[], None] | None = None):
        self.source = source
        self._address = address  # a callable: the running Ray's, which an adopted Ray keeps (raynode.py)
        self._record = record
        self.interval_s = interval_s
        self.ray_running = ray_running  # None when this node's Ray is up, else why not
        self.on_change = on_change
        self.nodes: tuple[ClusterNode, ...] = ()
        self.view_ms: int | None = None
        self.view_error: str | None = None
        self._failed_reads = 0
        self._failure_recorded = False
        self._changed = asyncio.Event()

    @property
    def address(self) -> str:
        """The head's GCS, handed to vLLM as RAY_ADDRESS."""
        return self._address() if callable(self._address) else self._address

    @property
    def view(self) -> NodeSet:
        """The last view's nodes, for their arithmetic (alive, lost, GPUs alive, what a profile lacks)."""
        return NodeSet(self.nodes)

    @property
    def gpus_alive(self) -> float:
        return self.view.gpus_alive

    async def run(self) -> None:
        failing = False
        while True:
            try:
                await self.poll()
                failing = False
            except Exception as exc:  # noqa: BLE001 - a bug in one read must not end the watch for good
                if not failing:
                    log.exception("reading Ray's view of the cluster failed: %s", exc)
                failing = True
                self._set_view(self.nodes, None, f"internal error: {type(exc).__name__}: {exc}")
            await asyncio.sleep(self.interval_s)

    async def poll(self) -> None:
        why_not = self.ray_running()
        if why_not is not None:  # no Ray here: nothing to read (and no failure to report)
            self._failed_reads = 0
            self._set_view((), None, f"this node's Ray is not running ({why_not})")
            return
        try:
            nodes = await self.source.nodes()
        except ClusterViewError as exc:
            self._read_failed(str(exc))
            return
        if self._failure_recorded:
            self._record(Event(EventKind.CLUSTER_VIEW_RESTORED, Severity.INFO, "Ray's view of the cluster can be "
                               f"read again ({len(nodes)} nodes)"))
        self._failed_reads, self._failure_recorded = 0, False
        self._diff(nodes)
        self._set_view(tuple(nodes), now_ms(), None)

    def _set_view(self, nodes: tuple[ClusterNode, ...], view_ms: int | None, error: str | None) -> None:
        changed = nodes != self.nodes or error != self.view_error
        self.nodes, self.view_error = nodes, error
        if view_ms is not None:
            self.view_ms = view_ms
        if changed:
            self._changed.set()
            if self.on_change:
                self.on_change()

    def _read_failed(self, error: str) -> None:
        self._failed_reads += 1
        if self._failed_reads >= FAILED_READS_BEFORE_EVENT and not self._failure_recorded:
            self._failure_recorded = True
            self._record(Event(EventKind.CLUSTER_VIEW_FAILED, Severity.WARNING, f"cannot read Ray's view of the "
                               f"cluster: {error}", details={"error": error}))
        self._set_view(self.nodes if self._failed_reads < FAILED_READS_BEFORE_EVENT else (), None, error)

    def _diff(self, nodes: list[ClusterNode]) -> None:
        """Events for what changed since the last view; the first view (or a new head: a new cluster) sets the
        baseline without events, since what happened before it was not seen."""
        before = {n.node_id: n for n in self.nodes if n.alive}
        if not before or _head_id(self.nodes) != _head_id(nodes):
            if nodes:
                log.info("Ray's cluster: %s", ", ".join(describe_node(n) for n in nodes if n.alive))
            return
        for ev in _changes(before, nodes):
            self._record(ev)

    # ------------------------------------------------------------------------------------- the serving gate

    def missing(self, prof: Profile) -> str | None:
        """None when Ray reports the GPUs `prof` needs; else what is missing, for the operator."""
        need = prof.gpus_needed
        shape = (f"TP {prof.tensor_parallel_size} x PP {prof.pipeline_parallel_size} x "
                 f"DP {prof.data_parallel_size}")
        why_not = self.ray_running()
        if why_not is not None:
            return f"waiting for this node's Ray ({why_not}) before {need} GPUs ({shape}) can be counted"
        if self.view_error is not None or self.view_ms is None:
            return f"waiting for Ray's view of the cluster ({self.view_error or 'not read yet'})"
        shortfall = self.view.shortfall(need)  # in `lynxtop check`'s words too (agent/serving/check.py)
        if shortfall is None:
            return None
        return f"waiting for Ray to report {gpus_text(need)} ({shape}): it has {shortfall}"

    async def wait_change(self, timeout_s: float) -> None:
        """Until the view changes (or `timeout_s`): the gate looks again then."""
        self._changed.clear()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        except TimeoutError:
            pass

