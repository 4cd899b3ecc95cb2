"""The blocking client (the CLI, and the dashboard's reads of another node from a worker thread) bounds a whole
answer: in time, since a peer that trickles a byte at a time within each read's timeout held it for ever, and in
size, since a peer that sends without end was read into memory whole."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest
from support.ports import short_dir

from lynxtop.contract import client as client_mod
from lynxtop.contract.client import AgentClient, AgentUnreachable

pytestmark = pytest.mark.timeout(30)


def _serve_once(path: str, answer) -> threading.Thread:
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)

    def run() -> None:
        conn, _ = srv.accept()
        with conn, srv:
            conn.recv(65536)  # the request
            answer(conn)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _trickle(conn: socket.socket) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    conn.sendall(head)
    with contextlib.suppress(OSError):
        for _ in range(1000):  # a byte every 0.1 s: each read is within the 0.5 s timeout
            conn.sendall(b" ")
            time.sleep(0.1)


def test_a_trickling_peer_times_out_as_a_whole():
    with short_dir() as d:
        path = str(d / "agent.sock")
        _serve_once(path, _trickle)
        t = time.monotonic()
        with pytest.raises(AgentUnreachable, match="did not answer within 0.5 s"):
            AgentClient(path, timeout_s=0.5).status_json()
        assert time.monotonic() - t < 3


def test_an_endless_answer_is_refused_not_read_whole(monkeypatch):
    monkeypatch.setattr(client_mod, "MAX_BODY", 100_000)

    def endless(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n")
        with contextlib.suppress(OSError):
            while True:
                conn.sendall(b"[" * 65536)

    with short_dir() as d:
        path = str(d / "agent.sock")
        _serve_once(path, endless)
        with pytest.raises(AgentUnreachable, match="more than 100000 bytes"):
            AgentClient(path, timeout_s=5).status_json()


def test_a_prompt_answer_is_read_as_before():
    def ok(conn: socket.socket) -> None:
        body = b'{"serving": {}, "agent": {}}'
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
                     + body)

    with short_dir() as d:
        path = str(d / "agent.sock")
        _serve_once(path, ok)
        assert AgentClient(path, timeout_s=2).status_json() == {"serving": {}, "agent": {}}
