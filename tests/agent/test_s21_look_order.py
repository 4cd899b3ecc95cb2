"""Two looks at a run's processes that overlap: the newer one's answer stands (session 21).

The loading watch's look runs beside the /health probe now, in a worker thread, while readiness and the node
sampler look too. A look begun earlier that finished later wrote its older members over the newer look's, so the
record could list processes the newer look had already found gone (or miss one it had found). Real processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

from lynxtop.agent.serving import launcher


class StalledTable:
    """A process table (the node sampler's) whose look answers with what /proc showed when it began, late."""

    def __init__(self, seen: dict[int, int], release: threading.Event):
        self.seen, self.release = seen, release
        self.began = threading.Event()  # the look's start time is taken: a fixed sleep was not always enough

    def members(self, token, pgid, roots, start_ticks, known, seen):  # ProcTable.members' signature
        snapshot = dict(self.seen)
        self.began.set()
        self.release.wait(30)
        seen.update(snapshot)
        return sorted(snapshot)


def test_an_older_look_finishing_last_does_not_overwrite_the_newer_one(tmp_path):
    proc = launcher.spawn([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "run.log", {}, "p")
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ticks = launcher.procs.stat(stray.pid).start_ticks
        release = threading.Event()
        old = StalledTable({proc.pid: proc.record.start_ticks, stray.pid: ticks}, release)
        t = threading.Thread(target=proc.members, args=(old,))
        t.start()
        # the old look has begun (a thread started late on a loaded machine began after the newer look, and
        # rightly won): it counted a process the newer look does not
        assert old.began.wait(30), "the older look never began"
        fresh = proc.members()  # a newer look from /proc itself
        assert stray.pid not in fresh
        release.set()
        t.join(30)
        assert proc.members_changed()
        assert [p for p, _ in proc.record.members] == sorted(fresh), proc.record.members
    finally:
        stray.kill()
        stray.wait()
        os.killpg(proc.pid, signal.SIGKILL)
