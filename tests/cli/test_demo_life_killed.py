"""`lynxtop demo` SIGKILLed (or OOM-killed): what it started must end with it, and its temp directory go.

Each test runs the real `python -m lynxtop demo --no-tui` (agent + simulated vLLM with its EngineCore and 8
workers), kills the demo process with SIGKILL once serving is ready, and checks that within a deadline no process
of its tree remains: every one of them inherits a marker variable the test puts in the demo's environment, so
nothing escapes the check (the agent's own session, an orphaned EngineCore, a clean-up helper).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.marked_procs import MARK, marked

from lynxtop.cli.demo import DEMO_PREFIX

pytestmark = pytest.mark.timeout(180)


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:90]
    except OSError:
        return "?"


def _read_until(proc: subprocess.Popen, text: bytes, timeout: float = 60) -> bytes:
    seen = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while text not in seen and time.monotonic() < deadline and proc.poll() is None:
            if sel.select(0.5):
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                seen += chunk
    return seen


@pytest.mark.parametrize("how", ["pid-temp-dir", "group-state-dir"])
def test_a_sigkilled_demo_leaves_no_process_and_no_temp_dir(sock_dir, how):
    """`pid-temp-dir`: SIGKILL to the demo alone (the OOM killer's way), default temp state dir, which must go.
    `group-state-dir`: SIGKILL to the demo's whole process group (`kill -9 -PGID`), --state-dir, which is kept."""
    mark = secrets.token_hex(8)
    tmpdir = sock_dir / "tmp"
    tmpdir.mkdir()
    keep = how == "group-state-dir"
    state = ["--state-dir", str(sock_dir / "kept")] if keep else []
    env = {**os.environ, MARK: mark, "TMPDIR": str(tmpdir)}
    proc = subprocess.Popen([sys.executable, "-m", "lynxtop", "demo", "--no-tui", "--startup-seconds", "0.5", *state],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        seen = _read_until(proc, b"serving=ready")
        assert b"serving=ready" in seen, seen.decode(errors="replace")
        root = sock_dir / "kept" if keep else next(tmpdir.glob(f"{DEMO_PREFIX}*"))
        assert (root / "config.toml").exists()
        assert len(marked(mark)) >= 10  # the demo, the agent, the simulated server, its EngineCore and 8 workers
        if keep:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
        proc.wait()
        deadline = time.monotonic() + 45
        while (marked(mark) or (root.exists() and not keep)) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = marked(mark)
        assert left == [], f"{len(left)} processes of the SIGKILLed demo still run: " + \
            "; ".join(_cmd(p) for p in left[:5])
        if keep:
            assert (root / "config.toml").exists() and (root / "agent.log").exists()  # --state-dir is kept
        else:
            assert not root.exists(), f"the demo's temp directory {root} stayed"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in marked(mark):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_the_watcher_cleans_up_only_when_the_demo_died_without_saying_done(tmp_path):
    """In process, nothing running: EOF after the job removes the temp state dir and says so; "done" (the demo
    cleaned up itself) leaves everything as it is and says nothing."""
    import io
    import json

    from lynxtop.cli.demo import watch

    def run_watch(root: Path, *lines: dict) -> str:
        read, write = os.pipe()
        os.write(write, b"".join(json.dumps(x).encode() + b"\n" for x in lines))
        os.close(write)
        err = io.StringIO()
        # the watcher ignores SIGINT and SIGHUP (its own process's business); in this process that outlived the
        # test, and every child pytest started after it inherited SIGINT ignored (a later Ctrl-C test hung)
        kept = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGHUP)}
        try:
            assert watch(read, err=err) == 0
        finally:
            for sig, handler in kept.items():
                signal.signal(sig, handler)
        return err.getvalue()

    job = {"token": secrets.token_hex(16), "keep": False, "demo": 1}
    finished = tmp_path / "finished"
    finished.mkdir()
    assert run_watch(finished, {**job, "root": str(finished)}, {"done": True}) == ""
    assert finished.exists()
    killed = tmp_path / "killed"
    killed.mkdir()
    said = run_watch(killed, {**job, "root": str(killed)}, {"agent": 2**22 + 7})
    assert not killed.exists()
    assert "ended without stopping its SIMULATED node" in said and "found nothing of it running" in said
    assert f"removed {killed}" in said
    assert run_watch(tmp_path) == ""  # the demo died before it started anything
