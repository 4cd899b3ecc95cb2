"""Bounded listeners: a connection cap per listener, request/idle timeouts, and one log line per episode.

Why: aiohttp keeps an idle or half-sent connection for an hour (its keepalive_timeout is 3630 s) and accepts
as many as the kernel hands over, so 1,500 slow clients on the control socket took every descriptor of the
agent: the API stopped answering, sampling and SQLite failed with EMFILE, and the log filled with tracebacks.

Each listener accepts in its own loop (GuardedSite) and admits every connection through a ConnectionGuard:
- at most `max_connections` at once; one client (a process on the unix socket, an address on TCP) at most a
  quarter of them. A client over its share competes with itself: its own oldest idle connection gives way once
  it has waited a second, else the new one is refused. At the cap, the connection that has waited on its client
  the longest gives way (never-used ones first, never one whose request is being handled); only when all are
  busy is a new one refused. So a flood of slow or idle connections cannot lock out `lynxtop status`.
- a refusal is a short 503 written at accept and a close, before any transport, task or HTTP parser exists.
- a connection that has not sent a complete request `request_timeout_s` after it opened or after its last
  answer (slowloris, idle keep-alive) is closed; a slow body is bounded by the API's own read timeout.
- the sweep that closes them is armed for the first deadline and runs at most once a step (request_timeout_s
  / 4, at most 1 s), so a connection is closed at most a step past its deadline, as when the sweep ran every
  step; nothing open, nothing armed: an idle listener does not wake the event loop (~80 us a wake-up; 29.3).
- a slow reader is dropped: each connection buffers at most WRITE_BUFFER_HIGH bytes of its answers (a writer
  waits for the client past that), and one whose client has taken nothing for `request_timeout_s` is aborted,
  its buffer freed. 50 log streams opened and never read once held 1.9 GB, busy (so never timed out) forever.
- descriptors: the soft RLIMIT_NOFILE is raised and the caps fitted under it with a reserve (plan_descriptors),
  and running out anyway is logged once per episode (Episodes), never per event.
"""

from __future__ import annotations

import _socket
import asyncio
import contextlib
import errno
import json
import logging
import math
import os
import resource
import socket
import struct
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
# connections accepted per readiness event, i.e. per turn of the event loop: each step of a sampling tick (a
# thread's result, a scrape's read) waits behind one batch per listener. 64 made slowloris.py's flood (~2,500
# connections a second, accepted and refused) hold a turn for tens of ms and miss ticks; 16 takes it in
# shorter slices, the same work
ACCEPT_BACKLOG = 16
# an evicted connection frees its descriptor an iteration later, so a burst can overshoot the cap by a few
# batches: budgeted (as much as when batches were 64)
ACCEPT_BURST = 8 * ACCEPT_BACKLOG
# the kernel's queue is long (it costs the agent no descriptor): a full queue makes a unix-socket connect fail
# at once with EAGAIN, so `lynxtop status` would fail during a flood instead of waiting its turn
LISTEN_QUEUE = 4096  # the kernel clamps it to net.core.somaxconn
REFUSAL_TEXTS_PER_S = 20  # refusals written out per second and listener; past that a flood's are just closed
MIN_CAP = 8
WRITE_BUFFER_HIGH = 64 * 1024  # bytes of answers kept per connection before the writer waits for the client
SWEEP_SLACK_S = 0.01  # a sweep runs this long after the deadline it is for: a loop timer may fire a little early


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

    def hit(self, key: str, message: str, quiet_single: bool = False) -> bool:
        """Count one occurrence; True when it opened an episode (and was logged). With `quiet_single`, an
        episode of one occurrence ends without a summary line (a one-off refusal is said once, not twice)."""
        now = self.clock()
        self.total[key] = self.total.get(key, 0) + 1
        ep = self.open.get(key)
        if ep is None:
            self.open[key] = [now, now, 1, message, quiet_single]
            self.log(f"{message} (further occurrences are counted and summarised when it ends)")
            return True
        ep[1] = now
        ep[2] += 1
        return False

    def again(self, key: str) -> bool:
        """Count one more occurrence of an open episode: True; False when none is open (then `hit` it with its
        message). A flood's thousands of refusals a second count here without building a message each."""
        ep = self.open.get(key)
        if ep is None:
            return False
        self.total[key] += 1
        ep[1] = self.clock()
        ep[2] += 1
        return True

    def end(self, key: str, what: str = "") -> None:
        ep = self.open.pop(key, None)
        if ep is not None:
            first, _last, count, message, quiet_single = ep
            if count == 1 and quiet_single:
                return
            self.log(f"ended after {self.clock() - first:.1f} s, {count} occurrence(s): {what or message}")

    def poll(self) -> None:
        now = self.clock()
        for key, ep in list(self.open.items()):
            if now - ep[1] >= self.quiet_s:
                self.end(key)


