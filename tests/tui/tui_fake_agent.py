"""A FAKE agent for dashboard tests: a real aiohttp server on a real unix socket, serving contract-shaped JSON.

Scriptable from the test thread: change `status`, make POSTs answer 403/409/422, stop and restart the server
(agent lost and back). It runs in its own thread and event loop so it serves both Pilot tests (the app's loop)
and snapshot tests (which run the app in a loop of their own). `stop()` ends every connection at once, as a killed
agent's kernel does: no client is left waiting on one (tests/tui/test_s24_fake_agent_stop.py).
"""

from __future__ import annotations

import asyncio
import copy
import os
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from support.status import GIB, T0, gpu_row, serving_metrics, status_json

from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.contract.records import RunInfo
from lynxtop.contract.status import Status

__all__ = ["GIB", "PROFILES", "T0", "FakeAgent", "gpu_row", "make_status", "serving_metrics"]

# The status comes from the one factory; the fake serves its JSON form, which tests may edit in place.
make_status = status_json


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


class _Listener(socket.socket):
    """The agent's listening unix socket, keeping every connection it accepts so that `stop()` can end each one.

    aiohttp's graceful shutdown alone left clients waiting: a connection accepted as the listener closed registers
    with aiohttp after its sweep of open connections, and the loop stopped with it open and unread, so a dashboard
    request on it waited for its 3 s read timeout (session 23; most stops under a burst of requests). asyncio
    accepts through this object's `accept()`, so the list is complete once the listener is closed."""

    def __init__(self, path: Path) -> None:
        super().__init__(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if stat.S_ISSOCK(os.stat(path).st_mode):
                os.unlink(path)  # a stale socket file from a stop that did not finish, as asyncio's unix server does
        except FileNotFoundError:
            pass
        self.bind(str(path))
        self.listen(128)
        self.accepted: list[socket.socket] = []

    def accept(self) -> tuple[socket.socket, Any]:
        conn, addr = super().accept()
        self.accepted = [c for c in self.accepted if c.fileno() != -1]  # drop the ones aiohttp closed
        self.accepted.append(conn)
        return conn, addr

    def end_connections(self, *, close: bool = False) -> None:
        """Shut down every accepted connection: its client reads EOF now, whatever asyncio made of it.

        `close` also frees the descriptors; only once the loop has stopped, since transports still hold them."""
        for conn in self.accepted:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed already, by aiohttp or by the client
            if close:
                conn.close()


class FakeAgent:
    """Serve on `socket_path` until `stop()`. Mutate attributes from the test; they are read per request."""

    def __init__(self, socket_path: Path, status: dict[str, Any] | Status | None = None):
        self.socket_path = Path(socket_path)
        self.status = status if status is not None else make_status()
        self.profiles = copy.deepcopy(PROFILES)
        self.runs: list[RunInfo] = [RunInfo(3, profile="dsv41-tp8", started_ms=T0 - 4_800_000)]
        # built as Events: a fixture cannot serve a kind that no agent writes
        self.events: list[Event] = [
            Event(EventKind.SERVING_STARTING, Severity.INFO, "starting dsv41-tp8", run_id=3, ts_ms=T0 - 4_800_000,
                  id=1),
            Event(EventKind.SERVING_READY, Severity.INFO, "ready after 17m57s", run_id=3, ts_ms=T0 - 3_723_000, id=2),
            Event(EventKind.GPU_XID, Severity.WARNING, "GPU 3 SW thermal slowdown", run_id=3, ts_ms=T0 - 600_000,
                  id=3),
        ]
        self.log_lines = [f"INFO 12-02 09:{i:02d}:00 [loader.py] loading shard {i}/64" for i in range(40)]
        self.log_lines.append("INFO 12-02 10:00:00 [api_server.py] Uvicorn running on http://127.0.0.1:8000")
        # GET /v1/processes (contract/processes.py): the run's vLLM on each GPU and a stray job; None answers 404
        self.gpu_processes: dict[str, Any] | None = {"age_s": 0.4, "processes": [
            *({"gpu": g, "pid": 4242 + g, "user": "vllm", "command": "VLLM::Worker_TP" + str(g),
               "used_mem_bytes": 128 * GIB, "sm_util_pct": 71 + g, "in_run": True} for g in range(8)),
            {"gpu": 3, "pid": 31337, "user": "alice", "command": "python train.py --epochs 3",
             "used_mem_bytes": 6 * GIB, "sm_util_pct": None, "in_run": False}]}
        # action -> (http status, body); default 202 accepted
        self.post_answers: dict[str, tuple[int, dict[str, Any]]] = {}
        self.requests: list[tuple[str, str, dict[str, Any] | None]] = []
        self.request_times: list[float] = []  # time.monotonic() of each of `requests`, at its arrival
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.SockSite | None = None
        self._listener: _Listener | None = None
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
        """The agent goes away: every open connection is closed (in flight or idle), the socket file is removed,
        new connections are refused."""
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
        # asyncio's own selector loop: it accepts through _Listener.accept() (uvloop would not)
        loop = asyncio.SelectorEventLoop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        loop.run_until_complete(self._start_site())
        self._ready.set()
        loop.run_forever()
        if self._listener is not None:
            self._listener.end_connections(close=True)  # the loop is stopped: nothing else uses them now
        loop.close()

    async def _start_site(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/status", self._status)
        app.router.add_get("/v1/profiles", self._profiles)
        app.router.add_get("/v1/runs", self._runs)
        app.router.add_get("/v1/events", self._events)
        app.router.add_get("/v1/logs", self._logs)
        app.router.add_get("/v1/processes", self._processes)
        for action in ("start", "stop", "restart", "switch"):
            app.router.add_post(f"/v1/{action}", self._post)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        self._listener = _Listener(self.socket_path)
        self._site = web.SockSite(self._runner, self._listener)
        await self._site.start()

    async def _shutdown(self) -> None:
        """Close the listener first (no accept after it), then end every connection it accepted, then let aiohttp
        tidy up. aiohttp's graceful shutdown alone misses a connection accepted just before the listener closes:
        Python 3.11's asyncio fails to build its transport once the server is closed (`assert self._sockets is not
        None` in Server._attach) and leaves the accepted socket open, unread, until garbage collection."""
        if self._site is not None:
            await self._site.stop()
            self._site = None
        if self._listener is not None:
            self._listener.end_connections()
        if self._runner is not None:
            await self._runner.cleanup()

    def _json(self, request: web.Request, data: Any, status: int = 200) -> web.Response:
        self.requests.append((request.method, request.path, None))
        self.request_times.append(time.monotonic())
        return web.json_response(data, status=status)

    async def _status(self, request: web.Request) -> web.Response:
        status = self.status
        return self._json(request, status.to_json() if isinstance(status, Status) else status)

    async def _profiles(self, request: web.Request) -> web.Response:
        return self._json(request, self.profiles)

    async def _runs(self, request: web.Request) -> web.Response:
        return self._json(request, {"runs": [r.to_json() for r in self.runs]})

    async def _events(self, request: web.Request) -> web.Response:
        return self._json(request, {"events": [e.to_json() for e in self.events]})

    async def _processes(self, request: web.Request) -> web.Response:
        if self.gpu_processes is None:
            raise web.HTTPNotFound()
        return self._json(request, self.gpu_processes)

    async def _logs(self, request: web.Request) -> web.Response:
        run = request.query.get("run")
        return self._json(request, {"run_id": int(run) if run else 3, "path": "/var/lib/lynxtop/logs/run-3.log",
                                    "lines": self.log_lines})

    async def _post(self, request: web.Request) -> web.Response:
        action = request.path.rsplit("/", 1)[-1]
        body = await request.json() if request.can_read_body else {}
        self.requests.append(("POST", request.path, body))
        self.request_times.append(time.monotonic())
        status, answer = self.post_answers.get(
            action, (202, {"accepted": True, "action": action, "message": f"{action} accepted (fake agent)"}))
        return web.json_response(answer, status=status)
