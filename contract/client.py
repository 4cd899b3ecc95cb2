"""The one client of the control API (docs/api.md): JSON over HTTP/1.1 on the agent's unix socket.

Two faces over one protocol: `AgentClient` (blocking, http.client: the CLI starts fast and needs no event
loop) and `AsyncAgentClient` (asyncio streams: the dashboard and the demo; aiohttp's client would cost a
quarter of a second of start-up, and the dashboard's first frame must come within one). One connection
per request: a unix connect costs microseconds, and the agent may restart between two polls.

Every failure is one of two exceptions, so callers never see the transport: `AgentUnreachable` (nothing
answers, or the answer is not the API) and `AgentRefused` (the agent answered an HTTP error; `status`,
`code`, `message` and `details` are the API's). Answers are typed: `status()` a `Status`, `runs()` `RunInfo`s,
`events()` `Event`s, `profiles()` a `ProfileList`, `action()` an `ActionAnswer`; a record
this version cannot read (a newer agent's event kind) is `AgentUnreadable`, naming the item and field.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import json
import socket
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from lynxtop.contract.status import Status

if TYPE_CHECKING:  # the CLI never imports asyncio (40 ms of start-up); the async face imports it when used
    import asyncio

    from lynxtop.contract.events import Event
    from lynxtop.contract.processes import GpuProcesses
    from lynxtop.contract.records import ActionAnswer, ProfileList, RunInfo

# The records other than the status (events, runs, profiles, processes: contract/records.py and its users) are
# imported by the first answer that holds one: the dashboard's first frame reads only the status, and on a loaded
# machine each module is start-up time (docs/dashboard.md, "Speed"). Their names stay importable from here.
_LAZY = {"Event": "events", "GpuProcesses": "processes", "ActionAnswer": "records", "ProfileList": "records",
         "RecordError": "records", "RunInfo": "records", "read_list": "records"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"lynxtop.contract.{module}"), name)

MUTATING_ACTIONS = ("start", "stop", "restart", "switch", "ray/start", "ray/stop")
GUARDED_ACTIONS = ("start", "stop", "restart", "switch")  # take `expect_run`: the run the caller saw
MAX_BODY = 64 * 1024 * 1024  # a status or log answer is far smaller; more means something else answers
CLI_TIMEOUT_S = 15.0
DASHBOARD_TIMEOUT_S = 3.0


class AnyRun(enum.Enum):
    """`action(..., expect_run=ANY_RUN)`, the default: no run guard sent; the action acts on whatever run is
    current when it lands (scripts). Anything that asked a person first should send the run it showed."""

    ANY = "any"


ANY_RUN = AnyRun.ANY


class AgentUnreachable(Exception):
    """The socket is absent, refuses connections, times out, or answers something that is not the API."""


class AgentUnreadable(AgentUnreachable):
    """The agent answered, but a record in the answer is not one this version reads (a newer agent's event kind,
    a missing field): the message names the item and the field. An `AgentUnreachable`, so callers that show one
    show this too."""


# The agent's 409 codes for an ask already met (docs/api.md), with their words: the goal is reached, nothing done
# and nothing wrong (the CLI exits 0 with a note, the dashboard says so rather than "agent busy"). Serving's and
# Ray's share them; "already_running" is Ray's start on a running Ray
ALREADY_DONE = {"already_stopped": "already stopped", "already_serving": "already serving",
                "already_starting": "already starting", "already_running": "already running"}


class AgentRefused(Exception):
    """The agent answered with an HTTP error: `status` is the HTTP code, `code` the API's error code."""

    def __init__(self, status: int, code: str, message: str, details: Mapping[str, Any] | None = None):
        super().__init__(f"{message} ({status} {code})")
        self.status = status
        self.code = code
        self.message = message
        self.details: Mapping[str, Any] = details or {}


# ---------------------------------------------------------------------------------------------- protocol


TCP_SCHEME = "http://"  # an agent's read-only TCP endpoint ([agent] metrics_listen), written http://HOST:PORT


def tcp_address(target: str) -> tuple[str, int] | None:
    """(host, port) of a read-only TCP endpoint `http://HOST:PORT` (IPv6 in brackets); None for a socket path."""
    if not target.startswith(TCP_SCHEME):
        return None
    host, _, port = target[len(TCP_SCHEME):].rstrip("/").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{target!r} is not http://HOST:PORT")
    return host.strip("[]"), int(port)


def _target(path: str, params: Mapping[str, Any] | None) -> str:
    query = urlencode({k: v for k, v in (params or {}).items() if v is not None})
    return f"{path}?{query}" if query else path