@dataclass(eq=False)
class _Conn:
    peer: str  # "pid 123 uid 1000" on the unix socket, the address on TCP
    since: float  # accepted, or its last request answered: when it started waiting on its client
    transport: asyncio.BaseTransport | None = None  # None until asyncio has made the transport
    requests: int = 0
    busy: int = 0  # requests being handled now
    stalled_since: float | None = None  # its write buffer is full and the client has not read since


class ConnectionGuard:
    """Caps and times out the connections of one listener; see the module docstring for the policy.

    One client (a process on the unix socket, an address on TCP) may hold at most `per_client` connections: past
    that, its own oldest idle connection gives way if it has waited `grace_s`, else the new one is refused at
    once (cheaply, before any HTTP machinery exists). So a client that floods the listener competes with itself,
    and another client's `lynxtop status` finds a free slot.
    """

    def __init__(self, name: str, max_connections: int, request_timeout_s: float, setting: str,
                 json_refusal: bool = True, log: Callable[[str], None] | None = None,
                 episodes: Episodes | None = None, clock: Callable[[], float] = time.monotonic,
                 per_client: int | None = None):
        self.name = name
        self.max_connections = max(1, int(max_connections))
        self.per_client = per_client or max(4, self.max_connections // 4)
        self.request_timeout_s = float(request_timeout_s)
        self.grace_s = min(1.0, self.request_timeout_s / 2)
        self.setting = setting  # the config key, named in the refusal
        self.json_refusal = json_refusal
        self.log = log or _log.warning
        self.episodes = episodes or Episodes(self.log)
        self.clock = clock
        self.conns: dict[_Conn, None] = {}  # insertion order = oldest first
        self.by_peer: dict[str, dict[_Conn, None]] = {}
        # a lower bound of the `since` of each client's connections: refusing a flooding client stays O(1)
        self._peer_since: dict[str, float] = {}
        self._by_handler: dict[Any, _Conn] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self._sweep_at = math.inf  # clock time the armed sweep is for (inf: none armed)
        self._swept_at = -math.inf  # clock time of the last sweep
        self._running = False
        self._refusals: dict[str, bytes] = {}  # the 503 for each reason, built once
        self._over_share: dict[str, str] = {}  # peer -> the reason it is refused over its share, built once
        self._refused_key = f"{name}.refused"
        self.accepted = self.refused = self.evicted = self.timed_out = self.dropped_slow = 0

    # ------------------------------------------------------------------------------------------ wiring

    def start(self) -> None:
        self._running = True
        self._schedule()

    def stop(self) -> None:
        self._running = False
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self._sweep_at = math.inf
        for conn in list(self.conns):
            self._close(conn)

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
            self._want(conn.since + self.request_timeout_s)

    def stats(self) -> dict[str, Any]:
        return {"open": len(self.conns), "max": self.max_connections, "per_client": self.per_client,
                "accepted": self.accepted, "refused": self.refused, "evicted": self.evicted,
                "timed_out": self.timed_out, "dropped_slow": self.dropped_slow}

    # ------------------------------------------------------------------------------------------ policy

    def admit(self, peer: str) -> _Conn | str:
        """A record for a new connection from `peer`, or the reason it is refused."""
        now = self.clock()
        mine = self.by_peer.get(peer)
        if mine is not None and len(mine) >= self.per_client:
            older_than = now - self.grace_s
            victim = None
            if self._peer_since.get(peer, now) <= older_than:
                victim = self._victim(peer, older_than)
                if victim is None:
                    self._peer_since[peer] = min(c.since for c in mine)
            if victim is None:
                why = self._over_share.get(peer)
                if why is None:
                    if len(self._over_share) > 256:
                        self._over_share.clear()
                    why = self._over_share[peer] = (f"{peer} holds {self.per_client} connections, one client's "
                                                    f"share of [agent] {self.setting} = {self.max_connections}")
                return self._refuse(why)
            self._evict(victim)
        elif len(self.conns) >= self.max_connections:
            crowded = max(self.by_peer, key=lambda k: len(self.by_peer[k]))
            victim = self._victim(crowded, now) or self._victim(None, now)
            if victim is None:
                return self._refuse(f"all {self.max_connections} connections are handling requests ([agent] "
                                    f"{self.setting})")
            self._evict(victim)
        self.accepted += 1
        conn = _Conn(peer, now)
        self.conns[conn] = None
        if peer not in self.by_peer:
            self.by_peer[peer] = {}
            self._peer_since[peer] = now
        self.by_peer[peer][conn] = None
        self._want(now + self.request_timeout_s)
        return conn

    def _victim(self, peer: str | None, older_than: float) -> _Conn | None:
        """The connection of `peer` (any peer if None) waiting on its client the longest, never-used ones first."""
        best, key = None, None
        for conn in self.conns if peer is None else self.by_peer.get(peer, ()):
            if conn.busy or conn.transport is None:
                continue
            if conn.since > older_than:
                continue
            k = (conn.requests > 0, conn.since)
            if key is None or k < key:
                best, key = conn, k
        return best

    def _refuse(self, why: str) -> str:
        self.refused += 1
        if not self.episodes.again(self._refused_key):
            self.episodes.hit(self._refused_key, f"{self.name}: refusing new connections with 503: {why}")
            self._want(self.clock() + self.episodes.quiet_s)  # its end is logged by a sweep
        return why

    def _evict(self, conn: _Conn) -> None:
        self.evicted += 1
        if self.episodes.hit(f"{self.name}.full", f"{self.name}: connection limit reached ([agent] {self.setting} = "
                             f"{self.max_connections}, {self.per_client} per client); closing the connections idle "
                             "the longest to make room"):
            self._want(self.clock() + self.episodes.quiet_s)  # its end is logged by a sweep
        self._close(conn)

    def bind_handler(self, conn: _Conn, transport: asyncio.BaseTransport, handler: Any) -> None:
        conn.transport = transport
        self._by_handler[handler] = conn

    def forget(self, conn: _Conn, handler: Any = None) -> None:
        if conn in self.conns:
            del self.conns[conn]
            mine = self.by_peer.get(conn.peer)
            if mine is not None:
                mine.pop(conn, None)
                if not mine:
                    del self.by_peer[conn.peer]
                    self._peer_since.pop(conn.peer, None)
        if handler is not None:
            self._by_handler.pop(handler, None)

    def _close(self, conn: _Conn) -> None:
        self.forget(conn)
        t = conn.transport
        if t is None:
            return
        # close() keeps the socket until its buffer is sent, i.e. forever for a client that does not read
        if isinstance(t, asyncio.WriteTransport) and t.get_write_buffer_size() > 0:
            t.abort()
        else:
            t.close()

    def _schedule(self) -> None:
        """The next sweep armed for the first deadline of the connections and episodes (none: no timer)."""
        t = self.request_timeout_s
        due = math.inf
        for conn in self.conns:
            if conn.stalled_since is not None:
                due = min(due, conn.stalled_since + t)
            if not conn.busy:
                due = min(due, conn.since + t)
        for ep in self.episodes.open.values():
            due = min(due, ep[1] + self.episodes.quiet_s)
        self._want(due)

    def _want(self, due: float) -> None:
        """A sweep by `due` (clock time), at most one a step (request_timeout_s / 4, 0.05-1 s): an idle listener
        never wakes the loop (it woke it every second), a connection is closed at most a step past its deadline,
        as when the sweep ran every step, and a flood's thousands of deadlines cost one sweep a step."""
        if not self._running or due == math.inf:
            return
        at = max(due + SWEEP_SLACK_S, self._swept_at + max(0.05, min(1.0, self.request_timeout_s / 4)))
        if self._sweeper is not None:
            if self._sweep_at <= at:
                return
            self._sweeper.cancel()
        self._sweep_at = at
        self._sweeper = asyncio.get_running_loop().call_later(max(0.0, at - self.clock()), self._sweep)

    def _sweep(self) -> None:
        """Close connections that have waited on their client longer than request_timeout_s: to send a request,
        or (busy or not) to read what was written to it."""
        now = self._swept_at = self.clock()
        self._sweeper, self._sweep_at = None, math.inf
        for conn in list(self.conns):
            if conn.transport is None:
                continue
            if conn.stalled_since is not None and now - conn.stalled_since > self.request_timeout_s:
                self.dropped_slow += 1
                self.episodes.hit(f"{self.name}.slow", f"{self.name}: dropping clients that read nothing of their "
                                  f"answer for {self.request_timeout_s:g} s ([agent] request_timeout_s)")
                self._close(conn)
            elif not conn.busy and now - conn.since > self.request_timeout_s:
                self.timed_out += 1
                self._close(conn)
        self.episodes.poll()
        self._schedule()

    def refusal(self, why: str) -> bytes:
        cached = self._refusals.get(why)
        if cached is not None:
            return cached
        if len(self._refusals) > 256:
            self._refusals.clear()
        msg = f"{self.name}: too many connections: {why}; try again"
        if self.json_refusal:
            body = json.dumps({"error": "too_many_connections", "message": msg}).encode()
            ctype = "application/json"
        else:
            body = (msg + "\n").encode()
            ctype = "text/plain; charset=utf-8"
        head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Retry-After: 1\r\nConnection: close\r\n\r\n").encode()
        self._refusals[why] = head + body
        return head + body


class GuardedProtocol(asyncio.Protocol):
    """Stands in front of aiohttp's protocol for one admitted connection, so the guard sees it come and go."""

    def __init__(self, guard: ConnectionGuard, factory: Callable[[], asyncio.Protocol], conn: _Conn):
        self.guard, self.factory, self.conn = guard, factory, conn
        self.inner: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.conn not in self.guard.conns:  # the listener stopped meanwhile
            transport.close()
            return
        self.inner = self.factory()
        self.guard.bind_handler(self.conn, transport, self.inner)
        if isinstance(transport, asyncio.WriteTransport):
            transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.conn.stalled_since is None:
            self.conn.stalled_since = self.guard.clock()
            self.guard._want(self.conn.stalled_since + self.guard.request_timeout_s)
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.conn.stalled_since = None  # the client reads: not a slow reader (yet)
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.forget(self.conn, self.inner)
        if self.inner is not None:
            self.inner.connection_lost(exc)


_CRED_SIZE = struct.calcsize("3i")  # struct ucred: pid, uid, gid


def _peer_key(conn: Any, addr: Any, unix: bool, names: dict[bytes, str] | None = None) -> str:
    """The client a connection counts against: the peer's process on the unix socket, its address on TCP.
    `names` memoises a process' key by its raw credentials (a flood is one process: no unpack or format each)."""
    if unix:
        try:
            cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED_SIZE)
        except OSError:
            return "unix peer"
        name = names.get(cred) if names is not None else None
        if name is None:
            pid, uid, _gid = struct.unpack("3i", cred)
            name = f"pid {pid} (uid {uid})"
            if names is not None:
                if len(names) > 256:
                    names.clear()
                names[cred] = name
        return name
    return str(addr[0]) if isinstance(addr, tuple) and addr else "?"


