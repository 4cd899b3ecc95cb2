"""Bounded listeners: a connection cap per listener, request/idle timeouts, and one log line per episode.

Why: aiohttp keeps an idle or half-sent connection for an hour (its keepalive_timeout is 3630 s) and accepts
as many as the kernel hands over, so 1,500 slow clients on the control socket took every descriptor of the
agent: the API stopped answering, sampling and SQLite failed with EMFILE, and the log filled with tracebacks.

Each listener here holds at most `max_connections`. At the cap, the connection that has waited on its client
the longest (never sent a request first, then idle keep-alive ones; never one whose request is being handled)
is closed to make room, so an operator's `lynxtop status` gets through a flood of slow or idle clients. Only
when every connection has a request in progress is the new one refused with a short 503. A connection that has
not sent a complete request `request_timeout_s` after it opened or after its last answer (slowloris, idle
keep-alive) is closed. Descriptor exhaustion and pressure are logged once per episode, never per event.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

_log = logging.getLogger("lynxtop.connguard")

# errors that mean "out of descriptors or kernel memory": logged once per episode, never with a traceback each
RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
FD_RESERVE = 256  # descriptors kept free of listeners: NVML, /proc reads, SQLite, vLLM pipes and logs, threads
FD_SOFT_CEILING = 65536  # the soft limit is raised toward the hard one, but not beyond this (children inherit it)
REFUSE_LINGER_S = 1.0  # a refused connection stays half-closed this long so the client can read the 503
# asyncio accepts up to `backlog` connections per readiness event before any of them reaches the guard, and a
# closed one frees its descriptor an iteration later: a burst can overshoot the cap by a few batches, so the
# batch is kept small and the overshoot is budgeted.
ACCEPT_BACKLOG = 32
ACCEPT_BURST = 4 * ACCEPT_BACKLOG
MIN_CAP = 8


def is_resource_error(exc: BaseException | None) -> bool:
    return isinstance(exc, OSError) and exc.errno in RESOURCE_ERRNOS


class Episodes:
    """Logs a recurring problem when it starts and when it ends (with its count), never once per occurrence.

    `hit(key, message)` counts one occurrence; the first of an episode is logged. `end(key)` closes it at once
    (e.g. a tick succeeded again); `poll()` closes episodes with no occurrence for `quiet_s`.
    """

    def __init__(self, log: Callable[[str], None], quiet_s: float = 5.0, clock: Callable[[], float] = time.monotonic):
        self.log, self.quiet_s, self.clock = log, quiet_s, clock
        self.open: dict[str, list[Any]] = {}  # key -> [first, last, count, message]
        self.total: dict[str, int] = {}

    def hit(self, key: str, message: str) -> bool:
        now = self.clock()
        self.total[key] = self.total.get(key, 0) + 1
        ep = self.open.get(key)
        if ep is None:
            self.open[key] = [now, now, 1, message]
            self.log(f"{message} (further occurrences are counted and summarised when it ends)")
            return True
        ep[1] = now
        ep[2] += 1
        return False

    def end(self, key: str, what: str = "") -> None:
        ep = self.open.pop(key, None)
        if ep is not None:
            first, _last, count, message = ep
            self.log(f"ended after {self.clock() - first:.1f} s, {count} occurrence(s): {what or message}")

    def poll(self) -> None:
        now = self.clock()
        for key, ep in list(self.open.items()):
            if now - ep[1] >= self.quiet_s:
                self.end(key)


@dataclass
class _Conn:
    transport: asyncio.BaseTransport
    since: float  # opened, or its last request answered: when it started waiting on its client
    requests: int = 0
    busy: int = 0  # requests being handled now


class ConnectionGuard:
    """Caps and times out the connections of one listener; see the module docstring for the policy."""

    def __init__(self, name: str, max_connections: int, request_timeout_s: float, setting: str,
                 json_refusal: bool = True, log: Callable[[str], None] | None = None,
                 episodes: Episodes | None = None, clock: Callable[[], float] = time.monotonic):
        self.name = name
        self.max_connections = max(1, int(max_connections))
        self.request_timeout_s = float(request_timeout_s)
        self.setting = setting  # the config key, named in the refusal
        self.json_refusal = json_refusal
        self.log = log or _log.warning
        self.episodes = episodes or Episodes(self.log)
        self.clock = clock
        self.max_lingering = max(4, min(32, self.max_connections // 8))
        self.conns: dict[GuardedProtocol, _Conn] = {}  # insertion order = oldest first
        self._by_handler: dict[Any, _Conn] = {}
        self._lingering = 0
        self._sweeper: asyncio.TimerHandle | None = None
        self.accepted = self.refused = self.evicted = self.timed_out = 0

    # ------------------------------------------------------------------------------------------ wiring

    def wrap(self, factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """A protocol factory for `loop.create_server` that admits connections through this guard."""
        return lambda: GuardedProtocol(self, factory)

    def start(self) -> None:
        self._schedule()

    def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self.conns.values()):
            conn.transport.close()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        """Marks the connection busy while its request is handled: a busy connection is never evicted."""
        conn = self._by_handler.get(request.protocol)
        if conn is None:
            return await handler(request)
        conn.busy += 1
        conn.requests += 1
        try:
            return await handler(request)
        finally:
            conn.busy -= 1
            conn.since = self.clock()

    def stats(self) -> dict[str, Any]:
        return {"open": len(self.conns), "max": self.max_connections, "accepted": self.accepted,
                "refused": self.refused, "evicted": self.evicted, "timed_out": self.timed_out}

    # ------------------------------------------------------------------------------------------ policy

    def admit(self, proto: GuardedProtocol, transport: asyncio.BaseTransport) -> bool:
        if len(self.conns) >= self.max_connections and not self._evict_one():
            self.refused += 1
            self.episodes.hit(f"{self.name}.refused", f"{self.name}: all {self.max_connections} connections are "
                              f"handling requests; refusing new ones with 503 ([agent] {self.setting})")
            return False
        self.accepted += 1
        self.conns[proto] = _Conn(transport, self.clock())
        return True

    def bind_handler(self, proto: GuardedProtocol, handler: Any) -> None:
        conn = self.conns.get(proto)
        if conn is not None:
            self._by_handler[handler] = conn

    def forget(self, proto: GuardedProtocol) -> None:
        self.conns.pop(proto, None)
        if proto.inner is not None:
            self._by_handler.pop(proto.inner, None)

    def _evict_one(self) -> bool:
        """Close the connection waiting on its client the longest: one that never sent a request first."""
        victim, best = None, None
        for proto, conn in self.conns.items():
            if conn.busy:
                continue
            key = (conn.requests > 0, conn.since)
            if best is None or key < best:
                victim, best = proto, key
        if victim is None:
            return False
        self.evicted += 1
        self.episodes.hit(f"{self.name}.full", f"{self.name}: {self.max_connections} connections open (the "
                          f"limit, [agent] {self.setting}); closing the ones idle the longest to make room")
        self._close(victim)
        return True

    def _close(self, proto: GuardedProtocol) -> None:
        conn = self.conns.get(proto)
        self.forget(proto)
        if conn is not None:
            conn.transport.close()

    def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        step = max(0.05, min(1.0, self.request_timeout_s / 4))
        self._sweeper = loop.call_later(step, self._sweep)

    def _sweep(self) -> None:
        """Close connections that have waited on their client longer than request_timeout_s."""
        now = self.clock()
        for proto, conn in list(self.conns.items()):
            if not conn.busy and now - conn.since > self.request_timeout_s:
                self.timed_out += 1
                self._close(proto)
        self.episodes.poll()
        self._schedule()

    def refusal(self) -> bytes:
        msg = (f"{self.name}: too many connections ({self.max_connections} open and all busy; limit [agent] "
               f"{self.setting}); try again")
        if self.json_refusal:
            body = json.dumps({"error": "too_many_connections", "message": msg}).encode()
            ctype = "application/json"
        else:
            body = (msg + "\n").encode()
            ctype = "text/plain; charset=utf-8"
        head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Retry-After: 1\r\nConnection: close\r\n\r\n").encode()
        return head + body


class GuardedProtocol(asyncio.Protocol):
    """Stands in front of aiohttp's protocol: admits the connection through the guard or answers 503."""

    def __init__(self, guard: ConnectionGuard, factory: Callable[[], asyncio.Protocol]):
        self.guard, self.factory = guard, factory
        self.inner: Any = None
        self.transport: asyncio.BaseTransport | None = None
        self._linger: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if self.guard.admit(self, transport):
            self.inner = self.factory()
            self.guard.bind_handler(self, self.inner)
            self.inner.connection_made(transport)
            return
        self._refuse(transport)

    def _refuse(self, transport: Any) -> None:
        g = self.guard
        with contextlib.suppress(Exception):
            transport.write(g.refusal())
        # half-close and keep reading a moment, so the client reads the 503 rather than a reset; bounded
        if g._lingering < g.max_lingering and transport.can_write_eof():
            g._lingering += 1
            with contextlib.suppress(Exception):
                transport.write_eof()
            self._linger = asyncio.get_running_loop().call_later(REFUSE_LINGER_S, transport.close)
        else:
            transport.close()

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self.inner is not None:
            return self.inner.eof_received()
        return None  # refused: the client has read and closed; close our side

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.inner is not None:
            self.guard.forget(self)
            self.inner.connection_lost(exc)
        elif self._linger is not None:
            self._linger.cancel()
            self._linger = None
            self.guard._lingering -= 1


