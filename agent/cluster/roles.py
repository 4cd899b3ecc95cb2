"""A node's part in a multi-node deployment (agent.role head or worker): its Ray, and on the head the cluster.

Node composes this beside the supervisor; on a single node there is none. The head's vLLM start waits at
`ClusterWatch.missing` (the supervisor's gate); a worker runs no vLLM at all, so its start and stop act on Ray, and
it tells processes on its GPUs that are not Ray's (gpus.py: given the node's GPU view, `gpus`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from lynxtop.agent.api.control import ActionError
from lynxtop.agent.cluster import stop as cluster_stop
from lynxtop.agent.cluster.gpus import WorkerGpus
from lynxtop.agent.cluster.raynode import SOCKET_ENV, RayNode
from lynxtop.agent.cluster.view import ClusterWatch, RayStateApi
from lynxtop.agent.serving.gpu_holders import GpuProcesses
from lynxtop.contract.config import Config, ray_executable
from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.contract.status import ClusterStatus, Role

log = logging.getLogger(__name__)

CLUSTER_STOP_TIMEOUT_S = 120.0


class ClusterPart:
    def __init__(self, cfg: Config, record: Callable[[Event], None], *, state_dir: Path,
                 session: Callable[[], aiohttp.ClientSession], on_change: Callable[[], None] | None = None,
                 gpus: GpuProcesses | None = None):
        self.cfg = cfg
        self.role = Role(cfg.agent.role)
        self._record = record
        self.ray = RayNode(cfg, record, state_dir=state_dir, on_change=on_change)
        self.watch: ClusterWatch | None = None
        if self.role == Role.HEAD:
            # the address and dashboard of the Ray that runs: an adopted one keeps its own until Ray next starts
            self.watch = ClusterWatch(RayStateApi(session, lambda: self.ray.dashboard_port), record,
                                      interval_s=cfg.ray.view_interval_s, ray_running=self._ray_not_running,
                                      address=lambda: self.ray.address, on_change=on_change)
        self.gpus: WorkerGpus | None = None  # a worker's look at its GPUs for processes that are not Ray's
        if self.role == Role.WORKER and gpus is not None:
            node = cfg.ray.node_ip_address or socket.gethostname()
            self.gpus = WorkerGpus(gpus, self.ray, record, interval_s=cfg.ray.view_interval_s, node=node,
                                   on_change=on_change)
        self._tasks: list[asyncio.Task] = []
        self.stopping_cluster = False

    def _ray_not_running(self) -> str | None:
        return None if self.ray.running else f"{self.ray.state}: {self.ray.reason}"

    async def boot(self) -> None:
        await self.ray.boot()
        if self.watch is not None:
            self._tasks.append(asyncio.get_running_loop().create_task(self.watch.run(), name="cluster-watch"))
        if self.gpus is not None:
            self._tasks.append(asyncio.get_running_loop().create_task(self.gpus.run(), name="worker-gpus"))

    async def shutdown(self, stop_ray: bool) -> None:
        for t in self._tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self.ray.shutdown(stop_ray)

    def status(self, gpus_needed: int | None) -> ClusterStatus:
        r, w = self.ray, self.watch
        return ClusterStatus(
            role=self.role, ray_state=r.state, ray_reason=r.reason, ray_since_ms=r.since_ms,
            ray_pid=r.proc.pid if r.proc is not None and not r.proc.exited else None,
            ray_next_retry_ms=r.next_retry_ms, ray_failures=len(r.failures), address=r.address,
            nodes=w.nodes if w else (), view_ms=w.view_ms if w else None, view_error=w.view_error if w else None,
            gpus_needed=gpus_needed, gpus_taken=self.gpus.taken if self.gpus else (),
            gpus_taken_since_ms=self.gpus.since_ms if self.gpus else None)

    # ------------------------------------------------------------------------------------- actions

    async def ray_start(self, by: str) -> str:
        return await self.ray.start(by)

    async def ray_stop(self, by: str, reason: str | None) -> str:
        if self.role == Role.HEAD and not self.stopping_cluster:
            raise ActionError("role", "this is the Ray head: its Ray stops with `lynxtop stop --cluster` (serving "
                                      "stops first, then the workers' Ray, then the head's)", 409)
        who = f"{by}" + (f": {reason}" if reason else "")
        self.ray.refuse_stop_if_stopped(who)
        asyncio.get_running_loop().create_task(self.ray.stop(who), name="ray-stop")  # answer first: the
        # caller may be a Ray task on this node, which this stop ends
        return "stopping Ray on this node; it stays stopped until `lynxtop start` here"

    async def stop_cluster(self, by: str, stop_serving: Callable[[], Awaitable[None]]) -> str:
        """Serving first, then every worker's Ray (asked through Ray), then this head's Ray; in the background."""
        if self.role != Role.HEAD:
            raise ActionError("role", f"this node is a {self.role} node: `lynxtop stop --cluster` runs on the head",
                              409)
        if self.stopping_cluster:
            raise ActionError("busy", "a cluster stop is already in progress", 409)
        self.stopping_cluster = True
        self._tasks.append(asyncio.get_running_loop().create_task(
            self._stop_cluster(by, stop_serving), name="cluster-stop"))
        return "stopping the cluster: serving, then every worker's Ray, then this head's Ray"

    async def _stop_cluster(self, by: str, stop_serving: Callable[[], Awaitable[None]]) -> None:
        try:
            self._record(Event(EventKind.CLUSTER_STOP, Severity.INFO, f"cluster stop requested by {by}",
                               details={"by": by}))
            await stop_serving()
            answers = await self._ask_workers(f"lynxtop stop --cluster on the head ({self.ray.address}) by {by}")
            ok = [a for a in answers if a.get("ok")]
            bad = [a for a in answers if not a.get("ok")]
            text = "; ".join(f"{a.get('ip', '?')}: {a.get('message', '')}" for a in answers) or "no worker was alive"
            self._record(Event(EventKind.CLUSTER_STOP, Severity.WARNING if bad else Severity.INFO,
                               f"cluster stop: {len(ok)} worker(s) stopping their Ray"
                               + (f", {len(bad)} did not" if bad else "") + f" ({text})",
                               details={"nodes": answers}))
            if self.ray.proc is not None and not self.ray.proc.exited:
                await self.ray.stop(f"{by} (lynxtop stop --cluster)")
        finally:
            self.stopping_cluster = False

    async def _ask_workers(self, reason: str) -> list[dict[str, Any]]:
        if not self.ray.running:
            return []
        exe, _ = ray_executable(self.cfg.ray)
        python = _python_of(exe)
        argv = [python, cluster_stop.__file__, self.ray.address, reason]
        env = dict(self.cfg.ray.env) | {"RAY_USAGE_STATS_ENABLED": "0"}
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                stdin=asyncio.subprocess.DEVNULL, env={**_base_env(), **env})
            out, err = await asyncio.wait_for(proc.communicate(), CLUSTER_STOP_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            return [{"ok": False, "ip": "?", "message": f"could not ask the workers through Ray: {exc}"}]
        lines = out.decode(errors="replace").strip().splitlines()
        try:
            return list(json.loads(lines[-1])["nodes"])
        except (IndexError, ValueError, KeyError, TypeError):
            tail = err.decode(errors="replace").strip().splitlines()[-3:]
            return [{"ok": False, "ip": "?", "message": "could not ask the workers through Ray (exit "
                     f"{proc.returncode}): {' | '.join(tail)}"}]


def _python_of(ray_exe: str) -> str:
    """The interpreter of the `ray` script (its shebang): the environment Ray is installed in."""
    try:
        with open(ray_exe, "rb") as f:
            first = f.readline(512).decode(errors="replace")
    except OSError:
        return sys.executable
    if first.startswith("#!") and Path(first[2:].strip().split()[0]).exists():
        return first[2:].strip().split()[0]
    return sys.executable


def _base_env() -> dict[str, str]:
    """The agent's environment without its socket: the driver is no node's agent."""
    return {k: v for k, v in os.environ.items() if k != SOCKET_ENV}
