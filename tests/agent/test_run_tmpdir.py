"""Each run's own TMPDIR, outside the agent unit's private /tmp (agent/serving/runtmp.py).

Under systemd the unit has PrivateTmp=yes: its /tmp is removed when the unit stops, while vLLM (KillMode=process)
keeps serving and keeps its ZMQ sockets and rendezvous file there. So every run the agent starts gets
TMPDIR=<database dir>/run-tmp/<id>, which outlives the agent and is removed by whichever agent sees the run end.

Real processes throughout: agents as `python -m lynxtop agent` with the simulated vLLM, the supervisor with the
stand-in server (whose engine child survives a SIGKILL of the server, as vLLM's EngineCore does). The state
directory is a short one under /tmp: the run's TMPDIR must leave room for unix-socket paths under it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from support.agent_config import agent_toml, sim_profile, write_agent_config
from support.agent_proc import Agent, sim_processes

from lynxtop.agent.serving import procs

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def short_dir():
    """A state directory short enough for the run's TMPDIR (pytest's tmp_path is too long for it)."""
    d = Path(tempfile.mkdtemp(prefix="lx", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def short_config(tmp_path: Path, short_dir: Path, h, **keys) -> Path:
    """One stand-in profile `alpha` (8 GPUs), its database (so serving.json, logs, run-tmp) in `short_dir`."""
    path = tmp_path / "config.toml"
    path.write_text(agent_toml(short_dir / "lynxtop.db", tmp_path / "run" / "agent.sock", backoff_initial_s=0.2,
                               backoff_max_s=1, crash_loop_failures=3, crash_loop_window_s=60,
                               gpu_release_timeout_s=5, profiles=h.standin_profile("alpha", tp=8, **keys)))
    return path


def events(store, h, kind: str) -> list[dict]:
    store.flush()
    rows = h.db_rows(store.path, "SELECT * FROM events WHERE kind = ? ORDER BY id", (kind,))
    for r in rows:
        r["details"] = json.loads(r["details"]) if r["details"] else {}
    return rows


def own_dir(path: str | Path) -> None:
    """A real directory (no symlink), mode 0700, owned by this user."""
    st = os.lstat(path)
    assert stat.S_ISDIR(st.st_mode), path
    assert stat.S_IMODE(st.st_mode) == 0o700, oct(st.st_mode)
    assert st.st_uid == os.geteuid()


async def start_ready(sup, h, profile: str = "alpha") -> None:
    await sup.start(profile, by="test")
    await h.wait_for(lambda: sup.state == "ready" and sup.action is None, 15, what="ready")


async def test_a_run_gets_its_own_tmpdir_that_outlives_the_agent_and_the_adopting_agent_removes_it(
        tmp_path, short_dir, cleanup):
    cfg = write_agent_config(tmp_path / "config.toml", short_dir / "lynxtop.db", tmp_path / "run" / "agent.sock",
                             fake_nvml="sim", sample_interval_s=0.2, default_profile="v4", autostart=True,
                             gpu_release_timeout_s=10,
                             profiles=[sim_profile("v4", startup_s=0.3, stop_grace_s=5)])
    a = Agent(tmp_path, cfg, "a1")
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    pid = st["serving"]["pid"]
    root = short_dir / "run-tmp"
    tmp = procs.environ_value(pid, "TMPDIR")
    assert tmp is not None and Path(tmp).parent == root, tmp
    members = sim_processes(tmp_path / "sim-state")
    assert len(members) >= 2  # the API server and its engine(s): all of them use the run's TMPDIR
    # the retitled EngineCore and workers show no environment (setproctitle); the others show the run's TMPDIR
    retitled = {p for p in members if procs.title(p).startswith("VLLM::")}
    assert retitled and all(not (procs.environ_raw(p) or b"").strip(b"\0") for p in retitled)
    assert {procs.environ_value(p, "TMPDIR") for p in set(members) - retitled} == {tmp}
    own_dir(root)
    own_dir(tmp)
    assert json.loads((short_dir / "serving.json").read_text())["tmp_dir"] == tmp  # the adopting agent reads it
    # what vLLM keeps there (its ZMQ sockets, vllm_dist_*, a Prometheus directory); and a symlink out of it
    decoy = tmp_path / "decoy.txt"
    decoy.write_text("not the run's")
    (Path(tmp) / "sub").mkdir()
    (Path(tmp) / "sub" / "f").write_text("x")
    (Path(tmp) / "sub" / "out").symlink_to(decoy)
    # systemctl restart with KillMode=process: the agent exits, vLLM keeps serving, and so does its TMPDIR
    assert a.stop(signal.SIGTERM) == 0
    assert procs.alive(pid) and (Path(tmp) / "sub" / "f").read_text() == "x"
    b = Agent(tmp_path, cfg, "a2")
    cleanup.append(b)
    st = await b.wait_state(lambda s: s["state"] == "ready" and s["adopted"], what="adopted ready")
    assert st["serving"]["pid"] == pid
    own_dir(tmp)  # the adopting agent's start-up leaves the adopted run's directory alone
    code, body = await b.api("POST", "/v1/stop", {})
    assert code == 202, body
    await b.wait_state(lambda s: s["state"] == "stopped", what="stopped")
    assert not sim_processes(tmp_path / "sim-state")
    assert not os.path.lexists(tmp)  # removed by the agent that saw the run end
    assert decoy.read_text() == "not the run's"  # the symlink inside was removed, not followed
    assert os.listdir(root) == []
    assert b.stop(signal.SIGTERM) == 0


async def test_an_adopted_run_that_crashes_has_its_tmpdir_removed_by_the_adopter(make_sup, store, h, tmp_path,
                                                                                  short_dir, monkeypatch):
    monkeypatch.setenv("STANDIN_DIST", "1")  # the stand-in makes a vllm_dist_* file as vLLM does, with tempfile
    cfg = short_config(tmp_path, short_dir, h)
    a = make_sup(cfg_path=cfg, state_path=short_dir / "serving.json")
    await start_ready(a, h)
    tmp = a.proc.record.tmp_dir
    assert tmp is not None and procs.environ_value(a.proc.pid, "TMPDIR") == tmp
    # vLLM's torch.distributed rendezvous file is made with tempfile: it is in the run's directory now
    assert [p.name for p in Path(tmp).iterdir() if p.name.startswith("vllm_dist_")]
    await a.shutdown(stop_serving=False)
    assert Path(tmp).is_dir()
    b = make_sup(cfg_path=cfg, state_path=short_dir / "serving.json")
    await b.take_over(None)
    await h.wait_for(lambda: b.state == "ready" and b.adopted, 10, what="adopted ready")
    assert b.proc.record.tmp_dir == tmp and Path(tmp).is_dir()
    os.kill(b.proc.pid, signal.SIGKILL)  # its engine lives on: the adopter stops it, then removes the directory
    await h.wait_for(lambda: not os.path.lexists(tmp), 15, what="the crashed run's TMPDIR removed")
    await h.wait_for(lambda: b.state == "ready" and b.proc.record.tmp_dir not in (None, tmp), 15,
                     what="the retry with a TMPDIR of its own")
    own_dir(b.proc.record.tmp_dir)
    await b.shutdown(stop_serving=True)
    assert os.listdir(short_dir / "run-tmp") == []


async def test_a_profiles_own_tmpdir_is_kept(make_sup, store, h, tmp_path, short_dir, monkeypatch):
    monkeypatch.setenv("STANDIN_DIST", "1")
    mine = tmp_path / "my-tmp"
    mine.mkdir()
    cfg = short_config(tmp_path, short_dir, h, env={"TMPDIR": str(mine)})
    sup = make_sup(cfg_path=cfg, state_path=short_dir / "serving.json")
    await start_ready(sup, h)
    assert {procs.environ_value(p, "TMPDIR") for p in sup.proc.members()} == {str(mine)}
    assert sup.proc.record.tmp_dir is None
    assert [p.name for p in mine.iterdir() if p.name.startswith("vllm_dist_")]  # the run's files went there
    assert not (short_dir / "run-tmp").exists() or os.listdir(short_dir / "run-tmp") == []
    await sup.stop(by="test")
    await h.wait_for(lambda: sup.state == "stopped" and sup.action is None, 15, what="stopped")
    assert mine.is_dir()  # the profile's directory is its own: the agent never removes it
    await sup.shutdown(stop_serving=True)


async def test_a_symlink_planted_as_run_tmp_is_refused_not_followed(make_sup, store, h, tmp_path, short_dir):
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (short_dir / "run-tmp").symlink_to(decoy)
    cfg = short_config(tmp_path, short_dir, h)
    sup = make_sup(cfg_path=cfg, state_path=short_dir / "serving.json")
    await start_ready(sup, h)  # serving is not refused for it: the run keeps the agent's own temporary directory
    assert sup.proc.record.tmp_dir is None
    assert procs.environ_value(sup.proc.pid, "TMPDIR") != str(decoy)
    assert list(decoy.iterdir()) == []  # nothing was made through the link
    starting = events(store, h, "serving.starting")[-1]
    assert "symlink" in starting["message"] and starting["details"]["tmp_dir"] is None
    await sup.shutdown(stop_serving=True)


async def test_a_symlink_swapped_in_for_a_runs_tmpdir_is_not_followed_when_it_is_removed(
        make_sup, store, h, tmp_path, short_dir):
    cfg = short_config(tmp_path, short_dir, h)
    sup = make_sup(cfg_path=cfg, state_path=short_dir / "serving.json")
    await start_ready(sup, h)
    tmp = sup.proc.record.tmp_dir
    assert tmp is not None
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "keep").write_text("someone else's")
    os.rename(tmp, short_dir / "moved")
    os.symlink(decoy, tmp)
    await sup.stop(by="test")
    await h.wait_for(lambda: sup.state == "stopped" and sup.action is None, 15, what="stopped")
    assert (decoy / "keep").read_text() == "someone else's"
    assert os.path.islink(tmp)
    exited = events(store, h, "serving.exited")[-1]
    assert any(tmp in x and "symlink" in x for x in exited["details"]["not_removed"]), exited["details"]
    await sup.shutdown(stop_serving=True)


async def test_stale_tmpdirs_are_removed_at_start_only_when_no_process_of_a_run_lives(
        make_sup, store, h, tmp_path, short_dir, caplog):
    cfg = short_config(tmp_path, short_dir, h)
    root = short_dir / "run-tmp"
    root.mkdir(mode=0o700)
    stale, used, other = root / "deadbeef", root / "cafebabe", root / "not-a-run"
    for d in (stale, used, other):
        d.mkdir(mode=0o700)
    (stale / "f").write_text("left by a run that died with the node")
    logs = short_dir / "logs"
    logs.mkdir()
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    caplog.set_level(logging.INFO)
    # a process of an earlier run whose TMPDIR cannot be read: started in the run-log directory, its environment
    # empty, as vLLM's EngineCore reads once setproctitle retitled it: unsure, so nothing is removed
    engine = subprocess.Popen(sleeper, cwd=logs, env={})
    try:
        a = make_sup(cfg_path=cfg, state_path=short_dir / "serving.json")
        await a.take_over(None)
        assert stale.is_dir() and used.is_dir() and other.is_dir()
        assert any(str(engine.pid) in r.getMessage() and "kept" in r.getMessage() for r in caplog.records)
        await a.shutdown(stop_serving=True)
    finally:
        engine.kill()
        engine.wait()
    # a live process with its TMPDIR in one directory keeps that one; the directory of the adopted run is kept
    b = make_sup(cfg_path=cfg, state_path=short_dir / "serving.json")
    await start_ready(b, h)
    live = b.proc.record.tmp_dir
    await b.shutdown(stop_serving=False)
    user = subprocess.Popen(sleeper, env={**os.environ, "TMPDIR": str(used)})
    try:
        c = make_sup(cfg_path=cfg, state_path=short_dir / "serving.json")
        await c.take_over(None)
        assert c.adopted and Path(live).is_dir()
        assert not stale.exists()  # a run that is gone, no process in it: removed
        assert used.is_dir()
        assert other.is_dir()  # not a name the agent gives: not its to remove
        await c.shutdown(stop_serving=True)
    finally:
        user.kill()
        user.wait()


async def test_a_tmpdir_too_long_for_unix_sockets_is_not_used(make_sup, store, h, tmp_path):
    sup = make_sup()  # its database is under pytest's tmp_path
    root = tmp_path / "state" / "run-tmp"
    assert len(str(root / "abcdef01")) > 39  # Ray's plasma socket under it would pass sun_path's 107 bytes
    await start_ready(sup, h)
    tmp = procs.environ_value(sup.proc.pid, "TMPDIR")
    assert tmp is None or not tmp.startswith(str(root))
    assert sup.proc.record.tmp_dir is None and not root.exists()
    assert "bytes" in events(store, h, "serving.starting")[-1]["message"]
    await sup.shutdown(stop_serving=True)


def test_make_refuses_what_is_already_at_a_runs_path_and_an_unsafe_root(tmp_path, short_dir):
    from lynxtop.agent.serving import runtmp

    root = short_dir / "run-tmp"
    path, why = runtmp.make(root, "abcdef01")
    assert path == str(root / "abcdef01") and why is None
    own_dir(root)
    own_dir(path)
    target = tmp_path / "target"
    target.mkdir()
    (root / "abcdef02").symlink_to(target)
    path, why = runtmp.make(root, "abcdef02")
    assert path is None and "already exists" in why
    assert list(target.iterdir()) == [] and os.path.islink(root / "abcdef02")
    root.chmod(0o770)  # others could swap entries in it
    path, why = runtmp.make(root, "abcdef03")
    assert path is None and "writable" in why and not (root / "abcdef03").exists()


def test_remove_takes_only_a_real_directory_of_ours_by_the_shape_the_agent_gives(tmp_path, short_dir):
    from lynxtop.agent.serving import runtmp

    root = short_dir / "run-tmp"
    path, _ = runtmp.make(root, "abcdef01")
    assert path is not None
    (Path(path) / "a" / "b").mkdir(parents=True)
    (Path(path) / "a" / "b" / "sock").write_text("")
    assert runtmp.remove(path) is None and not os.path.lexists(path)
    assert runtmp.remove(path) is None  # already gone: nothing to say
    assert "not a run's temporary directory" in runtmp.remove(str(tmp_path))  # a tampered record
    (root / "abcdef02").symlink_to(tmp_path)
    assert "symlink" in runtmp.remove(str(root / "abcdef02")) and tmp_path.is_dir()
    elsewhere = tmp_path / "elsewhere"  # a run-tmp swapped for a symlink: what it points at is not touched
    (elsewhere / "abcdef04").mkdir(parents=True)
    moved = short_dir / "moved"
    os.rename(root, moved)
    root.symlink_to(elsewhere)
    assert "symlink" in runtmp.remove(str(root / "abcdef04")) and (elsewhere / "abcdef04").is_dir()
    root.unlink()
    os.rename(moved, root)
    if os.geteuid() == 0:
        foreign = root / "abcdef03"
        foreign.mkdir(mode=0o700)
        os.chown(foreign, 65534, 65534)
        assert "uid 65534" in runtmp.remove(str(foreign)) and foreign.is_dir()


def test_a_spawn_that_fails_leaves_no_tmpdir(short_dir):
    from lynxtop.agent.serving import launcher

    root = short_dir / "run-tmp"
    with pytest.raises(OSError):
        launcher.spawn([str(short_dir / "no-such-vllm")], short_dir / "logs" / "x.log", {}, "p", tmp_root=root)
    assert os.listdir(root) == []