def _action_body(action: str, profile: str | None, extra: Mapping[str, Any] | None = None,
                 expect_run: int | None | AnyRun = ANY_RUN) -> dict[str, Any]:
    """The body of a mutating call; `extra` holds its other fields (stop's `cluster`, ray/stop's `reason`).
    `expect_run` is sent as given, None too (JSON null: "I saw no run"), unless ANY_RUN."""
    if action not in MUTATING_ACTIONS:
        raise ValueError(f"unknown action {action!r}")
    body: dict[str, Any] = {"profile": profile} if profile is not None else {}  # "": refused there
    body |= {k: v for k, v in (extra or {}).items() if v is not None}
    if expect_run is not ANY_RUN:
        if action not in GUARDED_ACTIONS:
            raise ValueError(f"{action} takes no expect_run")
        body["expect_run"] = expect_run
    return body


def unreachable(exc: BaseException, socket_path: str, timeout_s: float) -> AgentUnreachable:
    """The transport error `exc` as the message an operator can act on."""
    if isinstance(exc, FileNotFoundError):
        return AgentUnreachable(f"no agent socket at {socket_path} (is lynxtop-agent running? "
                                "systemctl status lynxtop-agent)")
    if isinstance(exc, ConnectionRefusedError):
        return AgentUnreachable(f"nothing answers on {socket_path} (the agent is not running or is restarting)")
    if isinstance(exc, PermissionError):
        return AgentUnreachable(f"permission denied on {socket_path}: join the agent's group "
                                "(sudo usermod -aG lynxtop $USER, then log in again) or use sudo")
    if isinstance(exc, TimeoutError):
        return AgentUnreachable(f"the agent at {socket_path} did not answer within {timeout_s:g} s")
    if type(exc).__name__ == "IncompleteReadError":  # asyncio's, without importing asyncio
        return AgentUnreachable(f"cannot talk to the agent at {socket_path}: it closed the connection mid-answer")
    return AgentUnreachable(f"cannot talk to the agent at {socket_path}: {exc or type(exc).__name__}")


def decode(status: int, raw: bytes, socket_path: str) -> dict[str, Any]:
    """The JSON object of an answer; raises AgentRefused for an HTTP error, AgentUnreachable for a non-API one."""
    try:
        data = json.loads(raw) if raw.strip() else {}
    except (ValueError, RecursionError):
        raise AgentUnreachable(f"the agent at {socket_path} answered HTTP {status} with something that is not "
                               "JSON (is this a lynxtop agent socket?)") from None
    if not isinstance(data, dict):
        raise AgentUnreachable(f"the agent at {socket_path} answered HTTP {status} with JSON that is not an "
                               "object (is this a lynxtop agent socket?)")
    if status >= 400:
        details = data.get("details")
        raise AgentRefused(status, str(data.get("error") or "error"), str(data.get("message") or f"HTTP {status}"),
                           details if isinstance(details, dict) else None)
    return data


def typed(socket_path: str, what: str, read: Any, data: Any) -> Any:
    """`read(data)`, a record error as AgentUnreadable naming what was asked."""
    from lynxtop.contract.records import RecordError

    try:
        return read(data)
    except RecordError as exc:
        raise AgentUnreadable(f"the agent at {socket_path} answered {what} that this lynxtop cannot read: {exc}") \
            from None


def runs_of(data: Mapping[str, Any], socket_path: str) -> list[RunInfo]:
    from lynxtop.contract.records import RunInfo, read_list

    return typed(socket_path, "GET /v1/runs", lambda d: read_list(RunInfo, d.get("runs", []), "runs"), data)


def events_of(data: Mapping[str, Any], socket_path: str) -> list[Event]:
    from lynxtop.contract.events import Event
    from lynxtop.contract.records import read_list

    return typed(socket_path, "GET /v1/events", lambda d: read_list(Event, d.get("events", []), "events"), data)


def parse_status(data: Mapping[str, Any], socket_path: str) -> Status:
    if not isinstance(data.get("serving"), dict) and "agent" not in data:
        raise AgentUnreachable(f"{socket_path}: answer is not a lynxtop status object")
    return typed(socket_path, "GET /v1/status", Status.from_json, data)


# ---------------------------------------------------------------------------------------------- blocking


@functools.cache
def _http() -> tuple[Any, type]:
    """http.client and its unix-socket connection, made on the first blocking request: http.client brings email
    and ssl, which the dashboard (the asyncio face alone) would otherwise import before its first frame."""
    import http.client

    class UnixHTTPConnection(http.client.HTTPConnection):
        def __init__(self, path: str, timeout: float):
            super().__init__("localhost", timeout=timeout)
            self._path = path

        def connect(self) -> None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(self._path)
            except OSError:
                sock.close()
                raise
            self.sock = sock

    return http.client, UnixHTTPConnection


