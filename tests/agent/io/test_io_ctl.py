"""`lynxtop status|start|stop|restart|switch` against the real API server (fake controller): output, exit codes."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import replace

import pytest
from agent_io_helpers import FakeController, ThreadedApi
from support.ports import short_dir

from lynxtop.__main__ import main
from lynxtop.cli import ctl
from lynxtop.contract.status import ServingMetrics


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def agent():
    with short_dir() as d:
        fake = FakeController()
        with ThreadedApi(fake, d / "agent.sock") as server:
            yield fake, str(d / "agent.sock"), server


@pytest.fixture(autouse=True)
def _no_tty(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    monkeypatch.setattr(ctl, "POLL_S", 0.05)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_status_human_and_json(agent, capsys):
    fake, path, _ = agent
    code, out, _ = run(capsys, "status", "--socket", path)
    assert code == 0
    assert out.splitlines()[0].startswith("*** SIMULATED")
    assert "serving  READY for 1h00m" in out
    assert "profile tp8" in out and "run 7" in out and "vLLM 0.31.0" in out
    assert "SLA      OK  p99 TTFT 412 ms (<= 2.00 s)  p99 TPOT 38 ms (<= 150 ms)" in out
    assert sum(line.startswith("GPU ") for line in out.splitlines()) == 8
    assert "mem 130.0 GiB/141.0 GiB" in out and "612 W" in out
    assert "host     cpu 12%" in out and "missed ticks 3" in out
    code, out, _ = run(capsys, "status", "--json", "--socket", path)
    assert code == 0
    data = json.loads(out)
    assert data["serving"]["run_id"] == 7 and len(data["gpus"]) == 8


def test_status_shows_missing_values_as_na_and_states(agent, capsys):
    fake, path, _ = agent
    fake.serving.update(state="backoff", reason="exited with status 0 (not asked)", run_id=None,
                        next_retry_ms=int(time.time() * 1000) + 20_000, failures_in_window=2)
    fake.simulated = False
    code, out, _ = run(capsys, "status", "--socket", path)
    assert code == 0 and "SIMULATED" not in out
    assert "BACKOFF" in out and "exited with status 0 (not asked)" in out and "2 failures in the window" in out
    assert "run -" in out
    assert "traffic" in out  # the fake still has scrape results
    fake.serving["state"] = "stopped"
    original = fake.status
    fake.status = lambda: replace(original(), serving_metrics=ServingMetrics.from_json(
        {"scrape_ok": None, "requests_per_s": None}))
    code, out, _ = run(capsys, "status", "--socket", path)
    assert code == 0 and "STOPPED" in out and "traffic" not in out  # no line of N/As when nothing serves


def test_actions_and_exit_codes(agent, capsys):
    fake, path, _ = agent
    code, out, _ = run(capsys, "restart", "--yes", "--socket", path)
    assert code == 0 and "restart accepted" in out
    code, _, err = run(capsys, "start", "--socket", path)  # already running: the ask met, exit 0 with a note (s23)
    assert code == 0 and "already running: nothing to do" in err
    code, _, err = run(capsys, "switch", "nope", "--yes", "--socket", path)
    assert code == 2 and "unknown_profile" in err and "tp8-fp8kv" in err
    fake.busy = "restart"
    code, _, err = run(capsys, "stop", "--yes", "--socket", path)
    assert code == 4 and "busy" in err
    fake.busy = None
    fake.preflight_fail = ["executable /opt/v/bin/vllm not found"]
    code, _, err = run(capsys, "switch", "tp8-fp8kv", "--yes", "--socket", path)
    assert code == 1 and "preflight_failed" in err and "- executable /opt/v/bin/vllm not found" in err
    assert [c[0] for c in fake.calls] == ["restart"]


@pytest.mark.parametrize("argv", [["stop"], ["restart"], ["switch", "tp8-fp8kv"]])
def test_interrupting_actions_need_yes_without_a_tty(agent, capsys, argv):
    fake, path, _ = agent
    code, _, err = run(capsys, *argv, "--socket", path)
    assert code == 2 and "--yes" in err
    assert fake.calls == []


def test_stop_of_a_stopped_server_needs_no_confirmation(agent, capsys):
    fake, path, _ = agent
    fake.serving["state"] = "crash-loop"
    code, _, _ = run(capsys, "stop", "--socket", path)
    assert code == 0 and [c[0] for c in fake.calls] == ["stop"]


def test_tty_confirmation(agent, capsys, monkeypatch):
    fake, path, _ = agent
    monkeypatch.setattr(sys, "stdin", _Tty("tp8\n"))  # the wrong profile name
    code, out, err = run(capsys, "switch", "tp8-fp8kv", "--socket", path)
    assert code == 1 and "not confirmed" in err and "model reloads" in out and fake.calls == []
    monkeypatch.setattr(sys, "stdin", _Tty("tp8-fp8kv\n"))
    code, _, _ = run(capsys, "switch", "tp8-fp8kv", "--socket", path)
    assert code == 0 and fake.calls[-1][:2] == ("switch", "tp8-fp8kv")
    monkeypatch.setattr(sys, "stdin", _Tty("y\n"))
    code, out, _ = run(capsys, "stop", "--socket", path)
    assert code == 0 and "Now: ready" in out and fake.calls[-1][0] == "stop"


def test_wait_follows_phases_until_the_new_run_is_ready(agent, capsys):
    fake, path, _ = agent
    fake.script["restart"] = [
        (0.05, {"action": {"action": "restart", "profile": "tp8", "since_ms": 0, "by": "uid 0"},
                "state": "stopping"}),
        (0.15, {"state": "starting", "phase": "loading weights", "run_id": 8}),
        (0.30, {"phase": "cuda graphs"}),
        (0.45, {"state": "ready", "phase": "api up", "action": None}),
    ]
    t0 = time.monotonic()
    code, out, _ = run(capsys, "restart", "--yes", "--wait", "--socket", path)
    assert code == 0 and out.rstrip().endswith("ready")
    assert time.monotonic() - t0 >= 0.4  # it did not take the old run's "ready" for done
    assert "starting (loading weights)" in out and "stopping" in out


def test_wait_reports_a_failed_start(agent, capsys):
    fake, path, _ = agent
    fake.serving.update(state="stopped", run_id=7)
    fake.script["start"] = [
        (0.05, {"state": "starting", "phase": "loading weights", "run_id": 8}),
        (0.20, {"state": "crash-loop", "reason": "CUDA out of memory", "phase": None}),
    ]
    code, _, err = run(capsys, "start", "--wait", "--socket", path)
    assert code == 1 and "crash-loop" in err and "CUDA out of memory" in err


def test_wait_for_stop(agent, capsys):
    fake, path, _ = agent
    fake.script["stop"] = [(0.05, {"state": "stopping"}), (0.2, {"state": "stopped", "run_id": None})]
    code, out, _ = run(capsys, "stop", "--yes", "--wait", "--socket", path)
    assert code == 0 and out.rstrip().endswith("stopped")


def test_unreachable_agent_exits_3(capsys):
    with short_dir() as d:
        code, _, err = run(capsys, "status", "--socket", str(d / "absent.sock"))
        assert code == 3 and "no agent socket" in err
        dead = socket.socket(socket.AF_UNIX)  # a socket file left by a dead agent
        dead.bind(str(d / "dead.sock"))
        dead.close()
        code, _, err = run(capsys, "stop", "--yes", "--socket", str(d / "dead.sock"))
        assert code == 3 and "nothing answers" in err


def test_socket_from_config_and_bad_config(agent, capsys, tmp_path):
    fake, path, _ = agent
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[agent]\nsocket = "{path}"\n')
    code, out, _ = run(capsys, "status", "--config", str(cfg))
    assert code == 0 and "READY" in out
    cfg.write_text("[agent]\nsocket = 5\n")
    code, _, err = run(capsys, "status", "--config", str(cfg))
    assert code == 2 and "agent.socket" in err


def test_console_script_in_a_real_process(agent):
    fake, path, _ = agent
    env = {k: v for k, v in os.environ.items() if k != "LYNXTOP_CONFIG"}
    exe = [sys.executable, "-m", "lynxtop"]
    p = subprocess.run([*exe, "stop", "--socket", path], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=60, env=env)
    assert p.returncode == 2 and "--yes" in p.stderr and "Traceback" not in p.stderr
    p = subprocess.run([*exe, "status", "--json", "--socket", path], capture_output=True, text=True, timeout=60,
                       env=env)
    assert p.returncode == 0 and json.loads(p.stdout)["agent"]["simulated"] is True
    assert fake.calls == []
