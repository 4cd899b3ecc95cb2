"""`lynxtop demo` where its environment is not a laptop's terminal: no usable temp directory, no terminal, a
dashboard that crashes, a port taken between the demo's pick and the simulator's bind.

Each runs the real demo in a subprocess (a few through a `python -c` wrapper that changes one thing of the
environment, e.g. which port the demo picks) and, at the end, kills whatever of its tree is left by a marker
variable in its environment, so a failing assertion leaves nothing behind.
"""

from __future__ import annotations

import fcntl
import os
import pty
import shutil
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator

import pytest
from support.marked_procs import MARK, marked, marked_tree

from lynxtop.cli.demo import Demo
from lynxtop.contract.status import Status

pytestmark = pytest.mark.timeout(150)

MAIN = "from lynxtop.cli.__main__ import main\nsys.exit(main(sys.argv[1:]))\n"


@pytest.fixture
def mark() -> Iterator[str]:
    """A marker for the demo's environment; whatever of its tree is left at the end is killed."""
    with marked_tree() as value:
        yield value


def _env(mark: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LYNXTOP_SIM_")}
    return {**env, MARK: mark, **extra}


def _gone(mark: str, timeout: float = 20) -> list[int]:
    deadline = time.monotonic() + timeout
    while marked(mark) and time.monotonic() < deadline:
        time.sleep(0.3)
    return marked(mark)


# ------------------------------------------------------------------------------------------- no temp dir


def test_no_usable_temp_directory_is_a_clear_usage_error(tmp_path, mark):
    """tempfile's directory does not exist (TMPDIR removed after Python picked it, say): exit 2, one message that
    names the directory and says what to do, no traceback."""
    gone = tmp_path / "removed-tmp"
    code = f"import sys, tempfile\ntempfile.tempdir = {str(gone)!r}\n" + MAIN
    proc = subprocess.run([sys.executable, "-c", code, "demo", "--no-tui", "--duration", "5"], capture_output=True,
                          text=True, timeout=60, env=_env(mark))
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert str(gone) in proc.stderr and "--state-dir" in proc.stderr and "TMPDIR" in proc.stderr
    assert marked(mark) == []


def _can_unshare_mounts() -> bool:
    unshare, mount = shutil.which("unshare"), shutil.which("mount")
    if not unshare or not mount or os.geteuid() != 0:
        return False
    probe = subprocess.run([unshare, "-m", "sh", "-c", f"{mount} --bind /tmp /tmp && {mount} -o remount,bind,ro /tmp"],
                           capture_output=True, timeout=10)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_unshare_mounts(), reason="needs root and `unshare -m` to make /tmp read-only")
def test_read_only_tmp_and_var_tmp_is_a_clear_usage_error(mark):
    """/tmp and /var/tmp read-only (a mount namespace of this test only), TMPDIR pointing nowhere. Each is bound
    onto itself and made read-only, its content kept: a checkout under /tmp (CI's clone) stays importable."""
    mount = shutil.which("mount")
    code = ("import os, subprocess, sys\n"
            "for d in ('/tmp', '/var/tmp'):\n"
            f"    subprocess.run([{mount!r}, '--bind', d, d], check=True)\n"
            f"    subprocess.run([{mount!r}, '-o', 'remount,bind,ro', d], check=True)\n"
            "os.chdir('/tmp')\n" + MAIN)
    proc = subprocess.run([shutil.which("unshare") or "unshare", "-m", sys.executable, "-c", code, "demo", "--no-tui",
                           "--duration", "5"], capture_output=True, text=True, timeout=60,
                          env=_env(mark, TMPDIR="/nonexistent-lynxtop-tmp"))
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "/nonexistent-lynxtop-tmp" in proc.stderr and "/tmp" in proc.stderr
    assert "--state-dir" in proc.stderr and "TMPDIR" in proc.stderr


# ------------------------------------------------------------------------------------------- no terminal


def test_no_terminal_prints_plain_status_lines_instead_of_the_dashboard(sock_dir, mark):
    """`ssh host lynxtop demo` without -t: stdin, stdout and stderr are pipes. No dashboard escape codes: the
    status lines, marked SIMULATED, and a note saying why and how to get the dashboard. A LYNXTOP_SIM_* variable
    of the user's, passed on to the simulator, is named."""
    proc = subprocess.run([sys.executable, "-m", "lynxtop", "demo", "--duration", "9", "--startup-seconds", "0.5",
                           "--state-dir", str(sock_dir / "st")], stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=90, env=_env(mark, LYNXTOP_SIM_SEED="7"))
    out, err = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
    print(out, err[-3000:])
    assert proc.returncode == 0
    assert b"\x1b" not in proc.stdout + proc.stderr  # no dashboard drawn into a pipe
    assert len(proc.stderr) < 2000
    assert "no terminal" in out and "ssh -t" in out
    assert "LYNXTOP_SIM_SEED" in out
    lines = [ln for ln in out.splitlines() if "serving=" in ln]
    assert lines and all(ln.startswith("[SIMULATED]") for ln in lines)
    assert "serving=ready" in out
    assert _gone(mark) == []


