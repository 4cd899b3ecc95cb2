"""The node's reads over its TCP endpoint (`[agent] tcp_reads`): another node's dashboard (the cluster view) opens
this node's History, Events, Logs and Processes, which the unix socket alone serves otherwise.

Why a token: the TCP endpoint is read by anyone who reaches the port (Prometheus' model), which suits metrics but
not event messages, log lines and command lines. So these reads are off unless the config turns them on, and then
answer only a request bearing the token of `[agent] tcp_token_file` (a file with env_file's owner and mode rule),
compared in constant time. The token is never logged, served or stored; a refusal names the peer, never what it sent.

Each read is the control socket's own handler (agent/api/routes.py: the same query checks, the same answers, the
same masking of secrets) or, for the History charts, one of the store reader's reads through the agent's one
history reader (`Controller.history`). Nothing here changes anything: no control route is served on TCP.
"""

from __future__ import annotations

import asyncio
import hmac
import re
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from lynxtop.agent.api.connguard import Episodes
from lynxtop.agent.api.routes import ApiError, ApiServer, _error_response, _json
from lynxtop.contract.events import KIND_MAX, Severity

READ_PATHS = ("/v1/runs", "/v1/events", "/v1/logs", "/v1/processes", "/v1/history")
HISTORY_SLOTS = 2  # history reads at once: each holds a worker thread while SQLite answers
MAX_POINTS = 20_000  # a chart asks ~4 per column of its width
MAX_SEGMENTS = 4096  # gpu_identities' board segments: one per (index, board) held; a node has a handful
INT = (0, 2**62)

MAX_LIST = 64  # entries of a filter's list (kinds, severities, run_ids): a view sends a handful
TEXT_MAX = 200  # characters of a text filter: what a filter box holds, not a document to scan for
_KIND = re.compile(r"[A-Za-z0-9_.-]+")  # a kind or family as stored, older names included (contract/events.py)
_SEVERITIES = tuple(s.value for s in Severity)

# GET /v1/history?read=NAME: each read's query parameters, name -> (kind, required); kinds: int, bool, text, list,
# ints (a list of integers). The filters (kinds, severities, kind_family, text, run_ids) are the store reader's
# parameters: checked here, in one place, then bound as SQL values by the reader, never written into its SQL.
_HISTORY: dict[str, dict[str, tuple[str, bool]]] = {
    "series": {"table": ("text", True), "columns": ("list", False), "start": ("int", True), "end": ("int", True),
               "max_points": ("int", False), "gpu": ("int", False)},
    "runs": {"limit": ("int", False), "text": ("text", False)},
    "run": {"id": ("int", True), "summary": ("bool", False)},
    "events": {"since": ("int", False), "until": ("int", False), "limit": ("int", False), "run": ("int", False),
               "kinds": ("list", False), "severities": ("list", False), "kind_family": ("text", False),
               "text": ("text", False)},
    "bench_results": {"limit": ("int", False), "run_ids": ("ints", False)},
    "gpu_identities": {"max_segments": ("int", False)},
}
_LIMITS = {"limit": (1, 10_000), "max_points": (1, MAX_POINTS), "gpu": (0, 1024), "max_segments": (1, MAX_SEGMENTS)}


def _kind_problem(value: str) -> str | None:
    if len(value) > KIND_MAX or not _KIND.fullmatch(value):
        return (f"must be a kind's dotted name (ASCII letters, digits, _, - and ., at most {KIND_MAX} "
                "characters)")
    return None


# What each filter's value (each entry of a list) must be: the reason it is not, or None
_CHECKS: dict[str, Callable[[str], str | None]] = {
    "kinds": _kind_problem,
    "kind_family": _kind_problem,
    "severities": lambda v: None if v in _SEVERITIES else f"must be one of {', '.join(_SEVERITIES)}",
    "text": lambda v: None if len(v) <= TEXT_MAX else f"is {len(v)} characters long (at most {TEXT_MAX})",
}
_LISTS_BOUNDED = ("kinds", "severities", "run_ids")


def _checked(key: str, value: str) -> str:
    """`value` of query parameter `key` (one entry of a list), or ApiError (400) naming both and the rule."""
    check = _CHECKS.get(key)
    why = check(value) if check is not None else None
    if why is not None:
        shown = value if len(value) <= 40 else value[:37] + "..."
        raise ApiError(400, "bad_value", f"query parameter {key!r}: {shown!r} {why}")
    return value


def _int(key: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, "wrong_type", f"query parameter {key!r} must be an integer, got {raw!r}") from None
    lo, hi = _LIMITS.get(key, INT)
    if not lo <= value <= hi:
        raise ApiError(400, "out_of_range", f"query parameter {key!r}={value} is out of range ({lo}..{hi})")
    return value

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _params(request: web.Request) -> tuple[str, dict[str, Any]]:
    """The history read asked for and its checked parameters; ApiError (400) naming what is wrong."""
    read = request.query.get("read")
    if read not in _HISTORY:
        raise ApiError(400, "unknown_read", f"query parameter 'read' must be one of {', '.join(_HISTORY)}, "
                       f"got {read!r}")
    spec = _HISTORY[read]
    out: dict[str, Any] = {}
    for key, raw in request.query.items():
        if key == "read":
            continue
        if key not in spec:
            raise ApiError(400, "unknown_parameter", f"unknown query parameter {key!r} for read={read} "
                           f"(accepted: {', '.join(spec) or 'none'})")
        kind = spec[key][0]
        if kind == "text":
            out[key] = _checked(key, raw)
        elif kind in ("list", "ints"):
            items = [c for c in raw.split(",") if c]
            if key in _LISTS_BOUNDED and len(items) > MAX_LIST:
                raise ApiError(400, "too_many", f"query parameter {key!r} lists {len(items)} values "
                               f"(at most {MAX_LIST})")
            out[key] = [_int(key, c) for c in items] if kind == "ints" else [_checked(key, c) for c in items]
        elif kind == "bool":
            if raw not in ("0", "1"):
                raise ApiError(400, "wrong_type", f"query parameter {key!r} must be 0 or 1, got {raw!r}")
            out[key] = raw == "1"
        else:
            out[key] = _int(key, raw)
    missing = [k for k, (_, required) in spec.items() if required and k not in out]
    if missing:
        raise ApiError(400, "missing_parameter", f"read={read} needs query parameter {missing[0]!r}")
    return read, out


