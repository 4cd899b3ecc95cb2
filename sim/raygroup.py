"""The simulator's `--distributed-executor-backend ray`: a real Ray placement group and real actors, as vLLM's Ray
executor holds them, so the agent's multi-node code meets Ray's actual behaviour (waiting for GPUs, a lost node).

vLLM's executor (vllm/v1/executor/ray_utils.py initialize_ray_cluster, ray_executor.py _init_workers_ray) joins
the running cluster, reserves TP*PP*DP bundles of one GPU (PACK, bundle 0 pinned to the driver's node), waits
for them with a backed-off log line, gives up after PG_WAIT_TIMEOUT with a ValueError, then starts one
`RayWorkerWrapper` actor per bundle. Here the actors do no work: they answer pings. A dead or unreachable actor
ends the server the way an EngineCore death does, but with a non-zero status (vLLM raises on that path).

Ray is optional: it is imported in the start-up thread, and its absence is vLLM's "Failed to import Ray" error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lynxtop.sim import vlog
from lynxtop.sim.flags import ServeArgs

PG_TIMEOUT_ENV = "LYNXTOP_SIM_RAY_PG_TIMEOUT_S"
PG_WAIT_TIMEOUT_S = 1800.0  # vLLM's PG_WAIT_TIMEOUT
FIRST_WAIT_LOG_S = 10.0  # vLLM logs after 10 s, then doubles the interval (10, 30, 70, 150 s ...)
PING_INTERVAL_S = 1.0
PING_TIMEOUT_S = 5.0
SLICE_S = 0.25  # longest blocking Ray call: a SIGTERM is honoured within this
CLOSE_TIMEOUT_S = 10.0  # a shutdown against a dead GCS must not hold the exit
SHUTDOWN_MSG = ("Shutting down Ray distributed executor. If you see error log from logging.cc regarding SIGTERM "
                "received, please ignore because this is the expected termination process in Ray.")


def log(msg: str, level: str = "INFO", src: str = "ray_utils.py:380") -> None:
    vlog.log(level, src, msg)


class RayStartError(Exception):
    """Start-up failed; the text is the exception line vLLM prints (`ValueError: ...`)."""


class _Cancelled(Exception):
    """A signal arrived while the group was being set up."""


@dataclass
class Worker:
    rank: int
    handle: Any  # ray.actor.ActorHandle
    ip: str = ""


def _worker_class() -> type:
    """The actor class, defined in a function so cloudpickle ships it by value: a worker node whose Ray runs
    another Python (or another lynxtop) still hosts it. Its name gives the process title `ray::RayWorkerWrapper`."""

    class RayWorkerWrapper:
        def get_node_ip(self) -> str:
            import ray

            return ray.util.get_node_ip_address()

        def ping(self) -> int:
            import os

            return os.getpid()

    RayWorkerWrapper.__qualname__ = "RayWorkerWrapper"  # Ray's errors name the class by its qualname
    return RayWorkerWrapper


def pg_timeout_s() -> float:
    raw = os.environ.get(PG_TIMEOUT_ENV, "").strip()
    try:
        value = float(raw) if raw else PG_WAIT_TIMEOUT_S
    except ValueError:
        value = PG_WAIT_TIMEOUT_S
    return value if value > 0 else PG_WAIT_TIMEOUT_S


class RayGroup:
    """The placement group and its actors, for the life of one server. start() once, watch() once serving,
    close() however the server ends (idempotent)."""

    def __init__(self, args: ServeArgs):
        self.tp, self.pp, self.dp = args.tp, args.pp, args.dp
        self.world = args.tp * args.pp * args.dp
        self.timeout_s = pg_timeout_s()
        self.workers: list[Worker] = []
        self.lost: str | None = None  # "<Error>: ... (node <ip>)" once an actor is gone
        self._ray: Any = None  # the ray module, once imported and connected
        self._pg: Any = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._closed = False

    # ------------------------------------------------------------------ start-up

    async def start(self, stop: asyncio.Event) -> int | None:
        """Set the group up off the event loop. None when it is ready; otherwise the exit status: 0 when `stop`
        was set first (a signal), 1 after printing vLLM's start-up failure."""
        fut: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._spawn("lynxtop-ray-start", lambda: self._run_start(fut))
        done = asyncio.wrap_future(fut)
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({done, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if stop.is_set():
            self._stop.set()  # the start thread notices within SLICE_S; close() joins it
            done.cancel()  # nothing on a closed loop will wait for its outcome
            return 0
        exc = done.exception()
        if exc is None:
            return None
        log("EngineCore failed to start.", "ERROR", "core.py:866")
        vlog.raw(str(exc) if isinstance(exc, RayStartError) else f"{type(exc).__name__}: {exc}")
        vlog.raw("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
                 "{'EngineCore_DP0': 1}")
        return 1

    def _run_start(self, fut: concurrent.futures.Future[None]) -> None:
        with contextlib.suppress(concurrent.futures.InvalidStateError):  # cancelled: a signal came first
            try:
                self._setup()
            except BaseException as exc:  # noqa: BLE001 - handed to the loop, which reports it
                fut.set_exception(exc)
            else:
                fut.set_result(None)

    def _setup(self) -> None:
        try:
            import ray
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        except ImportError as exc:  # vLLM's assert_ray_available(), missing space included
            raise RayStartError(f"ValueError: Failed to import Ray: {exc}.Please install Ray with "
                                "`pip install ray`.") from None
        address = os.environ.get("RAY_ADDRESS") or "auto"
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
        except ConnectionError as exc:
            raise RayStartError(f"ConnectionError: {exc}") from None
        self._ray = ray
        self._check_stop()
        specs = self._specs(ray)
        self._pg = ray.util.placement_group(specs, strategy="PACK")
        self._wait_pg(ray, specs)
        self._verify_bundles(ray)
        cls = ray.remote(num_cpus=0, num_gpus=1)(_worker_class())
        for rank in range(self.world):
            strategy = PlacementGroupSchedulingStrategy(placement_group=self._pg, placement_group_bundle_index=rank,
                                                        placement_group_capture_child_tasks=True)
            self.workers.append(Worker(rank, cls.options(scheduling_strategy=strategy).remote()))
        ips = self._get([w.handle.get_node_ip.remote() for w in self.workers])
        for w, ip in zip(self.workers, ips, strict=True):
            w.ip = ip
        self._get([w.handle.ping.remote() for w in self.workers])
        per_node = Counter(ips)
        log(f"Ray placement group {self._pg.id.hex()} is ready ({self.world} bundles of 1 GPU, strategy PACK); "
            f"started {self.world} RayWorkerWrapper actors on {len(per_node)} node(s): "
            + ", ".join(f"{ip} ({n})" for ip, n in sorted(per_node.items())), src="ray_executor.py:270")
        log("Ray workers: " + ", ".join(f"rank {w.rank} on {w.ip} (actor {w.handle._actor_id.hex()})"  # noqa: SLF001
                                        for w in self.workers), src="ray_executor.py:271")

    def _specs(self, ray: Any) -> list[dict[str, float]]:
        """vLLM's bundles: one GPU each, the first pinned to this (the driver's) node."""
        log("No current placement group found. Creating a new placement group.", src="ray_utils.py:355")
        if self.world > ray.cluster_resources().get("GPU", 0):
            log("The number of required GPUs exceeds the total number of available GPUs in the placement group.",
                "WARNING", "ray_utils.py:362")
        ip = os.environ.get("VLLM_HOST_IP") or ray.util.get_node_ip_address()
        node_id = ray.get_runtime_context().get_node_id()
        with contextlib.suppress(ImportError, AttributeError, KeyError):  # a private API: skip when it moves
            from ray._private.state import available_resources_per_node

            here = available_resources_per_node()[node_id]
            if here.get("GPU", 0) < 1:
                raise RayStartError(
                    f"ValueError: Current node has no GPU available. current_node_resource={here!r}. vLLM engine "
                    f"cannot start without GPU. Make sure you have at least 1 GPU available in a node "
                    f"current_node_id={node_id!r} current_ip={ip!r}.")
        specs: list[dict[str, float]] = [{"GPU": 1.0} for _ in range(self.world)]
        specs[0][f"node:{ip}"] = 0.001
        return specs

    def _wait_pg(self, ray: Any, specs: list[dict[str, float]]) -> None:
        """vLLM's _wait_until_pg_ready: log after 10 s, then at doubling intervals; here also at the deadline
        (vLLM's last wait can overshoot its timeout by up to one interval)."""
        ready_ref = self._pg.ready()
        t0 = time.monotonic()
        interval, next_log = FIRST_WAIT_LOG_S, FIRST_WAIT_LOG_S
        while True:
            self._check_stop()
            elapsed = time.monotonic() - t0
            wait = max(min(SLICE_S, next_log - elapsed, self.timeout_s - elapsed), 0.0)
            ready, _ = ray.wait([ready_ref], timeout=wait)
            if ready:
                return
            elapsed = time.monotonic() - t0
            if elapsed >= min(next_log, self.timeout_s):
                interval *= 2
                next_log += interval
                log(f"Waiting for creating a placement group of specs for {int(elapsed)} seconds. specs={specs}. "
                    "Check `ray status` and `ray list nodes` to see if you have enough resources, and make sure "
                    "the IP addresses used by ray cluster are the same as VLLM_HOST_IP environment variable "
                    "specified in each node if you are running on a multi-node.", src="ray_utils.py:236")
            if elapsed >= self.timeout_s:
                break
        gpus = sum(s.get("GPU", 0) for s in specs)
        limit = f"{self.timeout_s:g}"
        if gpus > 1:
            raise RayStartError(
                f"ValueError: Cannot provide a placement group requiring {gpus} GPUs (placement_group_specs={specs})"
                f" within {limit} seconds.\nTensor parallel size may exceed available GPUs in your cluster. Check "
                "resources with `ray status` and `ray list nodes`.\nIf running on K8s with limited GPUs, consider "
                "reducing --tensor-parallel-size to match available GPU resources.")
        raise RayStartError(f"ValueError: Cannot provide a placement group of placement_group_specs={specs} within "
                            f"{limit} seconds. See `ray status` and `ray list nodes` to make sure the cluster has "
                            "enough resources.")

    def _verify_bundles(self, ray: Any) -> None:
        """vLLM's warning when a TP group spans nodes (slow without a fast interconnect)."""
        table = ray.util.placement_group_table(self._pg)
        per_node = Counter(table.get("bundles_to_node_id", {}).values())
        for node_id, n in per_node.items():
            if n < self.tp:
                log(f"tensor_parallel_size={self.tp} is bigger than a reserved number of GPUs ({n} GPUs) in a node "
                    f"{node_id}. Tensor parallel workers can be spread out to 2+ nodes which can degrade the "
                    "performance unless you have fast interconnect across nodes, like Infiniband. To resolve this "
                    f"issue, make sure you have more than {self.tp} GPUs available at each node.", "WARNING",
                    "ray_utils.py:190")

    def _get(self, refs: list[Any]) -> list[Any]:
        """ray.get in slices, so a signal during actor start-up is not held up by a slow worker launch."""
        ray = self._ray
        pending = list(refs)
        while pending:
            self._check_stop()
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=SLICE_S)
        return ray.get(refs)

    def _check_stop(self) -> None:
        if self._stop.is_set():
            raise _Cancelled

    # ------------------------------------------------------------------ serving

    def watch(self, on_lost: Callable[[], None]) -> None:
        """Ping every actor each second from a thread; the first one dead or silent for PING_TIMEOUT_S is logged
        and `on_lost` runs once on the calling event loop."""
        loop = asyncio.get_running_loop()

        def notify() -> None:
            with contextlib.suppress(RuntimeError):  # the loop already closed: the server is ending anyway
                loop.call_soon_threadsafe(on_lost)

        self._spawn("lynxtop-ray-watch", lambda: self._watch(notify))

    def _watch(self, notify: Callable[[], None]) -> None:
        while not self._stop.wait(PING_INTERVAL_S):
            failure = self._ping_all()
            if failure is None:
                continue
            if self._stop.is_set():
                return  # our own shutdown took the actors down
            worker, error = failure  # "ray.exceptions.ActorDiedError: The actor died unexpectedly ..."
            kind, _, text = error.partition(":")
            short = kind.rsplit(".", 1)[-1] + ":" + text
            self.lost = f"{short} (node {worker.ip})"
            log(f"Ray worker RayWorkerWrapper rank {worker.rank} on node {worker.ip} is lost: {short}", "ERROR",
                "ray_executor.py:560")
            log("EngineCore encountered a fatal error.", "ERROR", "core.py:875")
            vlog.raw(error)
            notify()
            return

    def _ping_all(self) -> tuple[Worker, str] | None:
        """The first failing worker and "<module.ErrorClass>: <first line>", or None when all answered."""
        ray = self._ray
        try:
            refs = {w.handle.ping.remote(): w for w in self.workers}
        except Exception as exc:  # noqa: BLE001 - Ray itself failing: the group is gone all the same
            return self.workers[0], _describe(exc)
        pending = list(refs)
        deadline = time.monotonic() + PING_TIMEOUT_S
        while pending and not self._stop.is_set():
            try:
                ready, pending = ray.wait(pending, num_returns=len(pending), timeout=SLICE_S)
            except Exception as exc:  # noqa: BLE001 - Ray itself failing
                return refs[pending[0]], _describe(exc)
            for ref in ready:
                try:
                    ray.get(ref, timeout=0)
                except Exception as exc:  # noqa: BLE001 - ActorDiedError, ActorUnavailableError, RayActorError ...
                    return refs[ref], _describe(exc)
            if pending and time.monotonic() > deadline:
                worker = refs[pending[0]]
                return worker, (f"ray.exceptions.GetTimeoutError: RayWorkerWrapper rank {worker.rank} did not "
                                f"answer a ping within {PING_TIMEOUT_S:g} s.")
        return None

    # ------------------------------------------------------------------ shutdown

    def close(self) -> None:
        """Release the placement group and disconnect, bounded by CLOSE_TIMEOUT_S (Ray calls against a lost head
        can block for minutes)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2 * SLICE_S + 0.5)
        if self._ray is None:
            return
        done = threading.Event()

        def release() -> None:
            ray = self._ray
            try:
                if self._pg is not None:
                    if self.workers:  # the executor existed (not a failed or interrupted start-up)
                        log(SHUTDOWN_MSG, src="ray_executor.py:137")
                    for w in self.workers:
                        with contextlib.suppress(Exception):
                            ray.kill(w.handle)
                    with contextlib.suppress(Exception):
                        ray.util.remove_placement_group(self._pg)
                with contextlib.suppress(Exception):
                    ray.shutdown()
            finally:
                done.set()

        threading.Thread(target=release, name="lynxtop-ray-close", daemon=True).start()
        if not done.wait(CLOSE_TIMEOUT_S):
            log(f"Ray did not shut down within {CLOSE_TIMEOUT_S:g} s; exiting without it.", "WARNING",
                "ray_executor.py:140")

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(t)
        t.start()


def _describe(exc: BaseException) -> str:
    """As the last line of a traceback: `ray.exceptions.ActorDiedError: <first line of the message>`."""
    kind = type(exc)
    name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"
    text = str(exc).strip()
    return f"{name}: {text.splitlines()[0] if text else '(no message)'}"