class GuardedSite(web.BaseSite):
    """An aiohttp site whose connections go through a ConnectionGuard (a bound socket, or host and port)."""

    def __init__(self, runner: web.BaseRunner, guard: ConnectionGuard, *, sock: Any = None, host: str | None = None,
                 port: int | None = None, backlog: int = ACCEPT_BACKLOG, reuse_address: bool | None = None):
        super().__init__(runner, backlog=backlog)
        self.guard, self.sock, self.host, self.port = guard, sock, host, port
        self.reuse_address = reuse_address

    @property
    def name(self) -> str:
        if self.sock is not None:
            return f"http://unix:{self.sock.getsockname()}:"
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        await super().start()  # registers with the runner, which stops it on cleanup
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        factory = self.guard.wrap(server)
        if self.sock is not None:
            self._server = await loop.create_server(factory, sock=self.sock, backlog=self._backlog)
        else:
            self._server = await loop.create_server(factory, self.host, self.port, backlog=self._backlog,
                                                    reuse_address=self.reuse_address)
        self.guard.start()

    async def stop(self) -> None:
        self.guard.stop()
        await super().stop()

    @property
    def sockets(self) -> list[Any]:
        return list(getattr(self._server, "sockets", None) or [])


def handler_args(request_timeout_s: float) -> dict[str, Any]:
    """aiohttp's own timers, tightened: its idle timer (3630 s by default) becomes a backstop just behind the
    guard's sweep, and the unread rest of a body is drained at most 2 s before the connection closes."""
    return {"keepalive_timeout": request_timeout_s + 1.0, "lingering_time": min(2.0, request_timeout_s)}