def _history_read(read: str, p: dict[str, Any]) -> Callable[[Any], Any]:
    """The store reader's call for `read`, returning the answer's JSON (the rows the History screen reads)."""
    if read == "series":
        def series(r: Any) -> Any:
            res, rows = r.series(p["table"], p.get("columns") or None, p["start"], p["end"], gpu=p.get("gpu"),
                                 max_points=p.get("max_points", 2000))
            return {"resolution": res, "rows": rows}
        return series
    if read == "runs":
        return lambda r: {"runs": [x.to_json() for x in r.runs(limit=p.get("limit", 50), text=p.get("text"))]}
    if read == "run":
        def run(r: Any) -> Any:
            found = r.run(p["id"], summary=p.get("summary", True))
            return {"run": found.to_json() if found is not None else None}
        return run
    if read == "gpu_identities":
        return lambda r: _segments(r.gpu_identities(), p.get("max_segments", MAX_SEGMENTS))
    if read == "events":
        return lambda r: {"events": [e.to_json() for e in r.events(
            since_ms=p.get("since"), until_ms=p.get("until"), run_id=p.get("run"), limit=p.get("limit", 500),
            kinds=p.get("kinds") or None, severities=p.get("severities") or None,
            kind_family=p.get("kind_family") or None, text=p.get("text") or None)]}
    return lambda r: {"results": r.bench_results(limit=p.get("limit", 50), run_ids=p.get("run_ids"))}


def _segments(segs: list[dict[str, Any]], cap: int) -> dict[str, Any]:
    """Which board each index held when (StoreReader.gpu_identities), at most `cap` segments: a file whose boards
    flapped (a board dropping off the bus and back at every start) must not make an unbounded answer. Past the cap
    the newest are kept (the charts' windows are mostly recent), in the reader's order, and `truncated` says so."""
    if len(segs) <= cap:
        return {"segments": segs, "truncated": False}
    newest = sorted(segs, key=lambda s: s["since_ms"] if s["since_ms"] is not None else -1)[-cap:]
    kept = {id(s) for s in newest}
    return {"segments": [s for s in segs if id(s) in kept], "truncated": True}


class TcpReads:
    """The guarded read routes of the TCP endpoint, served by the control socket's `api` and its controller."""

    def __init__(self, api: ApiServer, token: str, episodes: Episodes | None = None,
                 log: Callable[[str], None] | None = None):
        if not token:
            raise ValueError("tcp reads need a token")
        self.api = api
        self._expected = f"Bearer {token}".encode()
        self.episodes = episodes or Episodes(log or api.log)
        self._slots = asyncio.Semaphore(HISTORY_SLOTS)

    def authorised(self, request: web.Request) -> bool:
        given = request.headers.get("Authorization", "").encode("utf-8", "replace")
        return hmac.compare_digest(given, self._expected)

    def add_routes(self, app: web.Application) -> None:
        api = self.api
        for path, handler in zip(READ_PATHS, (api._runs, api._events, api._logs, api._processes, self._history),
                                 strict=True):
            app.router.add_get(path, self._guarded(handler))

    def _guarded(self, handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            if not self.authorised(request):
                # once per episode; the peer's address only, never the header it sent
                self.episodes.hit("tcp_reads.unauthorised", f"refused: {request.remote} asked GET {request.path} "
                                  "over TCP without the read token ([agent] tcp_token_file)", quiet_single=True)
                resp = _error_response(401, "unauthorized", f"GET {request.path} on this node's TCP endpoint needs "
                                       "its read token (Authorization: Bearer TOKEN): give the dashboard the "
                                       "node's [agent] tcp_token_file (--node-token-file)")
                resp.headers["WWW-Authenticate"] = 'Bearer realm="lynxtop"'
                return resp
            return await self.api._errors(request, handler)  # the socket's error answers, word for word

        return guarded

    async def _history(self, request: web.Request) -> web.Response:
        read, params = _params(request)
        call = _history_read(read, params)

        async with self._slots:
            try:
                data = await self.api.controller.history(call)  # type: ignore[attr-defined]
            except ValueError as exc:  # an unknown table or column: the reader's own words
                raise ApiError(400, "bad_read", str(exc)) from None
        return _json(data)


def add_refusals(app: web.Application) -> None:
    """With tcp_reads off, the read paths answer 403 saying how to turn them on (not a bare 404)."""

    async def off(request: web.Request) -> web.Response:
        return _error_response(403, "tcp_reads_off", f"GET {request.path} is not served on this node's TCP "
                               "endpoint: set [agent] tcp_reads = true and tcp_token_file on that node (its "
                               "/metrics and /v1/status stay open)")

    for path in READ_PATHS:
        app.router.add_get(path, off)
