"""Session 25: `lynxtop status` and `lynxtop stop` with a server the agent holds (left serving by the previous agent,
not supervised: `serving.held`). The status names it on a line of its own; a stop of it ends a live load, so it is
confirmed as a stop of a running server is (a terminal's y, else --yes), where a stop of nothing asks nothing.

Against the real API server on a real unix socket (a fake controller behind it), as the other CLI tests.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "agent" / "io"))
from agent_io_helpers import FakeController, ThreadedApi  # noqa: E402
from support.cli import Tty, run_cli  # noqa: E402
from support.ports import short_dir  # noqa: E402

from lynxtop.cli import ctl  # noqa: E402

HELD = {"run_id": 12, "profile": "dsv41", "pid": 4242}


@pytest.fixture
def agent(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # no terminal unless a test gives one
    monkeypatch.setattr(ctl, "POLL_S", 0.05)
    with short_dir() as d:
        fake = FakeController()
        fake.simulated = False
        # as the agent answers with a held server: stopped, no run of its own, the held one named
        fake.serving.update(state="stopped", run_id=None, pid=None, profile=None, phase=None, ready_ms=None,
                            reason="agent started; run 12 (profile dsv41, pid 4242) left by the previous agent was "
                                   "not adopted and is not supervised (serving.not_adopted): `lynxtop stop` ends it",
                            held=dict(HELD))
        with ThreadedApi(fake, d / "agent.sock"):
            yield fake, str(d / "agent.sock")


def test_status_prints_a_line_for_the_held_server(agent, capsys):
    fake, path = agent
    code, out, _ = run_cli(capsys, "status", "--socket", path)
    assert code == 0
    lines = [line for line in out.splitlines() if line.startswith("held ")]
    assert lines == ["held     run 12 (profile dsv41, pid 4242) left by the previous agent, serving unsupervised: "
                     "`lynxtop stop` ends it"], out
    assert out.index("serving  STOPPED") < out.index("held     run 12")  # right under the state it qualifies


def test_status_prints_no_held_line_without_one(agent, capsys):
    fake, path = agent
    fake.serving["held"] = None
    code, out, _ = run_cli(capsys, "status", "--socket", path)
    assert code == 0 and "STOPPED" in out and "held " not in out


def test_status_of_a_held_server_with_unknown_numbers_says_so(agent, capsys):
    fake, path = agent
    fake.serving["held"] = {"run_id": None, "profile": "", "pid": None}
    code, out, _ = run_cli(capsys, "status", "--socket", path)
    assert code == 0
    assert "held     run ? (profile ?, pid ?) left by the previous agent" in out, out


def test_stop_of_a_held_server_needs_yes_without_a_terminal(agent, capsys):
    fake, path = agent
    code, _, err = run_cli(capsys, "stop", "--socket", path)
    assert code == 2 and "--yes" in err, err
    assert fake.calls == []  # nothing sent: the held server keeps serving
    code, out, _ = run_cli(capsys, "stop", "--yes", "--socket", path)
    assert code == 0 and [c[0] for c in fake.calls] == ["stop"], out


def test_stop_of_a_held_server_on_a_terminal_says_what_it_ends_and_asks(agent, capsys, monkeypatch):
    fake, path = agent
    monkeypatch.setattr(sys, "stdin", Tty("n\n"))
    code, out, err = run_cli(capsys, "stop", "--socket", path)
    assert code == 1 and "not confirmed" in err and fake.calls == []
    assert "run 12" in out and "pid 4242" in out and "dsv41" in out, out
    assert "previous agent" in out and "not supervised" in out, out
    assert "load again" in out, out  # what is lost: its load
    monkeypatch.setattr(sys, "stdin", Tty("y\n"))
    code, out, _ = run_cli(capsys, "stop", "--socket", path)
    assert code == 0 and [c[0] for c in fake.calls] == ["stop"], out


def test_stop_with_nothing_held_still_asks_nothing(agent, capsys):
    fake, path = agent
    fake.serving["held"] = None
    code, _, _ = run_cli(capsys, "stop", "--socket", path)
    assert code == 0 and [c[0] for c in fake.calls] == ["stop"]
