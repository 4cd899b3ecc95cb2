"""FakeAgent.stop() leaves no client waiting: every connection it had is closed, in flight or idle.

aiohttp's graceful shutdown (runner.cleanup) misses a connection accepted in the moment the listener closes: its
`connection_made` runs after the idle connections were swept, and the loop stops with it open and unread. A
dashboard request on it then waits for its 3 s read timeout, so a test asserting "agent lost" right after
`stop()` sees a slow failure or a late answer (session 23). The agent going away must look like a killed agent:
every connection ends at once.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from tui_fake_agent import FakeAgent

READ_TIMEOUT_S = 3.0  # the dashboard's read timeout (DASHBOARD_TIMEOUT_S): a client left open waits this long
ITERATIONS = 60
WAIT_S = 60.0  # generous condition deadlines: the CI machine is slow and loaded
REQUEST = b"GET /v1/status HTTP/1.1\r\nHost: agent\r\nConnection: keep-alive\r\n\r\n"


def _read_answer(sock: socket.socket) -> bool:
    """Read one HTTP answer; False when the server closed the connection first (EOF or reset)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return False
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return False
        body += chunk
    return True


class Hammer(threading.Thread):
    """Requests in a loop, a few per keep-alive connection, until the socket is gone: some are in flight at stop().

    `hung` records every read that got neither an answer nor a close within READ_TIMEOUT_S."""

    def __init__(self, path: Path):
        super().__init__(daemon=True)
        self.path = path
        self.hung: list[float] = []
        self.answers = 0

    def run(self) -> None:
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(READ_TIMEOUT_S)
            try:
                try:
                    sock.connect(str(self.path))
                except OSError:  # socket file gone or refused: the agent is away, this client is done
                    return
                for _ in range(3):
                    started = time.monotonic()
                    try:
                        sock.sendall(REQUEST)
                        if not _read_answer(sock):
                            break
                    except TimeoutError:
                        self.hung.append(time.monotonic() - started)
                        break
                    except OSError:  # reset or broken pipe: closed by the server, as wanted
                        break
                    self.answers += 1
            finally:
                sock.close()


def _idle_keepalive(path: Path) -> socket.socket:
    """A connection that got one answer and stays open, idle, as the dashboard's pooled connection does."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(READ_TIMEOUT_S)
    sock.connect(str(path))
    sock.sendall(REQUEST)
    assert _read_answer(sock), "the fake agent did not answer the first request"
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    """True when the server closed it (EOF or reset) within READ_TIMEOUT_S; False when it is left open."""
    try:
        return sock.recv(65536) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_stop_closes_every_connection_in_flight_or_idle(sock_dir: Path) -> None:
    path = sock_dir / "agent.sock"
    hung: list[str] = []
    slowest_after_stop = 0.0
    for i in range(ITERATIONS):
        agent = FakeAgent(path).start()
        idle = _idle_keepalive(path)
        hammers = [Hammer(path) for _ in range(3)]
        for h in hammers:
            h.start()
        deadline = time.monotonic() + WAIT_S
        while sum(h.answers for h in hammers) < 3 * (1 + i % 4) and time.monotonic() < deadline:
            time.sleep(0.001)  # stop at varying points of the traffic
        agent.stop()
        stopped = time.monotonic()
        try:
            if not _closed_by_server(idle):
                hung.append(f"iteration {i}: an idle keep-alive connection was left open after stop()")
        finally:
            idle.close()
        for h in hammers:
            h.join(WAIT_S)
            assert not h.is_alive(), f"iteration {i}: a client still runs {WAIT_S:g} s after stop()"
            hung += [f"iteration {i}: a request waited {s:.1f} s, unanswered and not closed" for s in h.hung]
        slowest_after_stop = max(slowest_after_stop, time.monotonic() - stopped)
        assert not path.exists(), "stop() must remove the socket file"
    assert not hung, f"{len(hung)} client(s) left waiting by FakeAgent.stop():\n" + "\n".join(hung)
    # no client waited anywhere near its read timeout: each saw its connection end (or refused) at once
    assert slowest_after_stop < READ_TIMEOUT_S, f"clients finished {slowest_after_stop:.1f} s after stop()"