def test_status_line_escapes_the_agents_text(tmp_path):
    """Plain lines carry the agent's text (a stop reason naming another process's command line): escaped."""
    line = Demo(tmp_path, startup_seconds=1, keep=True).status_line(Status.from_json({
        "serving": {"state": "stopped", "reason": "port 1 is already in use: pid 9 (evil \x1b[2J\x1b]0;t\x07)",
                    "profile": "p\x1b[31m"},
        "sla": {"state": "unknown"}}))
    assert "\x1b" not in line and "\x07" not in line
    assert "\\x1b[2J" in line and "already in use" in line


# ------------------------------------------------------------------------------------------- dashboard


def _run_in_pty(argv: list[str], env: dict[str, str], timeout: float) -> tuple[int, bytes]:
    """Run argv with a pseudo-terminal (100x30) as stdin, stdout and stderr; its exit status and all it wrote."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    out = bytearray()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            if not chunk:
                return
            out.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(5)
        os.close(master)
    return proc.returncode, bytes(out)


@pytest.mark.parametrize("crash", [False, True])
def test_the_dashboards_exit_status_is_the_demos(sock_dir, mark, crash):
    """A dashboard that crashes (here: on mount) ends the demo with status 1 and one line saying so, and the
    clean-up is still complete; one that ends normally (--duration) ends it with 0."""
    inject = ("import lynxtop.tui.app as app\n"
              "def boom(self):\n    raise RuntimeError('injected dashboard crash')\n"
              "app.LynxtopApp.on_mount = boom\n") if crash else ""
    code = "import sys\n" + inject + MAIN
    env = _env(mark, TERM="xterm-256color", COLUMNS="100", LINES="30")
    rc, out = _run_in_pty([sys.executable, "-c", code, "demo", "--duration", "8", "--startup-seconds", "0.5",
                           "--state-dir", str(sock_dir / "st")], env, timeout=90)
    text = out.decode(errors="replace")
    print(text[-3000:])
    if crash:
        assert rc == 1
        assert "lynxtop demo: the dashboard" in text
    else:
        assert rc == 0, text[-2000:]
    assert "stopped; database, config and logs kept" in text  # the clean-up ran to its end
    assert _gone(mark) == []


# ------------------------------------------------------------------------------------------- port


def test_a_port_taken_before_the_simulator_binds_is_retried_on_another(sock_dir, mark):
    """The demo picks a free port, and another process listens there before the simulated server starts (here:
    this test, from the start). The demo says so and moves to another port; serving still gets ready."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        code = ("import sys\nimport lynxtop.cli.demo as d\nreal = d.free_port\nports = [int(sys.argv.pop(1))]\n"
                "d.free_port = lambda: ports.pop() if ports else real()\n" + MAIN)
        proc = subprocess.run([sys.executable, "-c", code, str(port), "demo", "--no-tui", "--duration", "14",
                               "--startup-seconds", "0.5", "--state-dir", str(sock_dir / "st")], capture_output=True,
                              text=True, timeout=120, env=_env(mark))
    print(proc.stdout, proc.stderr[-3000:])
    assert proc.returncode == 0
    assert f"port {port}" in proc.stdout and "in use" in proc.stdout
    assert "serving=ready" in proc.stdout
    assert "Traceback" not in proc.stderr
    assert _gone(mark) == []


def test_no_terminal_demo_ends_when_its_output_goes_away(sock_dir, mark):
    """`ssh host lynxtop demo` without -t whose connection drops: no SIGHUP comes (no terminal), only a closed
    pipe. The demo must notice at its next status line and stop, not run on for nobody."""
    import selectors

    proc = subprocess.Popen([sys.executable, "-m", "lynxtop", "demo", "--startup-seconds", "0.5", "--state-dir",
                             str(sock_dir / "st")], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=_env(mark))
    try:
        seen = b""
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + 60
            while b"serving=ready" not in seen and time.monotonic() < deadline and proc.poll() is None:
                if sel.select(0.5):
                    seen += os.read(proc.stdout.fileno(), 65536)
        assert b"serving=ready" in seen, seen.decode(errors="replace")
        proc.stdout.close()
        assert proc.wait(timeout=60) == 0
        assert _gone(mark) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
