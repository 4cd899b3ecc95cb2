"""An agent run as another user than its state directory's owner (`sudo lynxtop agent` by hand while the service
runs as User=lynxtop) is refused before it touches anything: it used to adopt the run and rewrite serving.json as
its own 0640 file, which the service's agent then could not read (the live model unsupervised), or start a vLLM
as root that no lynxtop command could stop. Real agent processes (root here), a directory chowned to uid 65534."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest
from support.agent_proc import Agent, e2e_config

from lynxtop.agent.node import AgentUsageError, lock_state_dir, refuse_foreign_state_dir

pytestmark = [pytest.mark.timeout(90),
              pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")]

OTHER = 65534  # "nobody": stands in for User=lynxtop


def snapshot(d: Path) -> dict[str, tuple]:
    """Every entry under `d` and `d` itself: kind, mode, owner, size, mtime and content."""
    out = {}
    for p in [d, *sorted(d.rglob("*"))]:
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if stat.S_ISREG(st.st_mode) else ""
        out[str(p.relative_to(d))] = (st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, digest)
    return out


def chown_tree(d: Path, uid: int) -> None:
    for p in [d, *d.rglob("*")]:
        os.lchown(p, uid, uid)


def test_a_state_dir_of_another_user_is_refused_naming_both_and_the_remedy(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    os.chown(state, OTHER, OTHER)
    with pytest.raises(AgentUsageError) as err:
        lock_state_dir(state)
    msg = str(err.value)
    assert f"the state directory {state} belongs to nobody (uid {OTHER}) but this agent runs as root (uid 0)" in msg
    assert "sudo -u nobody lynxtop agent" in msg and "systemctl start lynxtop-agent" in msg
    assert "\n" not in msg and err.value.exit_code == 2
    assert list(state.iterdir()) == []  # no agent.lock made


def test_an_owned_or_new_state_dir_is_accepted(tmp_path):
    refuse_foreign_state_dir(tmp_path / "not-there-yet")  # this agent creates it: its own
    refuse_foreign_state_dir(tmp_path)
    fd = lock_state_dir(tmp_path / "new")
    os.close(fd)


async def test_the_root_agent_on_the_service_users_state_dir_exits_2_and_changes_nothing(tmp_path, cleanup):
    cfg = e2e_config(tmp_path, autostart=False)
    a = Agent(tmp_path, cfg, "service")  # the state the service's agent leaves: database, lock, ...
    cleanup.append(a)
    await a.wait_notify("READY=1")
    assert a.stop() == 0
    state = tmp_path / "state"
    (state / "serving.json").write_text('{"pid": 1}')  # a record the service's next agent must still read
    chown_tree(state, OTHER)
    before = snapshot(state)
    b = Agent(tmp_path, cfg, "by-hand")  # `sudo lynxtop agent --config ...`
    cleanup.append(b)
    rc = b.proc.wait(30)
    out = b.output()
    assert rc == 2, out
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert lines == [f"lynxtop agent: the state directory {state} belongs to nobody (uid {OTHER}) but this agent "
                     "runs as root (uid 0); nothing was changed. Run it as the owner (sudo -u nobody lynxtop agent "
                     "...) or through systemd (systemctl start lynxtop-agent)"], out
    assert snapshot(state) == before
    assert not (tmp_path / "run" / "agent.sock").exists()
    b.stop()