class GuardedSite(web.BaseSite):
    """An aiohttp site with its own accept loop: every connection is admitted by a ConnectionGuard first.

    Accepting here, not in asyncio's server, lets a refusal cost one accept, one send and one close, before any
    transport, task or HTTP parser exists: a client that re-opens thousands of connections a second cannot
    starve the event loop that answers status and runs the sampling clock.
    """

    def __init__(self, runner: web.BaseRunner, guard: ConnectionGuard, *, sock: socket.socket | None = None,
                 host: str | None = None, port: int | None = None, reuse_address: bool = True):
        super().__init__(runner)
        self.guard, self.host, self.port, self.reuse_address = guard, host, port, reuse_address
        self._socks: list[socket.socket] = [sock] if sock is not None else []
        self._unix = sock is not None
        self._tasks: set[asyncio.Task] = set()
        self._texts_second, self._texts_left = 0, REFUSAL_TEXTS_PER_S
        self._peer_names: dict[bytes, str] = {}  # raw SO_PEERCRED -> the peer's key (_peer_key)

    @property
    def name(self) -> str:
        if self._unix:
            return f"http://unix:{self._socks[0].getsockname()}:"
        return f"http://{self.host}:{self.port}"

    @property
    def sockets(self) -> list[socket.socket]:
        return list(self._socks)

    def _bind_tcp(self) -> None:
        infos = socket.getaddrinfo(self.host or None, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        seen = set()
        try:
            for family, type_, proto, _, addr in infos:
                if (family, addr) in seen:
                    continue
                seen.add((family, addr))
                s = socket.socket(family, type_, proto)
                self._socks.append(s)
                if self.reuse_address:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                s.bind(addr)
        except OSError:
            for s in self._socks:
                s.close()
            self._socks = []
            raise

    async def start(self) -> None:
        await super().start()  # registers with the runner, which stops it on cleanup
        if not self._unix:
            self._bind_tcp()
        loop = asyncio.get_running_loop()
        for s in self._socks:
            s.setblocking(False)
            s.listen(LISTEN_QUEUE)
            loop.add_reader(s.fileno(), self._accept, s)
        self.guard.start()

    def replace_socket(self, sock: socket.socket) -> None:
        """Accept on `sock` from now on, closing the old listener (a control socket re-created after its path was
        removed); connections already accepted go on."""
        loop = asyncio.get_running_loop()
        for s in self._socks:
            with contextlib.suppress(Exception):
                loop.remove_reader(s.fileno())
            s.close()
        self._socks = [sock]
        sock.setblocking(False)
        sock.listen(LISTEN_QUEUE)
        loop.add_reader(sock.fileno(), self._accept, sock)

    async def stop(self) -> None:
        loop = asyncio.get_running_loop()
        for s in self._socks:
            with contextlib.suppress(Exception):
                loop.remove_reader(s.fileno())
            s.close()
        for t in list(self._tasks):
            t.cancel()
        self.guard.stop()
        self._runner._unreg_site(self)

    def _accept(self, lsock: socket.socket) -> None:
        family = socket.AF_UNIX if self._unix else lsock.family
        guard, unix, names = self.guard, self._unix, self._peer_names
        for _ in range(ACCEPT_BACKLOG):
            try:
                # socket.accept() without its per-call enum look-ups: a flood makes this the hottest line; the
                # C socket object, not socket.socket: a refusal needs no Python-level wrapper (its __init__ and
                # close() were a third of a refusal's cost), an admitted connection gets one below
                fd, addr = lsock._accept()
                conn = _socket.socket(family, socket.SOCK_STREAM, 0, fd)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in RESOURCE_ERRNOS:  # out of descriptors: pause this listener, say so once
                    guard.episodes.hit(f"{guard.name}.accept", f"{guard.name}: accept() fails: {exc.strerror}; "
                                       "pausing it 0.5 s at a time")
                    loop = asyncio.get_running_loop()
                    loop.remove_reader(lsock.fileno())
                    loop.call_later(0.5, self._resume, lsock)
                    return
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                    continue  # the client gave up while queued
                guard.episodes.hit(f"{guard.name}.accept_error", f"{guard.name}: accept() fails: "
                                   f"{exc}")  # once per episode, never a traceback per connection
                return
            admitted = guard.admit(_peer_key(conn, addr, unix, names))
            if isinstance(admitted, str):  # refused: one send and a close, nothing else is made
                if self._may_write_refusal():
                    with contextlib.suppress(OSError):
                        conn.send(guard.refusal(admitted), socket.MSG_DONTWAIT)
                conn.close()
                continue
            self._admit(socket.socket(family, socket.SOCK_STREAM, 0, conn.detach()), admitted)

    def _admit(self, conn: socket.socket, record: _Conn) -> None:
        """Hand an admitted connection to asyncio and aiohttp (its transport is made in a task)."""
        loop = asyncio.get_running_loop()
        server = self._runner.server
        conn.setblocking(False)
        task = loop.create_task(loop.connect_accepted_socket(
            lambda r=record: GuardedProtocol(self.guard, server, r), sock=conn))
        self._tasks.add(task)
        task.add_done_callback(lambda t, r=record, c=conn: self._made(t, r, c))

    def _may_write_refusal(self) -> bool:
        """The 503 text for the first REFUSAL_TEXTS_PER_S refusals each second: a flood does not read them, and
        writing to a unix socket costs more than accepting and closing it."""
        second = int(time.monotonic())
        if second != self._texts_second:
            self._texts_second, self._texts_left = second, REFUSAL_TEXTS_PER_S
        self._texts_left -= 1
        return self._texts_left >= 0

    def _made(self, task: asyncio.Task, record: _Conn, conn: socket.socket) -> None:
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is not None:
            self.guard.forget(record)
            with contextlib.suppress(OSError):
                conn.close()

    def _resume(self, lsock: socket.socket) -> None:
        if lsock.fileno() >= 0 and lsock in self._socks:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().add_reader(lsock.fileno(), self._accept, lsock)


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

    caps + an accept burst per listener + what is open now + FD_RESERVE stays under the
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
    budget = soft - open_now - FD_RESERVE - ACCEPT_BURST * len(wanted)
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
