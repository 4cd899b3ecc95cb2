"""Test parts for the agent's I/O edges: a vLLM-like metrics page from a real prometheus_client registry, and a
fake Controller with the behaviour the API and CLI must handle (busy, preflight failure, state changes)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from support.status import gpu_row, make_status

from lynxtop.agent.api.control import ANY_RUN, ActionError
from lynxtop.agent.api.routes import ApiServer
from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.contract.records import ProfileInfo, ProfileList, RunInfo
from lynxtop.contract.status import Status

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80,
                160, 640, 2560]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80]
REQ_BUCKETS = [0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680]


class VllmPage:
    """The metric families vLLM prints, with its names, labels and default buckets, in a real registry.

    `names="new"` is vLLM >= 0.12, `"old"` the pre-0.9.2 names, `"both"` vLLM 0.10 (prints old and new).
    """

    def __init__(self, engines: int = 2, names: str = "new", model: str = "deepseek-ai/DeepSeek-V4.1"):
        self.registry = CollectorRegistry()
        self.engines = [str(i) for i in range(engines)]
        self.model = model
        r, lab = self.registry, ["model_name", "engine"]
        self.running = Gauge("vllm:num_requests_running", "running", lab, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "waiting", lab, registry=r)
        self.waiting_by_reason = Gauge("vllm:num_requests_waiting_by_reason", "w", [*lab, "reason"], registry=r)
        self.prompt = Counter("vllm:prompt_tokens", "prompt", lab, registry=r)
        self.gen = Counter("vllm:generation_tokens", "gen", lab, registry=r)
        self.success = Counter("vllm:request_success", "ok", [*lab, "finished_reason"], registry=r)
        self.preempt = Counter("vllm:num_preemptions", "preempt", lab, registry=r)
        self.kv = {}
        self.pq, self.ph = {}, {}
        if names in ("new", "both"):
            self.kv["new"] = Gauge("vllm:kv_cache_usage_perc", "kv", lab, registry=r)
            self.pq["new"] = Counter("vllm:prefix_cache_queries", "q", lab, registry=r)
            self.ph["new"] = Counter("vllm:prefix_cache_hits", "h", lab, registry=r)
        if names in ("old", "both"):
            self.kv["old"] = Gauge("vllm:gpu_cache_usage_perc", "kv", lab, registry=r)
            self.pq["old"] = Counter("vllm:gpu_prefix_cache_queries", "q", lab, registry=r)
            self.ph["old"] = Counter("vllm:gpu_prefix_cache_hits", "h", lab, registry=r)
        self.drafts = Counter("vllm:spec_decode_num_draft_tokens", "d", lab, registry=r)
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "a", lab, registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "ttft", lab, buckets=TTFT_BUCKETS, registry=r)
        itl_name = "vllm:inter_token_latency_seconds" if names == "new" else "vllm:time_per_output_token_seconds"
        self.itl = Histogram(itl_name, "itl", lab, buckets=ITL_BUCKETS, registry=r)
        self.tpot = Histogram("vllm:request_time_per_output_token_seconds", "tpot", lab, buckets=ITL_BUCKETS,
                              registry=r) if names != "old" else None
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "e2e", lab, buckets=REQ_BUCKETS, registry=r)
        self.queue = Histogram("vllm:request_queue_time_seconds", "q", lab, buckets=REQ_BUCKETS, registry=r)
        self.iter_tokens = Histogram("vllm:iteration_tokens_total", "it", lab, buckets=[1, 8, 64, 512], registry=r)
        self.extra = Gauge("process_open_fds", "noise", registry=r)
        self.extra.set(17)
        for e in self.engines:  # vLLM prints every series from the start, at zero
            for m in (self.running, self.waiting, self.prompt, self.gen, self.preempt, self.drafts, self.accepted,
                      self.ttft, self.itl, self.e2e, self.queue, *self.kv.values(), *self.pq.values(),
                      *self.ph.values()):
                m.labels(model, e)
            self.success.labels(model, e, "stop")

    def lab(self, engine: int = 0) -> tuple[str, str]:
        return (self.model, self.engines[engine])

    def text(self) -> str:
        return generate_latest(self.registry).decode()


class FakeController:
    """Records every mutating call; `busy`, `preflight_fail` and `boom` make it refuse or fail like the real one.

    `script` maps an action to a list of (delay_s, state-changes) applied on the server's loop, so --wait sees
    the same sequence of states as with the supervisor.
    """

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, str]] = []
        self.expect_runs: list[Any] = []
        self.busy: str | None = None
        self.preflight_fail: list[str] | None = None
        self.boom = False
        self.script: dict[str, list[tuple[float, dict[str, Any]]]] = {}
        self.serving: dict[str, Any] = {
            "state": "ready", "state_since_ms": int(time.time() * 1000) - 3_600_000, "reason": "", "phase": "api up",
            "phase_since_ms": 0, "phases": [], "profile": "tp8", "run_id": 7, "pid": 4242,
            "model": "deepseek-ai/DeepSeek-V4.1", "vllm_version": "0.31.0", "started_ms": 0,
            "ready_ms": int(time.time() * 1000) - 3_600_000, "next_retry_ms": None, "failures_in_window": 0,
            "adopted": False, "url": "http://127.0.0.1:8000"}
        self.action: dict[str, Any] | None = None
        self.simulated = True
        # built as Events: a fixture cannot answer a kind that no agent writes (this one once used "state")
        self._events = [Event(EventKind.SERVING_PHASE, Severity.INFO, f"event {i}", {}, run_id=7, ts_ms=1000 * i, id=i)
                        for i in range(1, 6)]

    # read-only
    def status(self) -> Status:
        now = int(time.time() * 1000)
        return make_status(
            ts_ms=now, simulated=self.simulated, gpu_rows=[gpu_row(
                i, uuid=f"GPU-{i:04d}", pci_bus_id=f"0000:{i:02x}:00.0", util_gpu_pct=97, power_w=612, temp_c=63,
                energy_j=123456, sm_active_pct=None) for i in range(8)],
            agent={"pid": os.getpid(), "host": "node1", "started_ms": 0, "missed_ticks": 3,
                   "nvml": {"state": "ok", "message": "", "driver_version": "575.57", "nvml_version": "13"},
                   "store": {"path": "/x.db", "queued": 0, "dropped": 2, "last_error": None}, "action": self.action},
            sla={"since_ms": 0, "ttft_p99_ms": 412.0, "tpot_p99_ms": 38.0, "ttft_threshold_ms": 2000.0,
                 "tpot_threshold_ms": 150.0, "window_s": 60.0},
            host={"cpu_pct": 12.5, "load1": 3.1, "mem_total_bytes": 2015 * 2**30, "disk_free_bytes": 10 * 2**40},
            metrics={"requests_per_s": 3.2, "generation_tokens_per_s": 1204.0, "prompt_tokens_per_s": 5000.0,
                     "requests_waiting": 0, "kv_cache_usage_pct": 43.0, "ttft_p99_ms": 412.0,
                     "tpot_p99_ms": 38.0, "itl_p50_ms": None},
            **self.serving)

    def profiles(self) -> ProfileList:
        return ProfileList("tp8", (ProfileInfo("tp8", "DeepSeek TP8", ["vllm", "serve", "m"]),
                                   ProfileInfo("tp8-fp8kv", "fp8 KV", ["vllm", "serve", "m"])))

    def runs(self, limit: int) -> list[RunInfo]:
        return [RunInfo(7 - i, profile="tp8") for i in range(min(limit, 7))]

    async def events(self, since_ms: int | None, limit: int) -> list[Event]:
        evs = [e for e in self._events if since_ms is None or (e.ts_ms or 0) > since_ms]
        return evs[:limit]

    def logs(self, run_id: int | None, lines: int) -> dict[str, Any]:
        rid = 7 if run_id is None else run_id
        if rid != 7:
            raise ActionError("unknown_run", f"no run {rid}", 404)
        return {"run_id": rid, "path": "/logs/run-7.log", "lines": [f"line {i}" for i in range(lines)][-lines:]}

    # mutating
    async def _act(self, action: str, arg: Any, by: str) -> str:
        if self.boom:
            raise RuntimeError("controller bug")
        if self.busy:
            raise ActionError("busy", f"busy: {self.busy} in progress since 12:00:00", 409)
        if action == "switch" and self.preflight_fail:
            raise ActionError("preflight_failed", "preflight of the new profile failed", 422,
                              {"reasons": list(self.preflight_fail)})
        if action == "start" and self.serving["state"] in ("ready", "starting"):
            raise ActionError("already_running", "serving is already running (use restart or switch)", 409)
        self.calls.append((action, arg, by))
        loop = asyncio.get_running_loop()
        for delay, change in self.script.get(action, []):
            loop.call_later(delay, self._apply, change)
        return f"{action} accepted"

    def _apply(self, change: dict[str, Any]) -> None:
        if "action" in change:
            self.action = change.pop("action")
        self.serving.update(change)

    # expect_run (the run the caller saw): recorded, not checked (the supervisor's tests check it)
    async def start(self, profile: str | None, by: str, expect_run: Any = ANY_RUN) -> str:
        self.expect_runs.append(expect_run)
        return await self._act("start", profile, by)

    async def stop(self, by: str, expect_run: Any = ANY_RUN) -> str:
        self.expect_runs.append(expect_run)
        return await self._act("stop", None, by)

    async def restart(self, by: str, expect_run: Any = ANY_RUN) -> str:
        self.expect_runs.append(expect_run)
        return await self._act("restart", None, by)

    async def switch(self, profile: str, by: str, expect_run: Any = ANY_RUN) -> str:
        self.expect_runs.append(expect_run)
        return await self._act("switch", profile, by)


class ThreadedApi:
    """The real ApiServer on its own event loop in a thread, for blocking clients (the CLI)."""

    def __init__(self, controller: FakeController, path: Path, group: str = "lynxtop"):
        self.controller = controller
        self.path = path
        self.logs: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.server = ApiServer(controller, path, group=group, log=self.logs.append)
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> ThreadedApi:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
