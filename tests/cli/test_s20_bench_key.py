"""Session 20: `lynxtop bench` takes the model's API key from VLLM_API_KEY or OPENAI_API_KEY (vLLM's own bench reads
OPENAI_API_KEY), not only from `--api-key` on the command line every local user reads; `--api-key` still wins.
A 401 or 403 from the model is its own clear message, exit 1 (3 means "no server / agent unreachable"), naming
where the key came from and never the key.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

KEY = "sk-s20-0123456789abcdef"
OTHER = "sk-s20-other-key-9876543210"


class _Model(http.server.BaseHTTPRequestHandler):
    """A served model that wants `Bearer KEY` on every request (vLLM's --api-key), and answers as vLLM does."""

    seen: list[str | None] = []

    def _answer(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        auth = self.headers.get("Authorization")
        _Model.seen.append(auth)
        if auth != f"Bearer {KEY}":
            self._answer(401, {"error": "Unauthorized"})
        elif self.path == "/v1/models":
            self._answer(200, {"object": "list", "data": [{"id": "m", "root": "/models/m"}]})
        else:
            self._answer(404, {"error": "not found"})


@pytest.fixture
def url() -> Iterator[str]:
    _Model.seen = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Model)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def _bench(tmp_path: Path, url: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "empty.toml").write_text("")
    return subprocess.run([sys.executable, "-m", "lynxtop", "bench", "--url", url, "--model", "nope",
                           "--concurrency", "1", "--requests", "1", "--warmup", "0", "--no-store", *args],
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "LYNXTOP_CONFIG": str(tmp_path / "empty.toml"), **env})


@pytest.mark.parametrize("var", ["VLLM_API_KEY", "OPENAI_API_KEY"])
def test_the_key_comes_from_the_environment(tmp_path, url, var):
    r = _bench(tmp_path, url, {var: KEY})
    # the key opened /v1/models: the model asked for ('nope') is not among those served, a usage error
    assert _Model.seen == [f"Bearer {KEY}"], r.stderr
    assert r.returncode == 2 and "model 'nope' is not served" in r.stderr, r.stderr


def test_vllm_api_key_before_openai_api_key_and_the_option_before_both(tmp_path, url):
    r = _bench(tmp_path, url, {"VLLM_API_KEY": KEY, "OPENAI_API_KEY": OTHER})
    assert _Model.seen == [f"Bearer {KEY}"] and r.returncode == 2, r.stderr
    _Model.seen = []
    r = _bench(tmp_path, url, {"VLLM_API_KEY": OTHER, "OPENAI_API_KEY": OTHER}, "--api-key", KEY)
    assert _Model.seen == [f"Bearer {KEY}"] and r.returncode == 2, r.stderr


@pytest.mark.parametrize(("env", "args", "source"), [
    ({}, (), "no API key was given"),
    ({"OPENAI_API_KEY": OTHER}, (), "OPENAI_API_KEY"),
    ({}, ("--api-key", OTHER), "--api-key"),
])
def test_a_refused_key_is_a_clear_message_and_exit_1(tmp_path, url, env, args, source):
    r = _bench(tmp_path, url, env, *args)
    assert r.returncode == 1, f"exit {r.returncode}: {r.stderr}"
    assert "401" in r.stderr and source in r.stderr and "VLLM_API_KEY" in r.stderr, r.stderr
    assert OTHER not in r.stdout + r.stderr
    assert "Traceback" not in r.stderr


def test_a_bad_key_in_the_environment_is_named_by_its_variable(tmp_path, url):
    r = _bench(tmp_path, url, {"VLLM_API_KEY": "s\u00e9cret"})
    assert r.returncode == 2 and "VLLM_API_KEY must be printable ASCII" in r.stderr, r.stderr
    assert _Model.seen == [] and "cret" not in r.stderr


def test_the_help_says_where_the_key_comes_from():
    r = subprocess.run([sys.executable, "-m", "lynxtop", "bench", "--help"], capture_output=True, text=True,
                       timeout=60)
    text = " ".join(r.stdout.split())
    assert "VLLM_API_KEY" in text and "OPENAI_API_KEY" in text and "401" in text
