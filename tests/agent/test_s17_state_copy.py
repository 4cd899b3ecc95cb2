"""The run's record (serving.json) is also kept beside the control socket, in the agent's runtime directory (a tmpfs
under systemd, kept across `systemctl restart`): a full state disk that refuses the record of a new run must not
leave that run unadopted by the next agent (it would serve unsupervised: `lynxtop stop` could not reach it).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest
from support.agent_config import sim_profile, write_agent_config
from support.agent_proc import Agent, reap_sims
from support.small_fs import fill, mounted

from lynxtop.agent.serving import launcher, procs
from lynxtop.agent.serving.statefiles import ServerState

TOKEN = "0123456789abcdef"


def _record(started_ms: int, ready_ms: int | None = None, run_id: int = 1) -> launcher.ServerRecord:
    return launcher.ServerRecord(run_id=run_id, profile="alpha", pid=os.getpid(), pgid=os.getpgid(0),
                                 start_ticks=1234, argv=["vllm", "serve", "m"], token=TOKEN, log_path="/tmp/r.log",
                                 started_ms=started_ms, ready_ms=ready_ms)


@pytest.fixture
def state(tmp_path) -> tuple[ServerState, list[tuple], Path]:
    """A ServerState on <tmp>/state/serving.json whose copy sits beside <tmp>/run/agent.sock; its events."""
    (tmp_path / "state").mkdir()
    (tmp_path / "run").mkdir()
    said: list[tuple] = []
    st = ServerState(tmp_path / "state" / "serving.json", lambda *a, **k: said.append(a),
                     socket=tmp_path / "run" / "agent.sock")
    return st, said, tmp_path


def test_save_writes_both_0640_and_remove_removes_both(state):
    st, said, tmp = state
    st.save(_record(1000))
    assert st.copy is not None and st.copy.parent == tmp / "run"
    for p in (st.path, st.copy):
        assert stat.S_IMODE(p.lstat().st_mode) == 0o640 and stat.S_ISREG(p.lstat().st_mode), p
        assert json.loads(p.read_text())["started_ms"] == 1000
    assert st.read() == (_record(1000), None)
    st.remove()
    assert not st.path.exists() and not st.copy.exists()
    assert st.read() == (None, None) and not said


def test_both_present_the_later_run_is_read(state):
    st, said, tmp = state
    launcher.write_record(st.path, _record(1000, ready_ms=2000, run_id=1))
    launcher.write_record(st.copy, _record(5000, run_id=2))  # the primary's rewrite failed (a full disk)
    rec, why = st.read()
    assert rec is not None and rec.run_id == 2
    assert why and str(st.copy) in why and "later run" in why
    # a tie: the one that knows the run got ready
    launcher.write_record(st.path, _record(5000, run_id=2))
    launcher.write_record(st.copy, _record(5000, ready_ms=9000, run_id=2))
    rec, why = st.read()
    assert rec is not None and rec.ready_ms == 9000 and why and str(st.copy) in why
    # the copy older: the primary, nothing to say
    launcher.write_record(st.copy, _record(1000, run_id=1))
    assert st.read() == (_record(5000, run_id=2), None)


def test_primary_garbage_and_a_good_copy_reads_the_copy(state):
    st, said, tmp = state
    st.save(_record(1000, ready_ms=1500))
    st.path.write_text('{"run_id": 1, "profile": "alpha", "pid"')  # cut short
    rec, why = st.read()
    assert rec == _record(1000, ready_ms=1500)
    assert why and "is not a valid server record" in why and str(st.copy) in why
    assert "nothing is adopted" not in why  # the copy is adopted: the primary's "ignored" words would mislead


def test_primary_missing_and_a_good_copy_reads_the_copy(state):
    st, said, tmp = state
    st.save(_record(1000))
    st.path.unlink()
    rec, why = st.read()
    assert rec == _record(1000) and why and str(st.path) in why and str(st.copy) in why


def test_a_symlinked_copy_is_ignored_and_never_written_through(state):
    st, said, tmp = state
    target = tmp / "elsewhere.json"
    target.write_text(_record(9000, run_id=7).to_json())
    st.copy.symlink_to(target)
    launcher.write_record(st.path, _record(1000))
    assert st.read() == (_record(1000), None)  # the link's later run is not followed
    st.save(_record(2000))
    assert json.loads(target.read_text())["run_id"] == 7  # the link was replaced, not written through
    assert not st.copy.is_symlink() and json.loads(st.copy.read_text())["started_ms"] == 2000


def test_an_unwritable_copy_keeps_the_primary_and_says_nothing_as_an_event(state, caplog):
    st, said, tmp = state
    os.rmdir(tmp / "run")  # the runtime directory is gone
    st.save(_record(1000))
    st.save(_record(1000, ready_ms=2000))
    assert st.read() == (_record(1000, ready_ms=2000), None) and not said
    assert sum("copy" in r.getMessage() for r in caplog.records) == 1  # one log line, not one per save


# -- a real agent on a full state disk -------------------------------------------------------------------------

HOG = ("import sys, time\nf = open(sys.argv[1], 'ab', buffering=0)\nwhile True:\n    try:\n"
       "        f.write(b'x' * 512)\n    except OSError:\n        time.sleep(0.002)\n")


@pytest.fixture
def small_fs(tmp_path):
    """A 20m tmpfs (support/small_fs.py)."""
    with mounted(tmp_path / "small", "20m") as mnt:
        yield mnt


@pytest.mark.timeout(150)
async def test_a_run_started_on_a_full_state_disk_is_adopted_from_the_copy_after_a_sigkill(tmp_path, small_fs):
    # no progress bar: on a disk full before the load began vLLM's (and the simulator's) re-raises ENOSPC
    prof = sim_profile("v4", startup_s=1, readiness_timeout_s=20,
                       sim_args=("--sim-log-interval", "1", "--no-use-tqdm-on-load"))
    cfg = write_agent_config(tmp_path / "config.toml", small_fs / "lynxtop.db", tmp_path / "run" / "agent.sock",
                             fake_nvml="sim", sample_interval_s=0.2, default_profile="v4", autostart=True,
                             backoff_initial_s=0.3, backoff_max_s=1, gpu_release_timeout_s=10, min_free_mb=0,
                             profiles=[prof])
    a = Agent(tmp_path, cfg)
    b = hog = None
    try:
        st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
        run1 = st["serving"]["run_id"]
        fill(small_fs)
        hog = subprocess.Popen(["python3", "-c", HOG, str(small_fs / "hog")])  # whatever filled the disk goes on
        code, body = await a.api("POST", "/v1/restart", {})
        assert code == 202, body
        st = await a.wait_state(lambda s: s["state"] == "ready" and s["run_id"] != run1, timeout=30,
                                what="the new run ready on a full disk")
        pid, run2 = st["serving"]["pid"], st["serving"]["run_id"]
        assert not (small_fs / "serving.json").exists()  # the primary could not be written
        a.stop(signal.SIGKILL)  # the agent dies with the disk still full
        assert procs.alive(pid)
        b = Agent(tmp_path, cfg, name="agent2")
        await b.wait_notify("READY=1")
        deadline = time.monotonic() + 20
        srv: dict = {}
        while time.monotonic() < deadline:
            srv = (await b.status())["serving"]
            if srv["pid"] == pid and srv["state"] == "ready":
                break
            await asyncio.sleep(0.3)
        assert srv["pid"] == pid and srv["state"] == "ready" and srv["run_id"] == run2, srv
        assert srv.get("adopted"), srv
        assert "read the run from its copy" in b.output()  # the agent.state_file event says where it came from
        code, body = await b.api("POST", "/v1/stop", {})  # `lynxtop stop` reaches it
        assert code == 202, body
        await b.wait_state(lambda s: s["state"] == "stopped", timeout=30, what="stopped")
        assert not procs.alive(pid)
        assert not list((tmp_path / "run").glob("*serving.json"))  # the copy is removed with the run
    finally:
        if hog is not None:
            hog.kill()
        for ag in (a, b):
            if ag is not None and ag.proc.poll() is None:
                ag.proc.kill()
                ag.proc.wait(5)
        reap_sims(tmp_path / "sim-state")


async def test_a_stale_copy_of_an_ended_run_leaves_its_row_as_it_ended(tmp_path):
    """An old copy (left by an agent version that kept one, then a downgrade and an upgrade) names a run that ended
    long ago: the adopting agent finds its process gone and must not close its row a second time, with a reason
    ("lost while the agent was down") that is not what happened."""
    from support.db import db_rows

    prof = sim_profile("v4", startup_s=1, readiness_timeout_s=20)
    db = tmp_path / "state" / "lynxtop.db"
    cfg = write_agent_config(tmp_path / "config.toml", db, tmp_path / "run" / "agent.sock", fake_nvml="sim",
                             sample_interval_s=0.2, default_profile="v4", autostart=True, backoff_initial_s=0.3,
                             backoff_max_s=1, gpu_release_timeout_s=10, profiles=[prof])
    a = Agent(tmp_path, cfg)
    b = None
    try:
        st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
        run1 = st["serving"]["run_id"]
        stale = (tmp_path / "state" / "serving.json").read_text()
        code, body = await a.api("POST", "/v1/stop", {})
        assert code == 202, body
        await a.wait_state(lambda s: s["state"] == "stopped", timeout=30, what="stopped")
        a.stop()
        (row,) = db_rows(db, "SELECT ended_ms, end_reason FROM runs WHERE id = ?", (run1,))
        assert row["ended_ms"] and "lost" not in (row["end_reason"] or "")
        copy = tmp_path / "run" / "agent.serving.json"
        assert not copy.exists()
        copy.write_text(stale)  # as a version without the copy would have left it: not removed with its run
        b = Agent(tmp_path, cfg, name="agent2")
        await b.wait_notify("READY=1")
        # serving an operator stopped stays stopped across the agent's restart (stopped.json, session 18)
        await b.wait_state(lambda s: s["state"] == "stopped" and "autostart of v4 held" in s["reason"], timeout=30,
                           what="the agent past its start")
        assert db_rows(db, "SELECT ended_ms, end_reason FROM runs WHERE id = ?", (run1,)) == [row]
        assert not copy.exists() or json.loads(copy.read_text())["run_id"] != run1  # gone, or the new run's
    finally:
        for ag in (a, b):
            if ag is not None and ag.proc.poll() is None:
                ag.proc.kill()
                ag.proc.wait(5)
        reap_sims(tmp_path / "sim-state")
