"""Once a run's leader has exited (a crash) and its process group is empty, the leader's pid (the run's pgid) may
be reused by an unrelated process that leads a group of its own (setsid: a new service, a login). The crash
clean-up's stop must not take that group for the run's: it selected processes by the pgid alone and SIGKILLed
the stranger. Pid reuse is forced through /proc/sys/kernel/ns_last_pid (root, as CI runs)."""

from __future__ import annotations

import asyncio
import os
import subprocess

import pytest

from lynxtop.agent.serving import launcher

pytestmark = pytest.mark.timeout(30)


def _spawn_with_pid(pid: int) -> subprocess.Popen | None:
    """An unrelated `sleep` in a session of its own, given `pid` (forced through ns_last_pid), or None."""
    for _ in range(20):
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(pid - 1))
        except OSError:
            return None
        p = subprocess.Popen(["sleep", "30"], start_new_session=True)
        if p.pid == pid:
            return p
        p.kill()
        p.wait()
    return None


async def test_crash_cleanup_never_signals_a_process_that_reused_the_runs_pgid(tmp_path):
    proc = launcher.spawn(["/bin/sh", "-c", "exit 3"], tmp_path / "run.log", {}, "p", run_id=1)
    proc.watch()
    await asyncio.wait_for(proc.wait(), 10)  # the leader crashed; nothing of the run is left
    await asyncio.sleep(0.05)  # a pid comes round again ticks later, never within the 10 ms tick /proc counts in
    stranger = _spawn_with_pid(proc.pid)
    if stranger is None:
        pytest.skip("cannot force pid reuse here (ns_last_pid)")
    try:
        assert os.getpgid(stranger.pid) == proc.record.pgid  # what a wrapped pid counter gives, one day
        res = await proc.stop(0.5, kill_wait_s=1.0)  # what Failures.crashed -> stop_and_release does
        assert stranger.poll() is None, f"an unrelated process was killed by the crash clean-up: {res}"
        # its number is the run's leader's (pids lists that), but it was never taken for one of the run's processes
        assert stranger.pid not in res.survivors and all(o.pid != stranger.pid for o in res.orphans)
    finally:
        stranger.kill()
        stranger.wait()
