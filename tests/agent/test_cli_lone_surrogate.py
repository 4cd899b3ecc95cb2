"""A served string holding a lone surrogate (a foreign process title decoded with surrogateescape in a port-in-use
reason, or an older agent's unchecked reason) is shown escaped by `lynxtop status`: it crashed with a
UnicodeEncodeError traceback, since terminal_safe() escaped control characters but not surrogates."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "io"))
from agent_io_helpers import FakeController, ThreadedApi  # noqa: E402
from support.ports import short_dir  # noqa: E402

from lynxtop.contract.terminal import terminal_safe  # noqa: E402


@pytest.mark.parametrize("reason, locale_errors", [
    ("stopped by uid 0 (root) pid 1: maint \ud800", None),  # from a POST body: crashes in any locale
    ("port 8000 is already in use: 0.0.0.0:8000 held by pid 77 (caf\udce9-server)", "utf-8:strict"),  # en_US.UTF-8
], ids=["api_reason", "foreign_title"])
def test_status_survives_a_lone_surrogate_in_a_served_string(reason, locale_errors):
    with short_dir() as d:
        fake = FakeController()
        fake.serving.update(state="backoff", reason=reason)
        with ThreadedApi(fake, d / "agent.sock"):
            env = {k: v for k, v in os.environ.items() if k != "LYNXTOP_CONFIG"}
            if locale_errors:
                env["PYTHONIOENCODING"] = locale_errors
            p = subprocess.run([sys.executable, "-m", "lynxtop", "status", "--socket", str(d / "agent.sock")],
                               capture_output=True, timeout=60, env=env)
    err = p.stderr.decode(errors="replace")
    assert "Traceback" not in err, err[-800:]
    assert p.returncode == 0


def test_terminal_safe_output_is_always_encodable():
    terminal_safe("a\ud800b").encode("utf-8")
