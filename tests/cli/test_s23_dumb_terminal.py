"""`lynxtop dashboard` on a terminal that cannot draw it: TERM=dumb (Emacs' shell, some CI runners) or TERM unset.

A real `lynxtop` process with a real pseudo-terminal on stdin and stderr (what the dashboard checks), stdout a pipe:
it must say in one line what is wrong and what to use instead, exit 2 and draw nothing. The same terminal with a
TERM that can draw still gets the dashboard (q quits it), so the check refuses no real terminal."""

from __future__ import annotations

import contextlib
import os
import pty
import secrets
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.marked_procs import MARK, marked


def _env(**extra: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TERM", "LYNXTOP_ASCII")}
    env["LANG"] = "C.UTF-8"
    for key, value in extra.items():
        if value is not None:
            env[key] = value
    return env


def _read_until(fd: int, proc: subprocess.Popen[bytes], want: bytes | None, timeout_s: float) -> bytes:
    """What the pty's other end shows until `want` appears (None: until the process ends) or the deadline."""
    got = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # every process holding the terminal ended (EIO)
                chunk = b""
            got += chunk
            if want is not None and want in got:
                return got
            if not chunk and proc.poll() is not None:
                return got
        elif want is None and proc.poll() is not None:
            return got
    return got


def _dashboard(sock_dir: Path, term: str | None) -> tuple[subprocess.Popen[bytes], int]:
    """`lynxtop dashboard` with a pty as stdin and stderr (its controlling terminal), stdout a pipe."""
    main, tty = pty.openpty()
    os.set_blocking(main, False)
    proc = subprocess.Popen([sys.executable, "-m", "lynxtop", "--socket", str(sock_dir / "none.sock"),
                             "--database", str(sock_dir / "none.db"), "dashboard"],
                            stdin=tty, stderr=tty, stdout=subprocess.PIPE, env=_env(TERM=term),
                            start_new_session=True)
    os.close(tty)
    return proc, main


@pytest.mark.parametrize("term", ["dumb", None, "unknown"], ids=["dumb", "unset", "unknown"])
def test_dumb_or_unset_term_is_refused_in_one_line(sock_dir, term):
    proc, fd = _dashboard(sock_dir, term)
    try:
        shown = _read_until(fd, proc, None, 60)
        assert proc.poll() is not None, f"the dashboard started on TERM={term}: {shown[-400:]!r}"
        assert proc.returncode == 2
        text = shown.decode(errors="replace")
        assert b"\x1b" not in shown, shown[:400]  # nothing drawn: no escape code at all
        lines = [ln for ln in text.splitlines() if ln.strip()]
        assert len(lines) == 1, lines
        assert ("TERM=dumb" if term == "dumb" else "TERM is not set" if term is None else "TERM=unknown") in text
        assert "lynxtop status" in text and "TERM=xterm-256color" in text, text
        assert proc.stdout is not None and proc.stdout.read() == b""
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        os.close(fd)


def test_a_terminal_that_can_draw_still_gets_the_dashboard(sock_dir):
    """The control: TERM=xterm-256color on the same pty draws the full screen (the alternate screen's escape code)
    and stays until q."""
    proc, fd = _dashboard(sock_dir, "xterm-256color")
    try:
        shown = _read_until(fd, proc, b"\x1b[?1049h", 60)
        assert b"\x1b[?1049h" in shown and proc.poll() is None, shown[-400:]
        # the first frame (the agent is unreachable here): keys are read once the app runs
        shown += _read_until(fd, proc, b"unreachable", 60)
        os.write(fd, b"q")
        _read_until(fd, proc, None, 30)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(fd)


def test_term_problem_names_the_cause():
    from lynxtop.cli.dashboard_cmd import term_problem

    assert term_problem({}) == "TERM is not set"
    assert term_problem({"TERM": " "}) == "TERM is not set"
    assert term_problem({"TERM": "dumb"}) == "TERM=dumb"
    assert term_problem({"TERM": "xterm-256color"}) is None
    assert term_problem({"TERM": "linux"}) is None and term_problem({"TERM": "vt100"}) is None


def test_demo_on_a_dumb_terminal_prints_status_lines_instead(sock_dir):
    """`lynxtop demo` in a terminal with TERM=dumb: the node runs, the dashboard does not (its escape codes would be
    garbage there): the status lines, a note naming TERM=dumb and how to get the dashboard, exit 0, nothing left."""
    mark = secrets.token_hex(8)
    main, tty = pty.openpty()
    os.set_blocking(main, False)
    env = {**_env(TERM="dumb"), MARK: mark}
    env = {k: v for k, v in env.items() if not k.startswith("LYNXTOP_SIM_")}
    proc = subprocess.Popen([sys.executable, "-m", "lynxtop", "demo", "--duration", "9", "--startup-seconds", "0.5",
                             "--state-dir", str(sock_dir / "st")], stdin=tty, stderr=tty, stdout=tty, env=env,
                            start_new_session=True)
    os.close(tty)
    try:
        shown = _read_until(main, proc, None, 120)
        assert proc.poll() is not None, shown[-400:]
        text = shown.decode(errors="replace")
        assert proc.returncode == 0, text[-2000:]
        assert b"\x1b" not in shown, shown[-400:]
        assert "TERM=dumb" in text and "TERM=xterm-256color" in text, text
        assert "serving=ready" in text and "[SIMULATED]" in text, text
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        os.close(main)
        deadline = time.monotonic() + 20
        while marked(mark) and time.monotonic() < deadline:
            time.sleep(0.3)
        left = marked(mark)
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    assert left == []
