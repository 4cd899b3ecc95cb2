"""Who belongs to a run, read from /proc: the token only counts for processes started since the run's leader."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from support.waits import wait_for

from lynxtop.agent.serving import procs


def _sleeper(token: str) -> subprocess.Popen:
    env = dict(os.environ, **{procs.RUN_TOKEN_ENV: token})
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env, start_new_session=True)


def test_a_token_is_looked_for_only_in_processes_started_since_the_leader():
    token = f"test-{os.getpid()}-{time.monotonic_ns()}"
    early = _sleeper(token)  # escaped the group (own session) and carries the token
    try:
        # the child has exec'd with its environment (the token): until then /proc shows the parent's
        wait_for(lambda: early.pid in procs.run_processes(token, None, ()), 10, what="the sleeper's token seen")
        early_ticks = procs.stat(early.pid).start_ticks
        assert early.pid in procs.run_processes(token, None, (), since_ticks=early_ticks)
        assert early.pid in procs.run_processes(token, None, ())  # no start given: everything is looked at
        # a leader that started after it: a process older than its run cannot carry the run's token
        assert early.pid not in procs.run_processes(token, None, (), since_ticks=early_ticks + 1)
    finally:
        early.kill()
        early.wait()