# ---------------------------------------------------------------------------------------------- descriptors


@dataclass(frozen=True)
class FdPlan:
    soft: int
    hard: int
    raised_from: int | None  # the soft limit before the agent raised it, if it did
    open_at_start: int
    caps: dict[str, int]  # listener -> connection cap after fitting the budget
    reduced: bool  # some cap was lowered to fit

    def describe(self) -> str:
        raised = f" (raised from {self.raised_from})" if self.raised_from is not None else ""
        caps = ", ".join(f"{k} <= {v}" for k, v in self.caps.items())
        return (f"descriptors: limit {self.soft}{raised}, hard {self.hard}, {self.open_at_start} open at start, "
                f"{FD_RESERVE} reserved for sampling and the store; connections: {caps}")


def open_fds() -> int | None:
    """Descriptors open in this process now (None when /proc cannot be read, e.g. at EMFILE itself)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # the listing's own descriptor
    except OSError:
        return None


def plan_descriptors(wanted: dict[str, int], raise_limit: bool = True) -> FdPlan:
    """Raise the soft RLIMIT_NOFILE toward the hard one and fit the listeners' caps under it.

    caps + lingering refusals + an accept burst per listener + what is open now + FD_RESERVE stays under the
    soft limit, so a flood of connections can never take the descriptors that sampling, SQLite and the vLLM
    pipes need.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    raised_from = None
    if raise_limit:
        target = FD_SOFT_CEILING if hard == resource.RLIM_INFINITY else min(hard, FD_SOFT_CEILING)
        if target > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                raised_from, soft = soft, target
            except (ValueError, OSError):
                pass
    open_now = open_fds() or 0
    linger = {k: max(4, min(32, v // 8)) for k, v in wanted.items()}
    budget = soft - open_now - FD_RESERVE - sum(linger.values()) - ACCEPT_BURST * len(wanted)
    total = sum(wanted.values())
    caps = dict(wanted)
    reduced = False
    if total > budget:
        reduced = True
        for k, v in wanted.items():
            caps[k] = max(MIN_CAP, int(v * max(budget, 0) / total))
    return FdPlan(soft=soft, hard=hard, raised_from=raised_from, open_at_start=open_now, caps=caps,
                  reduced=reduced)


def install_loop_handler(loop: asyncio.AbstractEventLoop, episodes: Episodes) -> None:
    """Route the event loop's 'out of descriptors' reports (asyncio logs one per failed accept, with a
    traceback) into one line per episode; everything else goes to the default handler."""

    def handler(lp: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if is_resource_error(exc):
            episodes.hit("loop.resources", f"out of descriptors or kernel memory: {context.get('message', '')}: "
                         f"{exc}")
            return
        lp.default_exception_handler(context)

    loop.set_exception_handler(handler)
