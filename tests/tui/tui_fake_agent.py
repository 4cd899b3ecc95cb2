"""A FAKE agent for dashboard tests: a real aiohttp server on a real unix socket, serving contract-shaped JSON.

Scriptable from the test thread: change `status`, make POSTs answer 403/409/422, stop and restart the server
(agent lost and back). It runs in its own thread and event loop so it serves both Pilot tests (the app's loop)
and snapshot tests (which run the app in a loop of their own).
"""

from __future__ import annotations

import asyncio
import copy
import os
import threading
from pathlib import Path
from typing import Any

from aiohttp import web

from lynxtop.contract.columns import GPU_METRICS, HOST_METRICS, SERVING_METRICS, names

T0 = 1_796_220_000_000  # 2026-12-02 14:00:00 UTC: a fixed clock for deterministic screens
GIB = 1024**3


def gpu_row(i: int, **over: Any) -> dict[str, Any]:
    row: dict[str, Any] = {k: None for k in names(GPU_METRICS)}
    row.update(
        index=i, name="NVIDIA H200", uuid=f"GPU-fake-{i:04d}", pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
        arch="Hopper", gpm_supported=True, nvlink_count=18, lost=0, util_gpu_pct=100, util_mem_pct=40,
        sm_active_pct=60 + i, sm_occupancy_pct=30, tensor_active_pct=40 + i, dram_bw_pct=55, fp16_active_pct=0,
        fp32_active_pct=1, pcie_tx_bytes_per_s=1_000_000, pcie_rx_bytes_per_s=2_000_000,
        nvlink_tx_bytes_per_s=120 * 10**9, nvlink_rx_bytes_per_s=118 * 10**9, mem_used_bytes=130 * GIB,
        mem_total_bytes=141 * GIB, mem_reserved_bytes=GIB, power_w=550 + i, power_limit_w=700, energy_j=10**9,
        temp_c=60 + i, sm_clock_mhz=1980, mem_clock_mhz=3201, throttle_reasons=0, ecc_corrected=0,
        ecc_uncorrected=0, remapped_rows_pending=0, remapped_rows_failed=0,
    )
    row.update(over)
    return row


def serving_metrics(**over: Any) -> dict[str, Any]:
    m: dict[str, Any] = {k: None for k in names(SERVING_METRICS)}
    m.update(run_id=3, scrape_ok=1, scrape_errors=0, requests_per_s=4.2, prompt_tokens_per_s=9100.0,
             generation_tokens_per_s=1234.5, requests_running=12, requests_waiting=2, kv_cache_usage_pct=37.5,
             preemptions=0, prefix_cache_hit_pct=61.0, spec_decode_acceptance_pct=None)
    for series, base in (("ttft", 300.0), ("itl", 40.0), ("tpot", 45.0), ("e2e", 9000.0), ("queue", 20.0)):
        m.update({f"{series}_p50_ms": base, f"{series}_p90_ms": base * 1.8, f"{series}_p99_ms": base * 2.5,
                  f"{series}_mean_ms": base * 1.1})
    m.update(over)
    return m


def make_status(state: str = "ready", gpus: int = 8, simulated: bool = True, ts_ms: int = T0,
                **serving_over: Any) -> dict[str, Any]:
    host = {k: None for k in names(HOST_METRICS)}
    host.update(cpu_pct=12.0, load1=3.0, mem_used_bytes=200 * GIB, mem_total_bytes=2000 * GIB)
    serving = {
        "state": state, "state_since_ms": ts_ms - 3_723_000, "reason": "", "phase": None,
        "phase_since_ms": None, "phases": [], "profile": "dsv41-tp8", "run_id": 3, "pid": 4242,
        "model": "deepseek-ai/DeepSeek-V4.1", "vllm_version": "0.11.0", "started_ms": ts_ms - 4_800_000,
        "ready_ms": ts_ms - 3_723_000, "next_retry_ms": None, "failures_in_window": 0, "adopted": False,
        "url": "http://127.0.0.1:8000",
    }
    serving.update(serving_over)
    return {
        "ts_ms": ts_ms,
        "agent": {"version": "0.1.0", "pid": 100, "host": "h200-node-07", "started_ms": ts_ms - 86_400_000,
                  "uptime_s": 86_400, "simulated": simulated, "healthy": True, "missed_ticks": 0,
                  "sample_interval_s": 1.0,
                  "nvml": {"state": "ok", "message": "", "driver_version": "570.86", "nvml_version": "12.570"},
                  "store": {"path": "/tmp/x.db", "queued": 0, "dropped": 0, "last_error": None},
                  "action": None},
        "serving": serving,
        "sla": {"state": "ok", "since_ms": ts_ms - 600_000, "ttft_p99_ms": 750.0, "tpot_p99_ms": 112.5,
                "ttft_threshold_ms": 2000, "tpot_threshold_ms": 150, "window_s": 60},
        "gpus": [gpu_row(i) for i in range(gpus)],
        "host": host,
        "serving_metrics": serving_metrics() if state in ("ready", "degraded") else {},
    }