def auth_headers(target: str, token: str | None) -> dict[str, str]:
    """The read token's header ([agent] tcp_token_file), sent only to a TCP endpoint, never down the socket."""
    return {"Authorization": f"Bearer {token}"} if token and target.startswith(TCP_SCHEME) else {}


def _answer(conn: Any, timeout_s: float) -> tuple[int, bytes]:
    """The answer's status and body (at most MAX_BODY + 1 bytes), all of it within `timeout_s`.

    The socket's timeout bounds each read only: a peer that trickles a byte a second (a hung or hostile node's
    endpoint) would hold the CLI, or the dashboard's worker thread, for ever. Past the deadline the socket is shut,
    which ends the read in progress, and the exchange is a timeout."""
    expired = threading.Event()

    def shut() -> None:
        expired.set()
        with contextlib.suppress(OSError, AttributeError):
            conn.sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(timeout_s, shut)
    timer.daemon = True
    timer.start()
    try:
        resp = conn.getresponse()
        raw = resp.read(MAX_BODY + 1)
    except Exception:
        if expired.is_set():
            raise TimeoutError from None
        raise
    finally:
        timer.cancel()
    if expired.is_set():
        raise TimeoutError
    return resp.status, raw


class AgentClient:
    """Blocking face, for the CLI (and the dashboard's reads of another node's history, from a worker thread:
    `socket_path` may be `http://HOST:PORT`, with that node's read `token`)."""

    def __init__(self, socket_path: str | Path, timeout_s: float = CLI_TIMEOUT_S, token: str | None = None):
        self.socket_path = str(socket_path)
        self.timeout_s = timeout_s
        self._token = token

    def request(self, method: str, path: str, params: Mapping[str, Any] | None = None,
                body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        http_client, unix_connection = _http()
        tcp = tcp_address(self.socket_path)
        conn = (http_client.HTTPConnection(*tcp, timeout=self.timeout_s) if tcp is not None
                else unix_connection(self.socket_path, self.timeout_s))
        try:
            payload = json.dumps(body).encode() if body is not None else None
            headers = {"Content-Type": "application/json"} if payload is not None else {}
            headers |= auth_headers(self.socket_path, self._token)
            conn.request(method, _target(path, params), body=payload, headers=headers)
            status, raw = _answer(conn, self.timeout_s)
        except (OSError, http_client.HTTPException) as exc:
            raise unreachable(exc, self.socket_path, self.timeout_s) from None
        finally:
            conn.close()
        if len(raw) > MAX_BODY:
            raise AgentUnreachable(f"the agent at {self.socket_path} answered more than {MAX_BODY} bytes "
                                   "(is this a lynxtop agent?)")
        return decode(status, raw, self.socket_path)

    def status_json(self) -> dict[str, Any]:
        """The status as the agent sent it (`lynxtop status --json` prints every key, known or not)."""
        return self.request("GET", "/v1/status")

    def status(self) -> Status:
        return parse_status(self.status_json(), self.socket_path)

    def profiles(self) -> ProfileList:
        from lynxtop.contract.records import ProfileList

        return typed(self.socket_path, "GET /v1/profiles", ProfileList.from_json, self.request("GET", "/v1/profiles"))

    def runs(self, limit: int = 50) -> list[RunInfo]:
        return runs_of(self.request("GET", "/v1/runs", {"limit": limit}), self.socket_path)

    def events(self, since_ms: int | None = None, limit: int = 500) -> list[Event]:
        return events_of(self.request("GET", "/v1/events", {"since": since_ms, "limit": limit}), self.socket_path)

    def action(self, action: str, profile: str | None = None, *, expect_run: int | None | AnyRun = ANY_RUN,
               **extra: Any) -> ActionAnswer:
        """POST a mutating call; returns the 202 answer. `expect_run`: the run id the caller showed (None: no
        run); the agent refuses with 409 "run_changed" when another run is current."""
        from lynxtop.contract.records import ActionAnswer

        data = self.request("POST", f"/v1/{action}", body=_action_body(action, profile, extra, expect_run))
        return typed(self.socket_path, f"POST /v1/{action}", ActionAnswer.from_json, data)


# ---------------------------------------------------------------------------------------------- asyncio


class AsyncAgentClient:
    """asyncio face, for the dashboard and the demo. `socket_path` may also be another node's read-only TCP
    endpoint, `http://HOST:PORT` (GET /v1/status; its other reads with that node's read `token`)."""

    def __init__(self, socket_path: str | Path, timeout_s: float = DASHBOARD_TIMEOUT_S, token: str | None = None):
        self.socket_path = str(socket_path)
        self.timeout_s = timeout_s
        self._token = token  # never shown: not in any message or repr
        self._closed = False

    async def request(self, method: str, path: str, params: Mapping[str, Any] | None = None,
                      body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        import asyncio

        if self._closed:
            raise AgentUnreachable(f"{self.socket_path}: client closed")
        try:
            status, raw = await asyncio.wait_for(self._exchange(method, _target(path, params), body), self.timeout_s)
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:  # TimeoutError is an OSError
            raise unreachable(exc, self.socket_path, self.timeout_s) from None
        return decode(status, raw, self.socket_path)

    async def _exchange(self, method: str, target: str, body: Mapping[str, Any] | None) -> tuple[int, bytes]:
        import asyncio

        tcp = tcp_address(self.socket_path)  # another node's read-only endpoint (the cluster view); else the socket
        if tcp is not None:
            reader, writer = await asyncio.open_connection(*tcp)
        else:
            reader, writer = await asyncio.open_unix_connection(self.socket_path)
        try:
            payload = json.dumps(body).encode() if body is not None else b""
            head = (f"{method} {target} HTTP/1.1\r\nHost: lynxtop-agent\r\nConnection: close\r\n"
                    "Accept: application/json\r\n")
            if body is not None:
                head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
            head += "".join(f"{k}: {v}\r\n" for k, v in auth_headers(self.socket_path, self._token).items())
            writer.write(head.encode() + b"\r\n" + payload)
            await writer.drain()
            status = _status_code(await reader.readline())
            headers = await _read_headers(reader)
            return status, await _read_body(reader, headers)
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass

    async def status_json(self) -> dict[str, Any]:
        return await self.request("GET", "/v1/status")

    async def status(self) -> Status:
        return parse_status(await self.status_json(), self.socket_path)

    async def profiles(self) -> ProfileList:
        from lynxtop.contract.records import ProfileList

        data = await self.request("GET", "/v1/profiles")
        return typed(self.socket_path, "GET /v1/profiles", ProfileList.from_json, data)

    async def runs(self, limit: int = 50) -> list[RunInfo]:
        return runs_of(await self.request("GET", "/v1/runs", {"limit": limit}), self.socket_path)

    async def events(self, since_ms: int | None = None, limit: int = 500) -> list[Event]:
        return events_of(await self.request("GET", "/v1/events", {"since": since_ms, "limit": limit}),
                         self.socket_path)

    async def logs(self, run_id: int | None = None, lines: int = 2000, after: int | None = None,
                   inode: int | None = None) -> dict[str, Any]:
        """The tail of a run's log; with `after` (and `inode`) of the previous answer, the lines written since."""
        return await self.request("GET", "/v1/logs", {"run": run_id, "lines": lines, "after": after, "inode": inode})

    async def processes(self) -> GpuProcesses:
        """The processes on the node's GPUs at the agent's last tick."""
        from lynxtop.contract.processes import GpuProcesses

        data = await self.request("GET", "/v1/processes")
        try:
            return GpuProcesses.from_json(data)
        except ValueError as exc:
            raise AgentUnreachable(f"the agent at {self.socket_path} answered GET /v1/processes that this lynxtop "
                                   f"cannot read: {exc}") from None

    async def action(self, action: str, profile: str | None = None, *, expect_run: int | None | AnyRun = ANY_RUN,
                     **extra: Any) -> ActionAnswer:
        """POST a mutating call; returns the 202 answer. `expect_run`: as the blocking face's."""
        from lynxtop.contract.records import ActionAnswer

        data = await self.request("POST", f"/v1/{action}", body=_action_body(action, profile, extra, expect_run))
        return typed(self.socket_path, f"POST /v1/{action}", ActionAnswer.from_json, data)

    async def close(self) -> None:
        self._closed = True


def _status_code(status_line: bytes) -> int:
    parts = status_line.decode("latin-1").split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP answer: {status_line[:60]!r}")
    return int(parts[1])


async def _read_headers(reader: asyncio.StreamReader) -> dict[str, str]:
    headers: dict[str, str] = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            return headers
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()


async def _read_body(reader: asyncio.StreamReader, headers: Mapping[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        return await _read_chunked(reader)
    if "content-length" in headers:
        length = int(headers["content-length"])
        if length > MAX_BODY:
            raise ValueError(f"answer of {length} bytes is too large")
        return await reader.readexactly(length)
    return await reader.read(MAX_BODY)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while True:
        size_line = await reader.readline()
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            await reader.readline()
            return bytes(out)
        out += await reader.readexactly(size)
        await reader.readline()
        if len(out) > MAX_BODY:
            raise ValueError("answer is too large")
