"""The control API: JSON over a unix socket (docs/contracts.md, docs/api.md).

This layer parses, authorizes and maps errors to HTTP; the controller (agent/api/control.py) owns state and
policy. Everything a request could get wrong is checked before the controller is called, so a bad request
changes nothing. The socket is the security boundary: mode 0660 with the operators' group, and mutating
calls re-check the peer's kernel credentials (a socket file with looser permissions still refuses them).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import inspect
import json
import logging
import math
import os
import re
import socket
import stat
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from lynxtop.agent import dirtrust
from lynxtop.agent.api.connguard import ConnectionGuard, Episodes, GuardedSite, handler_args
from lynxtop.agent.api.control import ActionError, Controller
from lynxtop.agent.api.logtail import LogTail
from lynxtop.agent.api.peercred import Peer, group_gid, may_control, peer_of
from lynxtop.agent.api.pending import EventsAnswer
from lynxtop.contract.events import Event
from lynxtop.contract.jsonsafe import strict_dumps as _strict_dumps
from lynxtop.contract.processes import GpuProcesses
from lynxtop.contract.records import ActionAnswer, ProfileList, RunInfo
from lynxtop.contract.terminal import first_control
from lynxtop.store.schema import BENCH_COLUMNS

MAX_BODY = 64 * 1024
MAX_TEXT = 256  # a profile name or a stop's reason: shown in the status, the events and the log
INT64 = (-(2**63), 2**63 - 1)  # what an SQLite INTEGER holds: a body's integers must fit it
DEFAULT_MAX_CONNECTIONS = 256  # [agent] api_max_connections
DEFAULT_REQUEST_TIMEOUT_S = 10.0  # [agent] request_timeout_s
SUN_PATH_MAX = 107  # sockaddr_un.sun_path is 108 bytes including the NUL
# Someone's live socket reported in the control socket's place is probed again every this many checks (node.py:
# every 5 s, so 30 s): once that process has exited, its dead socket file is replaced as any dead one is.
TOLD_SOCKET_RECHECK = 6
# A path the agent cannot bind again (its directory removed where it may not mkdir: /run/lynxtop under systemd) is
# retried at every check, quietly: the failure is told once, then only as a reminder this often while it lasts.
LOST_REMINDER_S = 3600.0

_log = logging.getLogger("lynxtop.api")


class ApiStartError(RuntimeError):
    """The API cannot listen; the message says why and what to do."""


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.details = status, code, message, details


def _dumps(data: Any) -> str:
    """Every answer's JSON, strict (RFC 8259): `Infinity` or `NaN` would make it unreadable to strict parsers.
    Sources give finite values (agent/metrics/scrape.py checks every value of a page); one that still slipped through
    is sent as null, never as a token a client cannot parse (contract/jsonsafe.py, shared with the CLI)."""
    return _strict_dumps(data)


_json = functools.partial(web.json_response, dumps=_dumps)  # the one way answers are serialised
strict_dumps = _dumps  # for the exporter's GET /v1/status (agent/node.py): the same text as this socket's


def _error_response(status: int, code: str, message: str, details: dict[str, Any] | None = None) -> web.Response:
    body: dict[str, Any] = {"error": code, "message": message}
    if details:
        body["details"] = details
    return _json(body, status=status)


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


# expect_run: the run id the caller saw (null: it saw none); another run current is refused with 409 run_changed
# (agent/api/control.py, ExpectRun). Absent: the action acts on whatever run is current.
_EXPECT_RUN = {"expect_run": (int, False)}
# Fields each mutating call accepts: name -> (type, required).
_BODY_SPEC: dict[str, dict[str, tuple[type, bool]]] = {
    "start": {"profile": (str, False)} | _EXPECT_RUN,
    "stop": {"cluster": (bool, False)} | _EXPECT_RUN,  # cluster: on a head, the workers' Ray and its own too
    "restart": dict(_EXPECT_RUN),
    "switch": {"profile": (str, True)} | _EXPECT_RUN,
    "bench": {"result": (dict, True)},  # one level of `lynxtop bench`, stored in bench_results
    # this node's Ray (head and worker roles); a head's cluster stop asks each worker this way, through Ray
    "ray/start": {},
    "ray/stop": {"reason": (str, False)},
}
# The range of a body's integer fields (an int field not named here: any int64). Run ids are SQLite rowids.
_INT_RANGE: dict[str, tuple[int, int]] = {"expect_run": (1, 2**62)}
# Query parameters each read call accepts: name -> (min, max, default).
_QUERY_SPEC: dict[str, dict[str, tuple[int, int, int | None]]] = {
    "status": {},
    "profiles": {},
    "runs": {"limit": (1, 10_000, 50)},
    "events": {"since": (0, 2**62, None), "limit": (1, 10_000, 500)},
    "processes": {},
    # after/inode: a follower's previous `next` and `inode` (agent/api/logtail.py): only the lines written since
    "logs": {"run": (1, 2**62, None), "lines": (1, 100_000, 200), "after": (0, 2**62, None),
             "inode": (0, 2**64 - 1, None)},
}


_DECIMAL = re.compile(r"-?[0-9]+")


def _query(request: web.Request, call: str) -> dict[str, int | None]:
    spec = _QUERY_SPEC[call]
    for key in request.query:
        if key not in spec:
            known = ", ".join(spec) or "none"
            raise ApiError(400, "unknown_parameter", f"unknown query parameter {key!r} (accepted: {known})")
    out: dict[str, int | None] = {}
    for key, (lo, hi, default) in spec.items():
        raw = request.query.get(key)
        if raw is None:
            out[key] = default
            continue
        if not _DECIMAL.fullmatch(raw):  # int() would also take "1_000", " 5 " and non-ASCII digits
            raise ApiError(400, "wrong_type", f"query parameter {key!r} must be an integer (ASCII digits, an "
                           f"optional leading '-'), got {raw!r}")
        value = int(raw)
        if not lo <= value <= hi:
            raise ApiError(400, "out_of_range", f"query parameter {key!r}={value} is out of range ({lo}..{hi})")
        out[key] = value
    return out


async def _body(request: web.Request, action: str, timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S) -> dict[str, Any]:
    """The checked JSON body of a mutating call: read within the timeout, parsed, and matched to its spec."""
    data = _parse_body(await _read_body(request, timeout_s))
    _check_fields(data, action)
    check_values(data)
    return data


async def _read_body(request: web.Request, timeout_s: float) -> bytes:
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise ApiError(413, "too_large", f"request body of {request.content_length} bytes exceeds {MAX_BODY} bytes")
    try:
        # a client that announces a body and sends it slowly (or never) must not hold the connection
        return await asyncio.wait_for(request.read(), timeout_s)
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, "too_large", f"request body exceeds {MAX_BODY} bytes") from None
    except TimeoutError:
        raise ApiError(408, "timeout", f"request body not received within {timeout_s:g} s "
                       "([agent] request_timeout_s)") from None


def _parse_body(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "invalid_json", f"request body is not valid JSON: {exc}") from None
    except RecursionError:  # e.g. 30,000 nested '[': under the size limit, over the parser's stack
        raise ApiError(400, "invalid_json", "request body is not valid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise ApiError(400, "wrong_type", f"request body must be a JSON object, got {type(data).__name__}")
    return data


def check_values(data: dict[str, Any]) -> None:
    """Every number and text in a body, at any depth, must be one the history database can store faithfully.

    The one check for every JSON body that may reach the store: an integer outside int64 makes the SQLite
    driver raise (and once cost a whole batch of writes), and NaN, Infinity or 1e400 (parsed as infinity)
    would be stored as rows no reader can use; a text (or key) holding a lone surrogate (`"\\ud800"` is valid
    JSON) is not UTF-8, so SQLite refuses it, the store drops the write and reports an error for every later
    status. Refused with the field's path, before anything is changed. Iterative: a body nested as deep as the
    JSON parser allows must not overflow this walk's stack.
    """
    _check_keys("", data)
    todo: list[tuple[str, Any]] = [(k, v) for k, v in data.items()]
    while todo:
        where, value = todo.pop()
        if isinstance(value, dict):
            _check_keys(f"{where}.", value)
            todo += [(f"{where}.{k}", v) for k, v in value.items()]
        elif isinstance(value, list):
            todo += [(f"{where}[{i}]", v) for i, v in enumerate(value)]
        elif isinstance(value, bool):
            continue
        elif isinstance(value, str):
            if not _utf8(value):
                raise ApiError(400, "invalid_text", f"field {where!r} holds a lone surrogate (not UTF-8 text)",
                               {"field": where})
        elif isinstance(value, int) and not INT64[0] <= value <= INT64[1]:
            digits = len(str(abs(value)))
            raise ApiError(400, "out_of_range", f"field {where!r}: the integer of {digits} digits is outside the "
                           f"64-bit range the history database stores ({INT64[0]}..{INT64[1]})",
                           {"field": where})
        elif isinstance(value, float) and not math.isfinite(value):
            raise ApiError(400, "not_finite", f"field {where!r} is {value!r}: numbers must be finite (NaN, "
                           "Infinity and values beyond 1.8e308 are refused)", {"field": where})


def _check_keys(where: str, obj: dict[str, Any]) -> None:
    """Each key of `obj` is UTF-8 text (checked once, here, not again in every path below it)."""
    for key in obj:
        if not _utf8(key):
            raise ApiError(400, "invalid_text", f"field {where + key!r}: its name holds a lone surrogate (not UTF-8 "
                           "text)", {"field": where + key})


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _check_fields(data: dict[str, Any], action: str) -> None:
    spec = _BODY_SPEC[action]
    for key in data:
        if key not in spec:
            known = ", ".join(spec) or "none"
            raise ApiError(400, "unknown_field", f"unknown field {key!r} for {action} (accepted: {known})")
    for key, (typ, required) in spec.items():
        if key not in data:
            if required:
                raise ApiError(400, "missing_field", f"field {key!r} is required for {action}")
            continue
        _check_value(key, data[key], typ, required)


def _check_value(key: str, value: Any, typ: type, required: bool) -> None:
    if value is None and not required:
        return
    if not isinstance(value, typ) or (isinstance(value, bool) and typ is not bool):
        raise ApiError(400, "wrong_type", f"field {key!r} must be a {typ.__name__}, got {type(value).__name__}")
    if typ is str:
        if not value:
            raise ApiError(400, "wrong_type", f"field {key!r} must not be empty")
        if len(value) > MAX_TEXT:
            raise ApiError(400, "too_long", f"field {key!r} is {len(value)} characters long (at most {MAX_TEXT})")
        bad = first_control(value)
        if bad is not None:  # served in every status and written to the log: no forged line, no escape sequence
            raise ApiError(400, "invalid_text", f"field {key!r} holds the control character {bad}")
    if key in _INT_RANGE and not _INT_RANGE[key][0] <= value <= _INT_RANGE[key][1]:
        shown = value if abs(value) < 10**20 else "a larger integer"  # a body may hold thousands of digits
        raise ApiError(400, "out_of_range", f"field {key!r} is out of range ({_INT_RANGE[key][0]}.."
                       f"{_INT_RANGE[key][1]}), got {shown}", {"field": key})


class ApiServer:
    """aiohttp on a unix socket. `start()` refuses (ApiStartError) if another agent answers on the path."""

    def __init__(
        self,
        controller: Controller,
        socket_path: str | os.PathLike[str],
        group: str = "lynxtop",
        agent_uid: int | None = None,
        log: Callable[[str], None] | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        episodes: Episodes | None = None,
    ):
        self.controller = controller
        self.socket_path = Path(socket_path)
        self.group = group
        self.agent_uid = os.getuid() if agent_uid is None else agent_uid
        self.log = log or _log.info
        self.request_timeout_s = request_timeout_s
        self.guard = ConnectionGuard("control socket", max_connections, request_timeout_s, "api_max_connections",
                                     json_refusal=True, log=self.log, episodes=episodes)
        self._runner: web.AppRunner | None = None
        self._ident: tuple[int, int] | None = None  # (device, inode) of the socket file this agent listens on
        self._site: GuardedSite | None = None
        self._told: tuple[int, int] | None = None  # a file in the socket's place already reported as not ours
        self._told_checks = 0  # checks since then (a socket reported is probed again: TOLD_SOCKET_RECHECK)
        # the failure to bind the path again that was last told (its message), when the path was first found lost
        # and when it was last told: a failure repeating every check is one episode, not one event per check
        self._lost_error: str | None = None
        self._lost_since: float | None = None
        self._lost_told_at = 0.0
        self._lost_tries = 0
        self.app = self._make_app()

    # ------------------------------------------------------------------------------------------ lifecycle

    def _make_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self.guard.middleware, self._errors])
        app.router.add_get("/v1/status", self._status)
        app.router.add_get("/v1/profiles", self._profiles)
        app.router.add_get("/v1/runs", self._runs)
        app.router.add_get("/v1/events", self._events)
        app.router.add_get("/v1/logs", self._logs)
        app.router.add_get("/v1/processes", self._processes)
        for action in _BODY_SPEC:
            app.router.add_post(f"/v1/{action}", self._mutating(action))
        return app

    async def start(self) -> None:
        path = self.socket_path
        if len(os.fsencode(path)) > SUN_PATH_MAX:
            raise ApiStartError(f"control socket path {path} is longer than {SUN_PATH_MAX} bytes; choose a shorter "
                                "[agent] socket")
        self._clear_stale(path)
        gid = group_gid(self.group)
        if not path.parent.exists():
            path.parent.mkdir(parents=True, mode=0o750)
            if gid is not None:
                with contextlib.suppress(OSError):
                    os.chown(path.parent, -1, gid)
        sock = self._bind(path, gid)
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False,
                                     **handler_args(self.request_timeout_s))
        await self._runner.setup()
        self._site = GuardedSite(self._runner, self.guard, sock=sock)
        await self._site.start()
        st = path.stat()
        self._ident = (st.st_dev, st.st_ino)
        mode = stat.S_IMODE(path.stat().st_mode)
        who = f"group {self.group!r}" if gid is not None else f"root and uid {self.agent_uid} only (group " \
            f"{self.group!r} does not exist)"
        self.log(f"control API listening on {path} (mode {mode:o}; control by {who}; at most "
                 f"{self.guard.max_connections} connections, {self.request_timeout_s:g} s per request)")

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        with contextlib.suppress(OSError):  # only the file this agent bound: (device, inode) of the path itself
            st = self.socket_path.lstat()
            if self._ident is not None and (st.st_dev, st.st_ino) == self._ident:
                self.socket_path.unlink()
        self._ident = None

    def check_socket(self) -> tuple[bool, str] | None:
        """Re-create the control socket when its path no longer names it (a tmpfiles clean of /run, an `rm`).

        Returns (re-created, what happened) for the caller's event, None while the path is this agent's (or a
        file in its place was already reported). A live socket of someone else, or a file that is not a
        socket, is left alone and reported once; such a socket is probed again every TOLD_SOCKET_RECHECK checks
        and replaced once nobody answers on it (its process exited). Connections already accepted go on.
        """
        if self._site is None or self._ident is None:
            return None
        path = self.socket_path
        try:
            st: os.stat_result | None = path.lstat()
        except FileNotFoundError:
            st = None
        except OSError:
            return None
        ident = (st.st_dev, st.st_ino) if st is not None else None
        if ident == self._ident:
            return None
        what = f"control socket {path} " + ("was removed" if st is None else "was replaced by another file")
        if st is not None and ident == self._told:
            self._told_checks += 1
            if not stat.S_ISSOCK(st.st_mode) or self._told_checks % TOLD_SOCKET_RECHECK:
                return None
            try:  # its process may have exited since, leaving its socket file: probed, removed when dead
                self._clear_stale(path)
            except (ApiStartError, OSError):
                return None  # still answering: reported already
            what = f"control socket {path}: the other process's socket in its place no longer answers"
        try:
            if st is not None:
                self._clear_stale(path)
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
            sock = self._bind(path, group_gid(self.group))
        except (ApiStartError, OSError) as exc:
            self._told, self._told_checks = ident, 0
            return self._not_recreated(what, str(exc))
        self._site.replace_socket(sock)
        st = path.stat()
        self._ident, self._told = (st.st_dev, st.st_ino), None
        msg = f"{what}; re-created it (mode {stat.S_IMODE(st.st_mode):o}): `lynxtop` reaches the agent again"
        if self._lost_since is not None:  # the end of an episode of failed re-creations: how long, how many tries
            msg += (f" after {time.monotonic() - self._lost_since:.0f} s without it ({self._lost_tries} failed "
                    "tries)")
        self._lost_error, self._lost_since, self._lost_tries = None, None, 0
        return True, msg

    def _not_recreated(self, what: str, error: str) -> tuple[bool, str] | None:
        """A failed re-creation: told when it is new, quiet while the same failure repeats (the caller checks
        every 5 s; an unprivileged agent whose directory is gone fails every time), reminded every
        LOST_REMINDER_S. The next success tells the end with how long it lasted."""
        now = time.monotonic()
        self._lost_tries += 1
        if self._lost_since is None:
            self._lost_since = now
        if error == self._lost_error and now - self._lost_told_at < LOST_REMINDER_S:
            return None
        again = error == self._lost_error
        self._lost_error, self._lost_told_at = error, now
        if again:
            return False, (f"{what}; still not re-created after {now - self._lost_since:.0f} s ({self._lost_tries} "
                           f"failed tries, retrying every check): {error}")
        return False, f"{what}; not re-created: {error} (retrying quietly; an event when it is back)"

    def _clear_stale(self, path: Path) -> None:
        try:
            st = path.lstat()
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise ApiStartError(f"{path} exists and is not a socket; refusing to remove it (move it away or set "
                                "[agent] socket)")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError as exc:
            if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
                path.unlink(missing_ok=True)  # nobody listens: left behind by an agent that died
                return
            raise ApiStartError(f"cannot check whether something listens on {path}: {exc}") from None
        finally:
            probe.close()
        raise ApiStartError(f"another process (probably a lynxtop agent) is answering on {path}; stop it first "
                            "(systemctl stop lynxtop-agent) or choose another [agent] socket")

    def _bind(self, path: Path, gid: int | None) -> socket.socket:
        # Bind under a private name with a tight umask (the socket is made 0660), set its group, then rename it into
        # place: the final path never exists with looser permissions, and a client never sees a half-set-up socket.
        # Only in a directory no other user can swap names in (dirtrust: the agent's own, or sticky like /tmp); and
        # the name is checked with lstat (a socket of this agent's user) and chowned without following a link
        # before anything is set on it: a chmod/chown by path follows a symlink put there since the bind.
        if why := dirtrust.problem(path.parent, "the control socket's directory", "[agent] socket", sticky_ok=True):
            raise ApiStartError(why)
        tmp = path.parent / f".{path.name}.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            old = os.umask(0o117)
            try:
                sock.bind(str(tmp))
            finally:
                os.umask(old)
            st = tmp.lstat()
            if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
                raise ApiStartError(f"{tmp} is not the socket just bound there (a {stat.filemode(st.st_mode)} of uid "
                                    f"{st.st_uid}): something replaced it in {path.parent}; not used (make that "
                                    "directory the agent's own, or set [agent] socket)")
            if stat.S_IMODE(st.st_mode) != 0o660:  # a default ACL on the directory overrides the umask
                os.chmod(tmp, 0o660)  # checked above: our socket, in a directory nobody else may swap it in
            if gid is not None:
                try:
                    os.chown(tmp, -1, gid, follow_symlinks=False)
                except PermissionError:
                    self.log(f"warning: cannot give {path} to group {self.group!r} (the agent is not a member); "
                             "only root and the agent's user can use it")
            os.rename(tmp, path)
            sock.listen(128)
            sock.setblocking(False)
        except (OSError, ApiStartError) as exc:
            sock.close()
            tmp.unlink(missing_ok=True)  # removes a link put there, never what it points to
            if isinstance(exc, ApiStartError):
                raise
            raise ApiStartError(f"cannot listen on {path}: {exc}") from None
        return sock

    # ------------------------------------------------------------------------------------------ plumbing

    @web.middleware
    async def _errors(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as exc:
            return _error_response(exc.status, exc.code, exc.message, exc.details)
        except ActionError as exc:
            return _error_response(exc.http_status, exc.code, exc.message, exc.details)
        except web.HTTPRequestEntityTooLarge:
            return _error_response(413, "too_large", f"request body exceeds {MAX_BODY} bytes")
        except web.HTTPMethodNotAllowed as exc:
            allowed = ", ".join(sorted(exc.allowed_methods))
            return _error_response(405, "method_not_allowed", f"{request.method} is not allowed on {request.path} "
                                   f"(allowed: {allowed})")
        except web.HTTPNotFound:
            return _error_response(404, "not_found", f"no such endpoint: {request.method} {request.path} "
                                   "(see docs/api.md)")
        except web.HTTPException as exc:
            return _error_response(exc.status, "http_error", exc.reason)
        except Exception as exc:  # a bug in the controller must not kill the API, and must be visible
            self.log(f"error: {request.method} {request.path} failed: {exc!r}\n{traceback.format_exc()}")
            return _error_response(500, "internal", f"internal error: {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------------------------------ read-only

    async def _status(self, request: web.Request) -> web.Response:
        _query(request, "status")
        body = getattr(self.controller, "status_body", None)  # the agent's: its tick part encoded once per tick
        if body is not None:
            return web.Response(text=await _maybe_await(body(_dumps)), content_type="application/json")
        status = await _maybe_await(self.controller.status())
        return _json(status.to_json())

    async def _profiles(self, request: web.Request) -> web.Response:
        _query(request, "profiles")
        profiles: ProfileList = await _maybe_await(self.controller.profiles())
        return _json(profiles.to_json())

    async def _runs(self, request: web.Request) -> web.Response:
        q = _query(request, "runs")
        runs: list[RunInfo] = await _maybe_await(self.controller.runs(q["limit"]))
        return _json({"runs": [r.to_json() for r in runs]})

    async def _events(self, request: web.Request) -> web.Response:
        q = _query(request, "events")
        answer: EventsAnswer | list[Event] = await _maybe_await(self.controller.events(q["since"], q["limit"]))
        if not isinstance(answer, EventsAnswer):  # a controller that gives the events alone: the history was read
            answer = EventsAnswer(answer)
        return _json(answer.to_json())

    async def _logs(self, request: web.Request) -> web.StreamResponse:
        q = _query(request, "logs")
        if q["after"] is None:
            if q["inode"] is not None:
                raise ApiError(400, "missing_parameter", "query parameter 'inode' needs 'after' (the offset "
                               "in that file to follow from)")
            result = await _maybe_await(self.controller.logs(q["run"], q["lines"]))
        else:
            result = await _maybe_await(self.controller.logs(q["run"], q["lines"], after=q["after"],
                                                             inode=q["inode"]))
        tail = result.get("lines")
        if not isinstance(tail, LogTail):
            return _json(result)
        return await _stream_log(request, {**result, **tail.follow_info()}, tail)

    async def _processes(self, request: web.Request) -> web.Response:
        _query(request, "processes")
        answer: GpuProcesses = await _maybe_await(self.controller.processes())
        return _json(answer.to_json())

    # ------------------------------------------------------------------------------------------ mutating

    def _mutating(self, action: str) -> Callable:
        async def handler(request: web.Request) -> web.Response:
            peer = peer_of(request.transport.get_extra_info("socket") if request.transport else None)
            who = peer.describe() if peer else "unknown peer"
            if not may_control(peer, self.agent_uid, self.group):
                self.log(f"denied: {who} asked POST /v1/{action} (not root, uid {self.agent_uid} or group "
                         f"{self.group!r})")
                raise ApiError(403, "forbidden", f"{who} may not {action}: control needs root, the agent's user "
                               f"or membership of group {self.group!r}; read-only calls stay open")
            data = await _body(request, action, self.request_timeout_s)
            profile = data.get("profile")
            if profile is not None:
                await self._check_profile(profile)
            if action == "bench":
                _check_bench(data["result"])
            started = time.monotonic()
            try:
                message = await self._dispatch(action, data, who, peer)
            except ActionError as exc:
                # once per episode, with its count when it ends: 10,000 refused restarts once wrote 10,000 lines
                self.guard.episodes.hit(f"refused.{action}.{exc.code}", f"refused: {who} asked "
                                        f"{action}{_for(profile)}: {exc.code}: {exc.message}", quiet_single=True)
                raise
            self.log(f"accepted: {who} asked {action}{_for(profile)} ({(time.monotonic() - started) * 1000:.0f} ms): "
                     f"{message}")
            return _json(ActionAnswer(True, action, message).to_json(), status=202)

        return handler

    async def _check_profile(self, name: str) -> None:
        profiles: ProfileList = await _maybe_await(self.controller.profiles())
        known = profiles.names
        if name not in known:
            raise ApiError(404, "unknown_profile", f"no profile named {name!r} (known: {', '.join(known) or 'none'})")

    async def _dispatch(self, action: str, data: dict[str, Any], by: str, peer: Peer | None) -> str:
        c = self.controller
        profile = data.get("profile")
        # passed only when named: null ("I saw no run") is a check, leaving the field out is none
        seen: dict[str, Any] = {"expect_run": data["expect_run"]} if "expect_run" in data else {}
        if action == "bench":
            return await c.store_bench(data["result"], by)
        if action == "start":
            return await c.start(profile, by, **seen)
        if action == "stop":
            return await (c.stop(by, cluster=True, **seen) if data.get("cluster") else c.stop(by, **seen))
        if action == "ray/start":
            return await c.ray_start(by)
        if action == "ray/stop":
            return await c.ray_stop(by, data.get("reason"))
        if action == "restart":
            return await c.restart(by, **seen)
        assert profile is not None  # _body made it required
        return await c.switch(profile, by, **seen)


async def _stream_log(request: web.Request, result: dict[str, Any], tail: LogTail) -> web.StreamResponse:
    """The same JSON as a whole answer, written a block at a time, each once the client took the previous ones:
    a client that never reads holds one block here (and the guard drops it), never the whole tail."""
    resp = web.StreamResponse(headers={"Content-Type": "application/json; charset=utf-8"})
    head = _dumps({k: v for k, v in result.items() if k != "lines"})
    pieces = tail.reader()
    try:
        await resp.prepare(request)
        await resp.write((head[:-1] + (", " if len(head) > 2 else "") + '"lines": [').encode())
        while (piece := await asyncio.to_thread(next, pieces, None)) is not None:
            await resp.write(piece.encode())
        await resp.write(b"]}")
        await resp.write_eof()
    except ConnectionError:
        pass  # the client went away, or was dropped as a slow reader: nobody is left to tell
    finally:
        pieces.close()
    return resp


_BENCH_TYPES = {"INTEGER": (int,), "REAL": (int, float), "TEXT": (str,)}


def _check_bench(result: dict[str, Any]) -> None:
    """A bench level's columns must have their column's type (NULL allowed); other keys go to `details`."""
    for name, typ in BENCH_COLUMNS:
        value = result.get(name)
        if value is None or name == "details":
            continue
        if isinstance(value, bool) or not isinstance(value, _BENCH_TYPES[typ]):
            raise ApiError(400, "wrong_type", f"result field {name!r} must be {typ.lower()}, "
                           f"got {type(value).__name__}")


def _for(profile: str | None) -> str:
    return f" {profile!r}" if profile else ""
