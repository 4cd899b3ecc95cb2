"""The dashboard in a real terminal: `lynxtop demo --no-tui` for the node, the `lynxtop` console script in tmux,
driven with send-keys and read with capture-pane. Used by tests/tui/test_tmux_walk.py, and run as a script it
prints docs/dashboard.md's text captures, so those are what the dashboard really draws, not typed by hand:

    .venv/bin/python tests/support/captures.py 80x24 > /tmp/captures.md
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

TMUX = "/usr/bin/tmux"
BIN = Path(sys.executable).parent


@contextmanager
def demo_node(duration_s: int = 300) -> Iterator[Path]:
    """A simulated node (agent, simulated vLLM, traffic) for duration_s; yields its state directory."""
    root = Path(tempfile.mkdtemp(prefix="lt-walk-", dir="/tmp"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "lynxtop", "demo", "--no-tui", "--state-dir", str(root / "state"),
         "--startup-seconds", "1", "--duration", str(duration_s)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    sock = root / "state" / "agent.sock"
    try:
        deadline = time.monotonic() + 40
        while not sock.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        if not sock.exists():
            raise RuntimeError(f"the demo agent did not create {sock} (exit code {proc.poll()})")
        yield root / "state"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the demo stops serving, the agent and its children
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Terminal:
    """One tmux server running the dashboard in its only pane."""

    server: str

    def tmux(self, *args: str) -> str:
        return subprocess.run([TMUX, "-L", self.server, *args], capture_output=True, text=True, timeout=10).stdout

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "dash", *keys)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "dash")

    def wait(self, check: Callable[[str], bool] | str, what: str = "", timeout_s: float = 20) -> str:
        """The screen once check(screen) holds (or the string is on it), polled until a deadline."""
        test = (lambda s: check in s) if isinstance(check, str) else check
        deadline = time.monotonic() + timeout_s
        text = ""
        while time.monotonic() < deadline:
            text = self.screen()
            if test(text):
                return text
            time.sleep(0.2)
        pane = self.tmux("display-message", "-p", "-t", "dash", "dead=#{pane_dead} status=#{pane_dead_status}")
        raise AssertionError(f"{what or repr(check)} not on screen within {timeout_s} s ({pane.strip() or 'no pane'});"
                             f" screen was:\n{text}")


@contextmanager
def dashboard(state: Path, width: int, height: int, name: str = "walk") -> Iterator[Terminal]:
    """`lynxtop` at width x height against the demo's agent and database, in UTC (captures stay comparable)."""
    term = Terminal(f"lt-{name}-{os.getpid()}-{width}x{height}")
    cmd = [str(BIN / "lynxtop"), "--socket", str(state / "agent.sock"), "--database", str(state / "lynxtop.db"),
           "--utc"]
    env = {**os.environ, "TERM": "xterm-256color"}
    subprocess.run([TMUX, "-L", term.server, "new-session", "-d", "-s", "dash", "-x", str(width), "-y", str(height),
                    *cmd], check=True, timeout=10, env=env)
    term.tmux("set-option", "-t", "dash", "remain-on-exit", "on")  # a dashboard that dies leaves its last words
    try:
        yield term
    finally:
        subprocess.run([TMUX, "-L", term.server, "kill-server"], capture_output=True, timeout=10)


# Each screen: its name, the key that opens it and a text that says it is drawn (its title or its own columns).
SCREENS: list[tuple[str, str, str]] = [
    ("Node", "1", "util* = NVML"),
    ("GPU", "2", "(simulated)"),
    ("Latency", "3", "TTFT p99"),
    ("History", "4", "range (t)"),
    ("Events & logs", "5", "kind (K)"),
    ("Logs", "6", "vLLM log of run"),
    ("Processes", "7", "processes on"),
]


def main(argv: list[str]) -> int:
    sizes = [tuple(int(n) for n in a.split("x")) for a in argv] or [(80, 24)]
    with demo_node() as state:
        for width, height in sizes:
            with dashboard(state, width, height, "capture") as term:
                term.wait("READY", timeout_s=60)
                for title, key, marker in SCREENS:
                    term.keys(key)
                    term.wait(marker)
                    time.sleep(2)  # a capture, not a test: let the charts and the log fill a few ticks
                    print(f"### {title} (`{key}`), {width}x{height}\n\n```\n{term.screen().rstrip()}\n```\n")
                term.keys(":")
                term.wait("Search for commands")
                term.keys("-l", "view")
                time.sleep(1)
                print(f"### Command palette (`:` or ctrl+p), {width}x{height}\n\n```\n{term.screen().rstrip()}\n```\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
