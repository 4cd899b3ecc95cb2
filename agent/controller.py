"""The control API's actions on this node (`Controller`, agent/api/control.py): thin, each one checks the node's
role, calls one part (supervisor, Ray roles, store) and lets its `ActionError` through for the API to map. A start,
restart or switch first waits for the agent's first GPU sample, so that the GPUs' processes are looked at on a real
list (agent/serving/gpu_holders.py: `first_sample`).

Owns the read-only history reader (one connection, one query at a time in a thread) the API's history calls use;
reads the node's parts and changes none of them itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lynxtop.agent.api.control import ANY_RUN, ActionError, ExpectRun
from lynxtop.agent.api.logtail import LogTail
from lynxtop.agent.api.pending import EventsAnswer, held_only, with_pending
from lynxtop.agent.api.processes import describe as describe_processes
from lynxtop.agent.serving.gpu_holders import first_sample
from lynxtop.contract.processes import GpuProcesses
from lynxtop.contract.records import ProfileInfo, ProfileList, RunInfo
from lynxtop.contract.status import (
    ServingState,
    Status,
)

if TYPE_CHECKING:
    from lynxtop.agent.node import Node

MAX_LOG_LINES = 5000


class NodeController:
    def __init__(self, node: Node):
        self._node = node
        self._reader: Any = None
        self._reader_lock = threading.Lock()

    def status(self) -> Status:
        return self._node.status()

    def status_body(self, dumps: Callable[[Any], str]) -> str:
        """`dumps(self.status().to_json())`, the part a tick changes encoded once per tick (agent/status_view.py)."""
        return self._node.status_body(dumps)

    def profiles(self) -> ProfileList:
        sup = self._node.supervisor
        assert sup is not None
        cfg = self._node.config.poll()  # a profile added to the file shows without a restart
        return ProfileList(sup.profile_name, tuple(ProfileInfo(p.name, p.description, p.shown_argv(), p.flags(),
                                                               p.shown_env()) for p in cfg.profiles))  # masked

    def _store_reader(self) -> Any:
        from lynxtop.store.reader import StoreReader

        if self._reader is None:
            writer = self._node.writer
            if not writer.stats().get("unavailable"):  # an unopened writer (full disk) writes nothing to wait for
                writer.flush(2.0)
            try:
                self._reader = StoreReader(self._node.cfg.agent.database, self._node.interval)
            except Exception as exc:  # noqa: BLE001 - StoreError: answer 503 rather than crash
                raise ActionError("store", f"history unavailable: {exc}", 503) from None
        return self._reader

    async def _read(self, fn: Callable[[Any], Any]) -> Any:
        """A history query in a thread (SQLite may wait on a lock), one at a time on the reader's connection."""

        def call() -> Any:
            with self._reader_lock:
                return fn(self._store_reader())

        return await asyncio.to_thread(call)

    async def history(self, read: Callable[[Any], Any]) -> Any:
        """`read(store reader)` on the one history reader: the TCP endpoint's history reads (agent/api/tcpreads.py)."""
        return await self._read(read)

    async def runs(self, limit: int) -> list[RunInfo]:
        return await self._read(lambda r: r.runs(limit=limit))

    async def events(self, since_ms: int | None, limit: int) -> EventsAnswer:
        """The stored events plus those the writer holds during a write outage, marked pending (api/pending.py);
        while the database cannot be opened, the held ones alone and why (never a 503 hiding them)."""
        writer = self._node.writer

        def read(r: Any) -> EventsAnswer:
            held = writer.pending_events() if writer is not None else []  # first: see with_pending
            return EventsAnswer(with_pending(r.events(since_ms=since_ms, limit=limit), held, since_ms, limit))

        try:
            return await self._read(read)
        except ActionError as exc:
            if exc.code != "store":
                raise
            held = writer.pending_events() if writer is not None else []
            return held_only(held, since_ms, limit, exc.message)

    async def logs(self, run_id: int | None, lines: int, *, after: int | None = None,
                   inode: int | None = None) -> dict[str, Any]:
        sup = self._node.supervisor
        assert sup is not None
        lines = max(1, min(int(lines), MAX_LOG_LINES))
        if run_id is None:
            current = sup.run_log()
            if current is None:
                raise ActionError("no_run", "no run yet: nothing has been started by this agent", 404)
            run_id, path = current
        else:
            # the path only: a summary decodes the run's history under the reader's lock (minutes of a long run)
            run = await self._read(lambda r: r.run(run_id, summary=False))
            if run is None:
                raise ActionError("unknown_run", f"no run {run_id}", 404)
            path = run.log_path
        tail = LogTail(path, lines, 4 << 20)  # streamed by the API a block at a time, never built whole
        if after is None:
            await asyncio.to_thread(tail.locate)
        else:
            await asyncio.to_thread(tail.follow, after, inode)
        return {"run_id": run_id, "path": path, "lines": tail}

    async def processes(self) -> GpuProcesses:
        view = self._node.gpu_view
        rows = view.process_rows if view.nvml.get("state") == "ok" else []
        age = None if view.sample_ts is None else max(0.0, time.monotonic() - view.sample_ts)
        proc = self._node.supervisor.proc if self._node.supervisor is not None else None
        return await asyncio.to_thread(describe_processes, rows, age, self._node.cfg.agent.secret_env,
                                       proc.members if proc is not None else None)

    async def start(self, profile: str | None, by: str, expect_run: ExpectRun = ANY_RUN) -> str:
        assert self._node.supervisor is not None
        if self._node.cfg.agent.role == "worker":
            self._node.supervisor.check_seen(expect_run)  # a worker runs no vLLM: its run is none
            if profile:
                raise self._worker_serves_nothing("start", profile)
            return await self.ray_start(by)
        await first_sample(self._node.gpu_view, f"start profile {profile}" if profile else "start")
        return await self._node.supervisor.start(profile, by, expect_run)

    async def stop(self, by: str, cluster: bool = False, expect_run: ExpectRun = ANY_RUN) -> str:
        assert self._node.supervisor is not None
        if cluster:
            if self._node.cluster is None:
                raise ActionError("role", "this node runs no Ray cluster (agent.role = \"single\")", 409)
            self._node.supervisor.check_seen(expect_run)  # checked once: the cluster stop then stops any run
            return await self._node.cluster.stop_cluster(by, lambda: self._stop_serving(by))
        if self._node.cfg.agent.role == "worker":
            self._node.supervisor.check_seen(expect_run)
            return await self.ray_stop(by, None)
        return await self._node.supervisor.stop(by, expect_run)

    async def _stop_serving(self, by: str) -> None:
        """Until serving is stopped (a cluster stop's first step); an action in progress is waited for."""
        sup = self._node.supervisor
        assert sup is not None
        idle = (ServingState.STOPPED, ServingState.CRASH_LOOP)
        while sup.action is not None or sup.state not in idle:
            if sup.action is None or sup.action.get("action") != "stop":
                with contextlib.suppress(ActionError):
                    await sup.stop(by)
            await asyncio.sleep(0.2)

    async def ray_start(self, by: str) -> str:
        if self._node.cluster is None:
            raise ActionError("role", "this node runs no Ray (agent.role = \"single\")", 409)
        return await self._node.cluster.ray_start(by)

    async def ray_stop(self, by: str, reason: str | None) -> str:
        if self._node.cluster is None:
            raise ActionError("role", "this node runs no Ray (agent.role = \"single\")", 409)
        return await self._node.cluster.ray_stop(by, reason)

    def _worker_serves_nothing(self, action: str, profile: str | None) -> ActionError:
        """The refusal of a serving action on a Ray worker (409 "role", as for `start PROFILE`): its vLLM is the
        head's, whose ranks run here through Ray; a vLLM of the worker's own would take the GPUs they hold."""
        cluster = self._node.cluster
        head = cluster.ray.address if cluster is not None else self._node.cfg.ray.head_address  # the Ray joined
        what = f"profile {profile!r} runs" if profile else "the model runs"
        here = ("`lynxtop start` here, with no profile, starts its Ray" if action == "start" else
                f"{action} serving on the head's agent; `lynxtop start` / `lynxtop stop` here act on this node's Ray")
        return ActionError("role", f"this node is a Ray worker: it serves no vLLM ({what} on the head, {head}); "
                                   f"{here}", 409)

    async def restart(self, by: str, expect_run: ExpectRun = ANY_RUN) -> str:
        assert self._node.supervisor is not None
        if self._node.cfg.agent.role == "worker":
            self._node.supervisor.check_seen(expect_run)
            raise self._worker_serves_nothing("restart", None)
        await first_sample(self._node.gpu_view, "restart")  # the GPUs' processes are looked at (gpu_holders.py)
        return await self._node.supervisor.restart(by, expect_run)

    async def switch(self, profile: str, by: str, expect_run: ExpectRun = ANY_RUN) -> str:
        assert self._node.supervisor is not None
        if self._node.cfg.agent.role == "worker":
            self._node.supervisor.check_seen(expect_run)
            raise self._worker_serves_nothing("switch", profile)
        await first_sample(self._node.gpu_view, f"switch to profile {profile}")
        return await self._node.supervisor.switch(profile, by, expect_run)

    async def store_bench(self, result: dict[str, Any], by: str) -> str:
        """One `lynxtop bench` level into bench_results (a thread: the writer's queue may be busy)."""
        bid = await asyncio.to_thread(self._node.writer.add_bench_result, result)
        return f"stored bench result {bid} (sweep {result.get('bench_id')}, by {by})"

    def close(self) -> None:
        """The history reader's connection, at the agent's end."""
        if self._reader is not None:
            with contextlib.suppress(Exception):
                self._reader.close()