PROFILES = {
    "current": "dsv41-tp8",
    "profiles": [
        {"name": "dsv41-tp8", "description": "DeepSeek-V4.1 TP8, FP8 KV",
         "argv": ["vllm", "serve", "deepseek-ai/DeepSeek-V4.1"],
         "flags": {"--tensor-parallel-size": "8", "--kv-cache-dtype": "fp8", "--max-model-len": "131072",
                   "model": "deepseek-ai/DeepSeek-V4.1"}, "env": {}},
        {"name": "dsv41-tp8-ep", "description": "expert parallel, long context",
         "argv": ["vllm", "serve", "deepseek-ai/DeepSeek-V4.1"],
         "flags": {"--tensor-parallel-size": "8", "--kv-cache-dtype": "fp8", "--max-model-len": "262144",
                   "--enable-expert-parallel": "on", "model": "deepseek-ai/DeepSeek-V4.1"}, "env": {}},
    ],
}


class FakeAgent:
    """Serve on `socket_path` until `stop()`. Mutate attributes from the test; they are read per request."""

    def __init__(self, socket_path: Path, status: dict[str, Any] | None = None):
        self.socket_path = Path(socket_path)
        self.status = status if status is not None else make_status()
        self.profiles = copy.deepcopy(PROFILES)
        self.runs: list[dict[str, Any]] = [{"id": 3, "profile": "dsv41-tp8", "started_ms": T0 - 4_800_000}]
        self.events: list[dict[str, Any]] = [
            {"id": 1, "ts_ms": T0 - 4_800_000, "run_id": 3, "kind": "serving", "severity": "info",
             "message": "starting dsv41-tp8", "details": None},
            {"id": 2, "ts_ms": T0 - 3_723_000, "run_id": 3, "kind": "serving", "severity": "info",
             "message": "ready after 17m57s", "details": None},
            {"id": 3, "ts_ms": T0 - 600_000, "run_id": 3, "kind": "gpu", "severity": "warning",
             "message": "GPU 3 SW thermal slowdown", "details": None},
        ]
        self.log_lines = [f"INFO 12-02 09:{i:02d}:00 [loader.py] loading shard {i}/64" for i in range(40)]
        self.log_lines.append("INFO 12-02 10:00:00 [api_server.py] Uvicorn running on http://127.0.0.1:8000")
        # action -> (http status, body); default 202 accepted
        self.post_answers: dict[str, tuple[int, dict[str, Any]]] = {}
        self.requests: list[tuple[str, str, dict[str, Any] | None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    # ------------------------------------------------------------------ control from the test
    def start(self) -> FakeAgent:
        self._ready.clear()
        self._thread = threading.Thread(target=self._serve, name="fake-agent", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake agent did not start")
        return self

    def stop(self) -> None:
        """The agent goes away: the socket file is removed, connections are refused."""
        if self._loop is None:
            return
        fut = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        fut.result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread:
            self._thread.join(10)
        self._loop = None
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass

    def posts(self) -> list[tuple[str, dict[str, Any] | None]]:
        return [(path, body) for method, path, body in self.requests if method == "POST"]

    # ------------------------------------------------------------------ server
    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        loop.run_until_complete(self._start_site())
        self._ready.set()
        loop.run_forever()
        loop.close()

    async def _start_site(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/status", self._status)
        app.router.add_get("/v1/profiles", self._profiles)
        app.router.add_get("/v1/runs", self._runs)
        app.router.add_get("/v1/events", self._events)
        app.router.add_get("/v1/logs", self._logs)
        for action in ("start", "stop", "restart", "switch"):
            app.router.add_post(f"/v1/{action}", self._post)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.UnixSite(self._runner, str(self.socket_path))
        await site.start()

    async def _shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _json(self, request: web.Request, data: Any, status: int = 200) -> web.Response:
        self.requests.append((request.method, request.path, None))
        return web.json_response(data, status=status)

    async def _status(self, request: web.Request) -> web.Response:
        return self._json(request, self.status)

    async def _profiles(self, request: web.Request) -> web.Response:
        return self._json(request, self.profiles)

    async def _runs(self, request: web.Request) -> web.Response:
        return self._json(request, {"runs": self.runs})

    async def _events(self, request: web.Request) -> web.Response:
        return self._json(request, {"events": self.events})

    async def _logs(self, request: web.Request) -> web.Response:
        run = request.query.get("run")
        return self._json(request, {"run_id": int(run) if run else 3, "path": "/var/lib/lynxtop/logs/run-3.log",
                                    "lines": self.log_lines})

    async def _post(self, request: web.Request) -> web.Response:
        action = request.path.rsplit("/", 1)[-1]
        body = await request.json() if request.can_read_body else {}
        self.requests.append(("POST", request.path, body))
        status, answer = self.post_answers.get(
            action, (202, {"accepted": True, "action": action, "message": f"{action} accepted (fake agent)"}))
        return web.json_response(answer, status=status)
