"""A real control API (agent/api/routes.py) on a real unix socket whose logs are a real file and whose GPU
processes are real pids: the follow protocol and the processes answer as the agent serves them.

The controller does what `Node.logs` and `Node.processes` do (LogTail's locate or follow on the current run's
log path; `describe` of the process rows) with the run, its log path and the rows set by the test. The server
runs in a thread of its own, so a Pilot test (the app's loop) can drive the dashboard meanwhile.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from lynxtop.agent.api.control import ActionError
from lynxtop.agent.api.logtail import LogTail
from lynxtop.agent.api.processes import describe
from lynxtop.agent.api.routes import ApiServer
from lynxtop.contract.events import Event
from lynxtop.contract.records import ProfileList, RunInfo
from lynxtop.contract.status import Status
from support.status import status_json


class FileController:
    """The agent's read side over a log file and process rows the test sets."""

    def __init__(self, log_path: Path, run_id: int = 3):
        self.log_path = log_path
        self.run_id = run_id
        self.process_rows: list[dict[str, Any]] = []
        self.age_s: float | None = 0.4
        self.status_json = status_json()

    def status(self) -> Status:
        return Status.from_json(self.status_json)

    def profiles(self) -> ProfileList:
        return ProfileList()

    def runs(self, limit: int) -> list[RunInfo]:
        return [RunInfo(self.run_id, profile="p", log_path=str(self.log_path))]

    def events(self, since_ms: int | None, limit: int) -> list[Event]:
        return []

    async def logs(self, run_id: int | None, lines: int, *, after: int | None = None,
                   inode: int | None = None) -> dict[str, Any]:
        if run_id not in (None, self.run_id):
            raise ActionError("unknown_run", f"no run {run_id}", 404)
        tail = LogTail(str(self.log_path), lines, 4 << 20)
        if after is None:
            await asyncio.to_thread(tail.locate)
        else:
            await asyncio.to_thread(tail.follow, after, inode)
        return {"run_id": self.run_id, "path": str(self.log_path), "lines": tail}

    async def processes(self) -> dict[str, Any]:
        return await asyncio.to_thread(describe, self.process_rows, self.age_s, ())


class LogAgent:
    """`ApiServer(FileController)` on `socket_path`, served from its own thread until `stop()`."""

    def __init__(self, socket_path: Path, log_path: Path):
        self.socket_path = Path(socket_path)
        self.controller = FileController(log_path)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: ApiServer | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    def start(self) -> LogAgent:
        self._thread = threading.Thread(target=self._serve, name="log-agent", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("log agent did not start")
        return self

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        self._server = ApiServer(self.controller, self.socket_path, group="nogroup-lynxtop-test", log=lambda m: None)
        loop.run_until_complete(self._server.start())
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(self._server.stop())
        loop.close()

    def stop(self) -> None:
        if self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = None
