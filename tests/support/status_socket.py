"""A unix socket that answers GET /v1/status with a given status, as the agent's API does: what `lynxtop status`
prints for a status no running agent could be made to serve on cue (a full disk, a histogram's lowest bucket)."""

from __future__ import annotations

import http.server
import json
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lynxtop.__main__ import main


@contextmanager
def agent_socket(path: Path, status: dict[str, Any]) -> Iterator[None]:
    """GET /v1/status answered with `status` on the unix socket `path` (404 for any other path)."""
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


def status_text(sock_dir: Path, capsys: Any, status: dict[str, Any]) -> str:
    """What `lynxtop status` prints (exit 0 asserted) for `status` served on a socket in `sock_dir`."""
    path = sock_dir / "agent.sock"
    with agent_socket(path, status):
        assert main(["status", "--socket", str(path)]) == 0
    return capsys.readouterr().out
