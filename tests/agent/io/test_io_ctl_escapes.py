"""Issue 25.3: what the agent serves (vLLM's version, the model, reasons, NVML's words) reaches the terminal of
`lynxtop status|start|stop|switch` escaped, never as control sequences. The real API server, a fake controller."""

from __future__ import annotations

import io
import re
import sys
from dataclasses import replace

import pytest
from agent_io_helpers import FakeController, ThreadedApi
from support.cli import Tty, run_cli
from support.ports import short_dir

from lynxtop.cli import ctl

# clears the screen, retitles the window, a C1 CSI, a bidi override, and a line that forges a status line
EVIL = "\x1b[2J\x1b]0;owned\x07\x9b31m\u202e\nserving  READY"
CONTROLS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def assert_shown_escaped(text: str, times: int) -> None:
    """No control character but the line break; the hostile string shown escaped, `times` times."""
    assert not CONTROLS.search(text), repr(text)
    assert text.count("\\x1b[2J\\x1b]0;owned\\x07\\x9b31m\\u202e\\nserving  READY") == times, text


@pytest.fixture
def agent():
    with short_dir() as d:
        fake = FakeController()
        with ThreadedApi(fake, d / "agent.sock"):
            yield fake, str(d / "agent.sock")


@pytest.fixture(autouse=True)
def _no_tty(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    monkeypatch.setattr(ctl, "POLL_S", 0.05)


def test_status_shows_served_strings_escaped(agent, capsys):
    fake, path = agent
    fake.serving.update(state="degraded", vllm_version="0.99" + EVIL, model="m" + EVIL, reason="r" + EVIL)
    original = fake.status

    def hostile():
        st = original()
        nvml = replace(st.agent.nvml, message="nvml" + EVIL)
        return replace(st, agent=replace(st.agent, nvml=nvml), gpus=[replace(st.gpus[0], name="H200" + EVIL)])

    fake.status = hostile
    code, out, _ = run_cli(capsys, "status", "--socket", path)
    assert code == 0
    assert "vLLM 0.99\\x1b[2J" in out and "model m\\x1b[2J" in out
    assert_shown_escaped(out, 5)
    assert sum(line.startswith("serving  ") for line in out.splitlines()) == 1  # no forged line
    code, out, _ = run_cli(capsys, "status", "--json", "--socket", path)
    assert code == 0 and not CONTROLS.search(out)


def test_refusals_and_wait_show_served_strings_escaped(agent, capsys, monkeypatch):
    fake, path = agent
    fake.preflight_fail = ["reason" + EVIL]
    code, _, err = run_cli(capsys, "switch", "tp8-fp8kv", "--yes", "--socket", path)
    assert code == 1 and "preflight_failed" in err
    assert_shown_escaped(err, 1)
    fake.preflight_fail = None
    fake.serving.update(state="stopped", run_id=7, profile="tp8")
    fake.script["start"] = [(0.05, {"state": "starting", "phase": "load" + EVIL, "run_id": 8}),
                            (0.20, {"state": "crash-loop", "reason": "oom" + EVIL, "phase": None})]
    code, out, err = run_cli(capsys, "start", "--wait", "--socket", path)
    assert code == 1 and "crash-loop" in err
    assert_shown_escaped(out, 1)  # the progress line: starting (phase)
    assert_shown_escaped(err, 1)
    fake.serving.update(state="ready", reason="", profile="tp8" + EVIL)
    monkeypatch.setattr(sys, "stdin", Tty("y\n"))  # the confirmation quotes the served profile
    code, out, _ = run_cli(capsys, "stop", "--socket", path)
    assert code == 0 and "Now: ready" in out
    assert_shown_escaped(out, 2)  # the confirmation, and the `agent: ..., profile P` line once it acted
