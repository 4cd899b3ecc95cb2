"""This node's Ray keeps its session in `<database dir>/rt` (RAY_TMPDIR), not the unit's private /tmp.

Under systemd (PrivateTmp=yes, KillMode=process) the agent's /tmp is removed when the unit stops while Ray keeps
running (live restore), and the next agent has a new one: Ray's sockets and logs would be deleted under it, and the
next vLLM could not open the raylet's socket paths the GCS hands it. A stand-in `ray` (real processes) shows what
the agent hands Ray; real Ray runs in the real-vLLM stage.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from support.agent_config import agent_toml
from support.waits import wait_for_async as wait_for

from lynxtop.agent.cluster import raynode
from lynxtop.agent.cluster.raynode import RayNode
from lynxtop.contract.config import parse_config
from lynxtop.contract.events import EventKind
from lynxtop.contract.status import RayState

pytestmark = pytest.mark.timeout(60)

FAKE_RAY = textwrap.dedent("""\
    #!{python}
    # a stand-in for `ray start --block`: says it started, then blocks; SIGTERM ends it cleanly
    import signal, sys, time
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    print("Ray runtime started.", flush=True)
    while True:
        time.sleep(1)
""")


@pytest.fixture
def short(tmp_path, monkeypatch):
    """A database directory short enough for Ray's socket paths (pytest's tmp_path is not): /tmp/lxXXXXXXXX."""
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    d = Path(tempfile.mkdtemp(prefix="lx", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def exe(tmp_path):
    path = tmp_path / "bin" / "ray"
    path.parent.mkdir()
    path.write_text(FAKE_RAY.format(python=sys.executable))
    path.chmod(0o755)
    return path


def cfg(db_dir: Path, exe: Path, role: str = "worker", ray: str = ""):
    text = agent_toml(db_dir / "lynxtop.db", db_dir / "agent.sock", role=role)
    text += f'\n[ray]\nexecutable = "{exe}"\n'
    if role == "worker":
        text += 'head_address = "10.0.0.1:6379"\n'
    return parse_config(text + ray)


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in raw if b"=" in e)


async def started(c, state: Path, events: list) -> RayNode:
    state.mkdir(exist_ok=True)
    rn = RayNode(c, events.append, state_dir=state)
    await rn.boot()
    await wait_for(lambda: rn.state == RayState.RUNNING, 10, what="running")
    return rn


def kill(*nodes: RayNode) -> None:
    for rn in nodes:
        if rn.proc is not None and not rn.proc.exited:
            rn.proc.signal_group(signal.SIGKILL)


@pytest.mark.parametrize("role", ["head", "worker"])
async def test_ray_keeps_its_session_under_the_database_dir_0700_and_kept_after_it_stops(short, exe, role):
    events: list = []
    rn = await started(cfg(short, exe, role), short / "state", events)
    try:
        rt = short / "rt"
        assert environ(rn.proc.pid)["RAY_TMPDIR"] == str(rt)
        st = os.lstat(rt)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
        starting = next(e for e in events if e.kind == EventKind.RAY_STARTING)
        assert str(rt) in starting.message and starting.details["tmp_dir"] == str(rt)
        (rt / "ray").mkdir()  # what Ray would make there
        await rn.stop("test")
        assert (rt / "ray").is_dir()  # Ray's session directories are Ray's: never removed with it
        # the next Ray of the node reuses the same directory
        await rn.start("test")
        await wait_for(lambda: rn.state == RayState.RUNNING, 10, what="running again")
        assert environ(rn.proc.pid)["RAY_TMPDIR"] == str(rt)
    finally:
        kill(rn)


@pytest.mark.parametrize("ray, expect", [
    ('temp_dir = "/var/tmp/myray"\n', None),
    ('env = { RAY_TMPDIR = "/srv/raytmp" }\n', "/srv/raytmp"),
    ('env = { TMPDIR = "/srv/tmp" }\n', None),
])
async def test_rays_own_temp_dir_or_env_is_kept_and_nothing_is_made(short, exe, ray, expect):
    rn = await started(cfg(short, exe, "head", ray), short / "state", [])
    try:
        assert environ(rn.proc.pid).get("RAY_TMPDIR") == expect
        assert not (short / "rt").exists()
    finally:
        kill(rn)


async def test_a_symlink_at_the_path_is_refused_and_ray_keeps_its_default(short, exe, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    (short / "rt").symlink_to(elsewhere)
    events: list = []
    rn = await started(cfg(short, exe), short / "state", events)
    try:
        assert "RAY_TMPDIR" not in environ(rn.proc.pid)
        assert (short / "rt").is_symlink() and stat.S_IMODE(os.stat(elsewhere).st_mode) == 0o755  # not followed
        assert list(elsewhere.iterdir()) == []
        starting = next(e for e in events if e.kind == EventKind.RAY_STARTING)
        assert "symlink" in starting.message and "default" in starting.message
        assert "tmp_dir" not in starting.details and "symlink" in starting.details["tmp_dir_error"]
    finally:
        kill(rn)


async def test_a_directory_others_can_write_is_refused(short, exe):
    (short / "rt").mkdir()
    os.chmod(short / "rt", 0o777)
    events: list = []
    rn = await started(cfg(short, exe), short / "state", events)
    try:
        assert "RAY_TMPDIR" not in environ(rn.proc.pid)
        assert stat.S_IMODE(os.stat(short / "rt").st_mode) == 0o777
        starting = next(e for e in events if e.kind == EventKind.RAY_STARTING)
        assert "writable by others" in starting.message
    finally:
        kill(rn)


async def test_a_path_too_long_for_rays_sockets_is_not_used(short, exe):
    db_dir = short / ("d" * 24)  # /tmp/lxXXXXXXXX/ddd…/rt: 43 bytes, 4 past the 39 that leave room for the sockets
    db_dir.mkdir()
    assert len(str(db_dir / "rt")) == 43
    events: list = []
    rn = await started(cfg(db_dir, exe), db_dir / "state", events)
    try:
        assert "RAY_TMPDIR" not in environ(rn.proc.pid)
        assert not (db_dir / "rt").exists()
        starting = next(e for e in events if e.kind == EventKind.RAY_STARTING)
        assert "bytes" in starting.message and "default" in starting.message
    finally:
        kill(rn)


async def test_a_ray_started_without_ray_tmpdir_is_still_adopted(short, exe):
    """An older agent's Ray (no RAY_TMPDIR: here through [ray] temp_dir) is adopted by an agent that sets it."""
    events: list = []
    old = await started(cfg(short, exe, ray='temp_dir = "/var/tmp/oldray"\n'), short / "state", events)
    pid = old.proc.pid
    assert "RAY_TMPDIR" not in environ(pid)
    await old.shutdown(stop_ray=False)
    new = RayNode(cfg(short, exe), events.append, state_dir=short / "state")
    try:
        await new.boot()
        assert new.state == RayState.RUNNING and new.proc.pid == pid
        assert events[-1].kind == EventKind.RAY_ADOPTED
    finally:
        kill(old, new)


