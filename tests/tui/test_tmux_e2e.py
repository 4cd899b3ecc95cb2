"""The real `lynxtop` command in a real terminal (tmux) against a running agent with the simulated vLLM.

`lynxtop demo --no-tui` provides the agent, the simulator and traffic; the dashboard is started by the
console script in tmux, driven with send-keys and read with capture-pane, exactly as an operator would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.captures import demo_node as captured_demo_node
from support.real import unavailable

from lynxtop.agent.serving import procs

TMUX = "/usr/bin/tmux"
pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture(autouse=True)
def _tmux_present() -> None:
    """A real terminal is this file's point: without tmux it skips here and fails in CI (support/real.py)."""
    if not os.path.exists(TMUX):
        unavailable(f"{TMUX} not installed (apt-get install -y tmux)")


def _tmux(server: str, *args: str) -> str:
    return subprocess.run([TMUX, "-L", server, *args], capture_output=True, text=True, timeout=10).stdout


def _screen(server: str) -> str:
    return _tmux(server, "capture-pane", "-p", "-t", "dash")


def _wait_screen(server: str, needle: str, timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    text = ""
    while time.monotonic() < deadline:
        text = _screen(server)
        if needle in text:
            return text
        time.sleep(0.3)
    raise AssertionError(f"{needle!r} not on screen within {timeout_s} s; screen was:\n{text}")


def _proc_state(pid: int) -> str | None:
    """The process's state letter (Z: exited, waiting to be reaped), or None once it is gone."""
    s = procs.stat(pid)
    return s.state if s is not None else None


def _wait_gone(server: str, needle: str, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if needle not in _screen(server):
            return
        time.sleep(0.3)
    raise AssertionError(f"{needle!r} still on screen after {timeout_s} s")


@pytest.fixture(scope="module")
def demo_node():
    with captured_demo_node(duration_s=110) as state:  # the walk-through's simulated node (support/captures.py)
        yield state


def test_lynxtop_in_tmux_against_simulated_node(demo_node):
    server = f"lt-e2e-{os.getpid()}"
    lynxtop = str(Path(sys.executable).parent / "lynxtop")
    cmd = [lynxtop, "--socket", str(demo_node / "agent.sock"), "--database", str(demo_node / "lynxtop.db"), "--utc"]
    env = {**os.environ, "TERM": "xterm-256color"}
    subprocess.run([TMUX, "-L", server, "new-session", "-d", "-s", "dash", "-x", "100", "-y", "30", *cmd],
                   check=True, timeout=10, env=env)
    try:
        pane_pid = int(_tmux(server, "display-message", "-p", "-t", "dash", "#{pane_pid}").strip())
        screen = _wait_screen(server, "READY", timeout_s=40)
        assert "SIMULATED" in screen
        assert "SM act" in screen and "util*" in screen and "Serving" in screen
        # restart is offered with its consequences, Cancel first, and Escape leaves everything as it was
        _tmux(server, "send-keys", "-t", "dash", "R")
        screen = _wait_screen(server, "Restart serving?")
        assert "loads again" in screen and "Cancel" in screen
        _tmux(server, "send-keys", "-t", "dash", "Escape")
        _wait_gone(server, "Restart serving?")  # a lone Escape is only known once no sequence follows
        # history from the database
        _tmux(server, "send-keys", "-t", "dash", "4")
        screen = _wait_screen(server, "range (t)")
        assert "deepseek-v4.1-tp8" in screen
        # events from the agent's run
        _tmux(server, "send-keys", "-t", "dash", "5")
        _wait_screen(server, "serving.ready", timeout_s=20)
        _tmux(server, "send-keys", "-t", "dash", "1")
        _wait_screen(server, "util*")
        # the terminal goes away (SSH drop): the dashboard exits instead of lingering
        _tmux(server, "kill-server")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _proc_state(pane_pid) not in (None, "Z"):
            time.sleep(0.2)
        assert _proc_state(pane_pid) in (None, "Z"), "lynxtop kept running after its terminal closed"
    finally:
        subprocess.run([TMUX, "-L", server, "kill-server"], capture_output=True, timeout=10)


def test_q_quits_cleanly(demo_node):
    server = f"lt-e2e-q-{os.getpid()}"
    lynxtop = str(Path(sys.executable).parent / "lynxtop")
    cmd = [lynxtop, "--socket", str(demo_node / "agent.sock"), "--database", str(demo_node / "lynxtop.db")]
    subprocess.run([TMUX, "-L", server, "new-session", "-d", "-s", "dash", "-x", "80", "-y", "24", *cmd],
                   check=True, timeout=10)
    try:
        subprocess.run([TMUX, "-L", server, "set-option", "-t", "dash", "remain-on-exit", "on"], timeout=10)
        _wait_screen(server, "util*", timeout_s=40)
        pid = int(_tmux(server, "display-message", "-p", "-t", "dash", "#{pane_pid}").strip())
        tmux_pid = int(_tmux(server, "display-message", "-p", "#{pid}").strip())
        _tmux(server, "send-keys", "-t", "dash", "q")
        # tmux marks the pane dead at the pty's EOF and learns the exit status when it reaps the process on
        # SIGCHLD. Debian's tmux 3.3a is built with libutempter, whose record removal at that EOF swaps in its
        # own SIGCHLD handler for a moment: a child that exits then is never reaped (tmux/tmux#311, #4559; seen
        # here as a zombie and a dead pane without status). Re-sending SIGCHLD is tmux's own advice.
        t0 = time.monotonic()
        deadline = t0 + 30
        status: list[str] = []
        while time.monotonic() < deadline:
            status = _tmux(server, "display-message", "-p", "-t", "dash",
                           "#{pane_dead} #{pane_dead_status} #{pane_dead_signal}").split()
            if status[:1] == ["1"] and len(status) > 1:
                break
            if _proc_state(pid) == "Z":
                os.kill(tmux_pid, signal.SIGCHLD)
            time.sleep(0.2)
        assert status == ["1", "0"], (status, f"process {pid} state: {_proc_state(pid)}",
                                      f"{time.monotonic() - t0:.1f} s after q")
    finally:
        subprocess.run([TMUX, "-L", server, "kill-server"], capture_output=True, timeout=10)
