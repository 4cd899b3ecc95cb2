"""The control socket's directory removed where the agent may not make it again (systemd's /run/lynxtop inside
root's /run, cleaned by tmpfiles or `rm -rf`): one `agent.socket_lost` for the episode, not one every 5 s check;
the agent keeps retrying quietly, and once the directory is back it binds again with one `agent.socket_recreated`
that says how long the socket was lost. The agent runs unprivileged (nobody, via setpriv), so its mkdir fails with
EACCES as it would under systemd; a root agent would simply make the directory again."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sqlite3
import tempfile
import time
from pathlib import Path

import pytest
from support.agent_config import write_agent_config
from support.agent_proc import Agent
from support.db import db_rows
from support.waits import wait_for_async

NOBODY = 65534

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                 reason="needs root and setpriv to run the agent as nobody")]


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as c:
        try:
            c.connect(str(path))
        except OSError:
            return False
    return True


async def test_socket_dir_that_cannot_be_made_again_is_one_episode():
    base = Path(tempfile.mkdtemp(prefix="lynx-sockep-", dir="/tmp"))  # root's, 0755: nobody may mkdir in it
    a = None
    try:
        base.chmod(0o755)
        for d in ("state", "run"):
            (base / d).mkdir()
            os.chown(base / d, NOBODY, NOBODY)
        sock = base / "run" / "agent.sock"
        cfg = write_agent_config(base / "config.toml", base / "state" / "lynxtop.db", sock,
                                 fake_nvml="h200x8", sample_interval_s=1.0, socket_group="nogroup")
        cfg.chmod(0o644)
        a = Agent(base, cfg, prefix=("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"))
        os.chmod(a.notify_path, 0o666)
        await a.wait_notify("READY=1", timeout=30)
        assert _answers(sock)
        shutil.rmtree(base / "run")
        t0 = time.monotonic()
        await asyncio.sleep(22)  # the check that finds it gone, then two or more retries, each failing with EACCES
        assert a.proc.poll() is None, a.output()
        assert not (base / "run").exists()  # really not re-creatable by the agent
        (base / "run").mkdir()  # systemd (or an operator) makes it again: the next quiet retry binds
        os.chown(base / "run", NOBODY, NOBODY)
        # the next check binds: checks are 5 s apart, later on a loaded machine
        await wait_for_async(lambda: _answers(sock), 30, what=f"the agent answering on {sock} again")
        lost_s = time.monotonic() - t0
        assert (await a.status())["agent"]["pid"] == a.proc.pid  # `lynxtop` reaches the agent again

        def recreated_stored() -> bool:
            try:
                return bool(db_rows(base / "state" / "lynxtop.db",
                                    "SELECT 1 FROM events WHERE kind = 'agent.socket_recreated'"))
            except sqlite3.Error:  # read-only: the writer's files may be mid-change
                return False

        await wait_for_async(recreated_stored, 30, what="the agent.socket_recreated event in the database")
        a.stop()
        rows = db_rows(base / "state" / "lynxtop.db", "SELECT kind, severity, message FROM events WHERE kind IN "
                       "('agent.socket_lost', 'agent.socket_recreated') ORDER BY id")
        assert [r["kind"] for r in rows] == ["agent.socket_lost", "agent.socket_recreated"], rows
        assert "Permission denied" in rows[0]["message"] and rows[0]["severity"] == "error", rows
        msg = rows[1]["message"]
        assert "was removed" in msg and "re-created" in msg and "failed tries" in msg, msg
        told_s = int(msg.split(" after ")[1].split(" s ")[0])
        # how long it was lost, from the check that found it gone (checks are 5 s apart, a loaded machine later)
        assert lost_s - 8 <= told_s <= lost_s + 1 and told_s >= 9, (told_s, lost_s)
        tries = int(msg.split("(")[-1].split(" failed")[0])
        # retried at every check after the one that found it gone (5 s apart; fewer when load delays them)
        assert tries >= 2, msg
        log = (base / "agent.log").read_text(errors="replace")
        assert log.count("agent.socket_lost") == 1, log[-3000:]
    finally:
        if a is not None and a.proc.poll() is None:
            a.proc.kill()
        shutil.rmtree(base, ignore_errors=True)