def session(n: int, pid: int) -> str:
    return f"session_2026-12-{n + 1:02d}_10-00-00_000000_{pid}"


async def test_old_sessions_beyond_the_newest_are_pruned_before_a_start(short, exe, tmp_path):
    ray_dir = short / "rt" / "ray"
    ray_dir.mkdir(parents=True)
    os.chmod(short / "rt", 0o700)
    os.chmod(ray_dir, 0o777)  # as Ray leaves it (try_make_directory_shared), inside the agent's 0700 rt
    dead = 99_999_999  # above any pid_max
    names = [session(i, dead) for i in range(8)]
    for n in names:
        (ray_dir / n / "logs").mkdir(parents=True)
    alive = session(0, os.getpid()).replace("10-00-00", "09-00-00")  # the oldest, but its process lives
    (ray_dir / alive).mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    link = session(0, dead).replace("10-00-00", "08-00-00")
    (ray_dir / link).symlink_to(outside)  # never followed nor removed
    (ray_dir / "session_latest").symlink_to(ray_dir / names[-1])
    (ray_dir / "other").mkdir()
    rn = await started(cfg(short, exe), short / "state", [])
    try:
        left = sorted(os.listdir(ray_dir))
        assert left == sorted([*names[-raynode.SESSIONS_KEPT:], alive, link, "session_latest", "other"])
        assert (outside / "keep").read_text() == "x"
    finally:
        kill(rn)
