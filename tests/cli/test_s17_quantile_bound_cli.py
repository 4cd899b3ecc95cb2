"""`lynxtop status` shows a p99 in its histogram's lowest bucket as the bound it is (`<10 ms`), never the
interpolated figure (`9.9 ms`); a p99 in a higher bucket stays a figure.

The status is the one the agent serves for a page read through its real scrape path (support/latency_pages.py),
answered on a real unix socket and read by the real command.
"""

from __future__ import annotations

import http.server
import json
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from support.latency_pages import IDLE_FAST, QUEUEING, scraped_row, served_status

from lynxtop.__main__ import main


@contextmanager
def _agent_socket(path: Path, status: dict[str, Any]) -> Iterator[None]:
    """GET /v1/status answered with `status` on a unix socket, as the agent's API answers it."""
    body = json.dumps(status).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            ok = self.path.split("?")[0] == "/v1/status"
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body) if ok else 2))
            self.end_headers()
            self.wfile.write(body if ok else b"{}")

        def log_message(self, *args: Any) -> None:
            pass

        def address_string(self) -> str:
            return "unix"

    server = socketserver.UnixStreamServer(str(path), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def _status_text(sock_dir: Path, capsys: Any, status: dict[str, Any]) -> str:
    path = sock_dir / "agent.sock"
    with _agent_socket(path, status):
        assert main(["status", "--socket", str(path)]) == 0
    return capsys.readouterr().out


def _sla_line(out: str) -> str:
    return next(ln for ln in out.splitlines() if ln.startswith("SLA "))


def test_status_shows_p99s_in_the_lowest_bucket_as_bounds(sock_dir, capsys):
    line = _sla_line(_status_text(sock_dir, capsys, served_status(scraped_row(IDLE_FAST))))
    assert "p99 TTFT <1 ms (<= 2.00 s)" in line and "p99 TPOT <10 ms (<= 150 ms)" in line, line
    assert "SLA      OK" in line


def test_status_shows_p99s_above_the_lowest_bucket_as_figures(sock_dir, capsys):
    line = _sla_line(_status_text(sock_dir, capsys, served_status(scraped_row(QUEUEING))))
    assert "p99 TTFT 748 ms (<= 2.00 s)" in line and "p99 TPOT 50 ms (<= 150 ms)" in line, line
