"""Adoption of a server started through exec wrappers (a pyenv shim, `env`, a shell script that execs).

Each exec shows the process with a new command line, and for the instant of the exec its /proc environ and
cmdline read empty: the agent must not take that instant for "another process" (CI did, once, and killed the
run it should have adopted).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from support.waits import wait_for

from lynxtop.agent.serving import launcher, procs

HOPS = 6  # wrappers before the real program; each adds words in front of the argv


def _wrappers(tmp_path: Path) -> Path:
    """hop0 .. hop5: `#!/usr/bin/env bash` scripts, each exec'ing the next with two words of its own in front of the
    arguments (as pyenv's `pyenv exec python3` does), the last one the real interpreter."""
    last = tmp_path / f"hop{HOPS - 1}"
    last.write_text(f'#!/usr/bin/env bash\nshift 2\nexec {sys.executable} "$@"\n')
    for i in range(HOPS - 2, -1, -1):
        nxt = tmp_path / f"hop{i + 1}"
        (tmp_path / f"hop{i}").write_text(f'#!/usr/bin/env bash\nshift 2\nexec "{nxt}" exec extra "$@"\n')
    for i in range(HOPS):
        (tmp_path / f"hop{i}").chmod(0o755)
    return tmp_path / "hop0"


def test_a_server_mid_exec_chain_is_adoptable_at_every_instant(tmp_path):
    first = _wrappers(tmp_path)
    script = tmp_path / "server.py"
    script.write_text("import time\ntime.sleep(30)\n")
    argv = [str(first), "exec", "extra", str(script), "serve", "m"]
    results: dict[str | None, int] = {}
    for _ in range(5):  # five starts: the instants of the execs are hit in most of them
        proc = launcher.spawn(argv, tmp_path / "server.log", {}, "alpha")
        try:
            deadline, reached = time.monotonic() + 10, 0.0
            while time.monotonic() < deadline:
                why = launcher.check_adoptable(proc.record)
                results[why] = results.get(why, 0) + 1
                args = procs.cmdline(proc.pid) or []
                if args == [sys.executable, str(script), "serve", "m"]:
                    reached = reached or time.monotonic()
                    if time.monotonic() - reached > 0.1:
                        break
            assert reached, "the wrapper chain never reached the real program"
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.popen.wait()
    assert set(results) == {None}, results


def test_an_empty_read_is_looked_at_again_and_a_real_mismatch_is_still_refused(tmp_path, monkeypatch):
    script = tmp_path / "server.py"
    script.write_text("import time\ntime.sleep(30)\n")
    proc = launcher.spawn([sys.executable, str(script)], tmp_path / "server.log", {}, "alpha")
    try:
        wait_for(lambda: procs.environ_has(proc.pid, procs.RUN_TOKEN_ENV, proc.record.token), 10, what="exec'd")
        real_cmdline, real_environ = procs.cmdline, procs.environ_has
        empty = {"n": 3}

        def cmdline(pid):
            return [] if empty["n"] > 0 else real_cmdline(pid)

        def environ_has(pid, key, value):
            if empty["n"] > 0:
                empty["n"] -= 1
                return False
            return real_environ(pid, key, value)

        monkeypatch.setattr(procs, "cmdline", cmdline)
        monkeypatch.setattr(procs, "environ_has", environ_has)
        assert launcher.check_adoptable(proc.record) is None  # three empty reads, then the process as it is
        assert empty["n"] == 0
        # a process that is not the run's (neither its argv nor its token): refused after the settle time
        other = launcher.ServerRecord(**{**proc.record.__dict__, "argv": ["/bin/other"], "token": "not-the-token"})
        monkeypatch.setattr(procs, "cmdline", real_cmdline)
        monkeypatch.setattr(procs, "environ_has", real_environ)
        sleeps: list[float] = []
        monkeypatch.setattr(launcher.time, "sleep", sleeps.append)
        assert launcher.check_adoptable(other) == f"pid {proc.pid} runs a different command line"
        assert sleeps == [0.005] * 19  # 20 looks 5 ms apart: 100 ms at most, once, at the agent's start
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.popen.wait()
