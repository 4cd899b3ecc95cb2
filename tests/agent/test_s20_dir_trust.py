"""Directories and run records another user could write are not trusted (audit s20, files).

A run record (serving.json in the state directory, `<socket stem>.serving.json` beside the control socket) whose
server is gone makes the next agent SIGKILL every process its `members` name. So a record another user could plant
made the agent (root, in the brief) kill any process of the node: the copy beside the socket was read whoever
owned it, a state directory root owns but anyone may write (1777) passed the owner-only check, a socket directory
another user owns was listened in (that user could swap the socket), and a `log_dir` of another user was used.
Now the state, socket and log directories must be the agent's user's own and not writable by group or others (the
socket's may be a sticky directory such as /tmp: nobody else can remove or rename what the agent makes there), and
a record is read only when the agent's user owns it. Real agent processes, real files chowned to "nobody".
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest
from support.agent_proc import Agent, e2e_config, reap_sims

from lynxtop.agent.api import routes
from lynxtop.agent.node import AgentUsageError, lock_state_dir, refuse_foreign_state_dir
from lynxtop.agent.serving import launcher, procs
from lynxtop.agent.serving.statefiles import ServerState

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")]

NOBODY = 65534


def _forged(path: Path, victim: int, owner: int = NOBODY) -> None:
    """A record as another user would plant it: a dead leader, the victim as a 'member' (pid + start time)."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    st = procs.stat(victim)
    assert st is not None
    rec = launcher.ServerRecord(run_id=None, profile="v4-tp8", pid=dead.pid, pgid=dead.pid, start_ticks=1,
                                argv=["vllm", "serve", "m"], token="feedfacefeedface", log_path="/nonexistent.log",
                                started_ms=int(time.time() * 1000), members=[(victim, st.start_ticks)])
    path.write_text(rec.to_json())
    os.chown(path, owner, owner)
    os.chmod(path, 0o644)


def _victim() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "300"], user=NOBODY)  # another user's job on the node


def _end(victim: subprocess.Popen) -> None:
    if victim.poll() is None:
        victim.kill()
    victim.wait()


def _exit_code(agent: Agent, timeout: float = 60) -> int | None:
    """The agent's exit status once it exits, None if it got READY (or still runs at the deadline)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if agent.proc.poll() is not None:
            return agent.proc.returncode
        if any("READY=1" in m for m in agent.drain()):
            return None
        time.sleep(0.05)
    return None


def _record() -> launcher.ServerRecord:
    return launcher.ServerRecord(run_id=1, profile="alpha", pid=os.getpid(), pgid=os.getpgid(0), start_ticks=1,
                                 argv=["vllm", "serve", "m"], token="0123456789abcdef", log_path="/tmp/r.log",
                                 started_ms=1000)


# ------------------------------------------------------------------------------------------ the agent, end to end


def test_a_record_copy_another_user_planted_in_a_sticky_socket_directory_kills_no_process(tmp_path):
    """A socket in a sticky shared directory (like /tmp) is allowed; the copy another user planted there is not
    read: the agent starts, kills nothing, and says which file it ignored and whose it is."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(shared, 0o1777)
    sock = shared / "agent.sock"
    cfg = e2e_config(tmp_path, autostart=False, sock=sock)
    victim = _victim()
    try:
        copy = shared / "agent.serving.json"
        _forged(copy, victim.pid)
        agent = Agent(tmp_path, cfg, sock=sock)
        try:
            asyncio.run(agent.wait_notify("READY=1", timeout=60))
            time.sleep(1)  # kill_leftovers runs before READY; leave it a moment anyway
            assert victim.poll() is None, f"the agent killed another user's process:\n{agent.output()}"
            out = agent.output()
            assert str(copy) in out and f"uid {NOBODY}" in out, out
            assert copy.exists()  # not ours: left alone
        finally:
            agent.stop()
            reap_sims(tmp_path / "sim-state")
    finally:
        _end(victim)


def test_a_socket_directory_another_user_owns_is_refused_and_the_agent_exits_2(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chown(theirs, NOBODY, NOBODY)
    os.chmod(theirs, 0o755)
    sock = theirs / "agent.sock"
    cfg = e2e_config(tmp_path, autostart=False, sock=sock)
    agent = Agent(tmp_path, cfg, sock=sock)
    try:
        rc = _exit_code(agent)
        out = agent.output()
        assert rc == 2, f"the agent did not refuse the socket directory {theirs} of uid {NOBODY}:\n{out}"
        assert not sock.exists() and list(theirs.iterdir()) == []
        assert (f"the control socket's directory {theirs} belongs to nobody (uid {NOBODY}), mode 0755" in out
                and "[agent] socket" in out), out
        assert not (tmp_path / "state").exists()  # refused before the state directory was made
    finally:
        agent.stop()
        reap_sims(tmp_path / "sim-state")


def test_a_state_directory_others_may_write_is_refused_and_its_record_not_acted_on(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(state, 0o1777)
    cfg = e2e_config(tmp_path, autostart=False)
    victim = _victim()
    try:
        _forged(state / "serving.json", victim.pid)
        agent = Agent(tmp_path, cfg)
        try:
            rc = _exit_code(agent)
            time.sleep(1)
            out = agent.output()
            assert victim.poll() is None, f"a planted serving.json had the agent kill a process:\n{out}"
            assert rc == 2, out
            assert (f"the state directory {state} (owner root (uid 0), mode 1777) may be written by other users"
                    in out and f"chmod go-w {state}" in out), out
            assert sorted(p.name for p in state.iterdir()) == ["serving.json"]  # nothing made: no lock, no db
        finally:
            agent.stop()
            reap_sims(tmp_path / "sim-state")
    finally:
        _end(victim)


def test_a_log_directory_another_user_owns_is_refused(tmp_path):
    logs = tmp_path / "theirs-logs"
    logs.mkdir()
    os.chown(logs, NOBODY, NOBODY)
    cfg = e2e_config(tmp_path, autostart=False, extra_agent=f'log_dir = "{logs}"')
    agent = Agent(tmp_path, cfg)
    try:
        rc = _exit_code(agent)
        out = agent.output()
        assert rc == 2, f"the agent used the log directory {logs} of uid {NOBODY}:\n{out}"
        assert f"the run log directory {logs} belongs to nobody (uid {NOBODY})" in out and "[agent] log_dir" in out
        assert list(logs.iterdir()) == []
    finally:
        agent.stop()
        reap_sims(tmp_path / "sim-state")


# ------------------------------------------------------------------------------------------ the checks themselves


@pytest.mark.parametrize("mode", [0o770, 0o730, 0o757, 0o1777, 0o2775], ids=oct)
def test_a_group_or_other_writable_state_directory_is_refused_before_anything_is_made(tmp_path, mode):
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, mode)
    with pytest.raises(AgentUsageError) as err:
        lock_state_dir(state)
    msg = str(err.value)
    assert f"mode {mode:04o}" in msg and str(state) in msg and "\n" not in msg and err.value.exit_code == 2
    assert list(state.iterdir()) == []


@pytest.mark.parametrize("mode", [0o700, 0o750, 0o755, 0o2750], ids=oct)
def test_private_directories_as_tests_and_systemd_make_them_pass(tmp_path, mode):
    """0750 is the unit's StateDirectoryMode/RuntimeDirectoryMode; 0755/0700 what tests and mkdtemp make."""
    d = tmp_path / "d"
    d.mkdir()
    os.chmod(d, mode)
    refuse_foreign_state_dir(d)
    os.close(lock_state_dir(d))
    refuse_foreign_state_dir(tmp_path / "not-there-yet")  # this agent makes it: its own


def test_a_copy_beside_the_socket_another_user_owns_is_ignored_with_a_warning(tmp_path, caplog):
    (tmp_path / "state").mkdir()
    (tmp_path / "run").mkdir()
    st = ServerState(tmp_path / "state" / "serving.json", lambda *a, **k: None, socket=tmp_path / "run" / "a.sock")
    assert st.copy is not None
    launcher.write_record(st.copy, _record())
    os.chown(st.copy, NOBODY, NOBODY)
    with caplog.at_level(logging.WARNING):
        assert st.read() == (None, None)
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and str(st.copy) in warned[0] and f"nobody (uid {NOBODY})" in warned[0], warned
    os.chown(st.copy, 0, 0)  # the agent's own: read
    assert st.read()[0] == _record()


def test_a_primary_record_another_user_owns_is_not_read_and_the_reason_names_the_owner(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    st = ServerState(state / "serving.json", lambda *a, **k: None)
    launcher.write_record(st.path, _record())
    os.chown(st.path, NOBODY, NOBODY)
    rec, why = st.read()
    assert rec is None and why and str(st.path) in why and f"nobody (uid {NOBODY})" in why, why
    assert "nothing is adopted and nothing is signalled" in why


class _SwappingSocket(socket.socket):
    """Stands in for another user who, right after the bind, swaps the socket's temporary name for a symlink to
    a file of theirs choosing (possible where that user may write the directory)."""

    target: Path

    def bind(self, address) -> None:  # type: ignore[override]
        super().bind(address)
        os.unlink(address)
        os.symlink(self.target, address)


def test_the_socket_is_never_chmodded_or_chowned_through_a_symlink(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    precious = tmp_path / "precious"
    precious.write_text("secret")
    os.chmod(precious, 0o600)
    _SwappingSocket.target = precious
    monkeypatch.setattr(routes.socket, "socket", _SwappingSocket)
    server = routes.ApiServer.__new__(routes.ApiServer)
    server.group, server.log = "root", lambda m: None
    with pytest.raises(routes.ApiStartError) as err:
        server._bind(run / "agent.sock", 0)
    st = precious.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600 and (st.st_uid, st.st_gid) == (0, 0)
    assert "not the socket" in str(err.value) and str(run) in str(err.value)
    assert not (run / "agent.sock").exists() and not os.path.lexists(run / "agent.sock")


def test_bind_refuses_a_directory_another_user_owns(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    server = routes.ApiServer.__new__(routes.ApiServer)
    server.group, server.log = None, lambda m: None
    with pytest.raises(routes.ApiStartError) as err:
        server._bind(theirs / "agent.sock", None)
    assert f"belongs to nobody (uid {NOBODY})" in str(err.value)
    assert list(theirs.iterdir()) == []


def test_bind_in_a_private_directory_gives_a_0660_socket(tmp_path):
    server = routes.ApiServer.__new__(routes.ApiServer)
    server.group, server.log = "root", lambda m: None
    sock = server._bind(tmp_path / "agent.sock", 0)
    try:
        st = (tmp_path / "agent.sock").lstat()
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660 and st.st_uid == 0
    finally:
        sock.close()
