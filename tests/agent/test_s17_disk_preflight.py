"""Free space before a run starts (session 17): vLLM is given its log file as stdout/stderr, and on a full file
system its progress bars (tqdm) re-raise ENOSPC, so a load dies with exit 1. A restart or switch on a full disk
would stop the working model and then fail to start the new one. So an operator's start, restart or switch is
refused (409 disk_full) before anything is stopped, an autostart or a retry waits and says why once, and a run
that dies before ready on a full log disk says so in its crash event.

Free space is faked (os.statvfs answers low for one directory) where no root is needed; the last tests mount a
real tmpfs (root only, as in CI)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.agent_config import profile
from support.agent_proc import Agent, e2e_config
from support.small_fs import fill, mounted

from lynxtop.agent.api.control import ActionError

pytestmark = pytest.mark.timeout(90)

LOW = 3 * 4096  # bytes free on a "full" file system: far below the default threshold (256 MiB)


class FakeDisk:
    """os.statvfs answering `free` bytes for the directories in `low` (and below them); real elsewhere."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.low: set[str] = set()
        real = os.statvfs

        def statvfs(path):
            st = real(path)
            if isinstance(path, int):
                return st
            p = os.path.realpath(os.fspath(path))
            if any(p == d or p.startswith(d + os.sep) for d in self.low):
                blocks = LOW // 4096
                return os.statvfs_result((4096, 4096, st.f_blocks, blocks, blocks, st.f_files, st.f_ffree,
                                          st.f_favail, st.f_flag, st.f_namemax))
            return st

        monkeypatch.setattr(os, "statvfs", statvfs)

    def fill(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.low.add(os.path.realpath(path))

    def free(self) -> None:
        self.low.clear()


@pytest.fixture
def disk(monkeypatch):
    return FakeDisk(monkeypatch)


def events(h, store, kind: str) -> list[dict]:
    assert store.flush(10)
    return h.db_rows(store.path, "SELECT * FROM events WHERE kind = ? ORDER BY id", (kind,))


def run_logs(tmp_path: Path) -> list[Path]:
    logs = tmp_path / "state" / "logs"
    return sorted(logs.glob("*.log")) if logs.exists() else []


# ------------------------------------------------------------------------------- operator actions: refused


@pytest.mark.parametrize("action", ["restart", "switch"])
async def test_a_restart_or_switch_on_a_full_log_disk_is_refused_and_the_model_left_alone(make_sup, h, tmp_path,
                                                                                         disk, action):
    sup = make_sup()
    await sup.start("alpha", by="test")
    await h.wait_for(lambda: sup.state == "ready" and sup.action is None, 15, what="alpha ready")
    run_id, pid, logs = sup.run_id, sup.proc.pid, run_logs(tmp_path)
    log_dir = tmp_path / "state" / "logs"
    disk.fill(log_dir)
    with pytest.raises(ActionError) as exc:
        if action == "restart":
            await sup.restart(by="test")
        else:
            await sup.switch("beta", by="test")
    err = exc.value
    assert err.code == "disk_full" and err.http_status == 409, err.message
    assert str(log_dir) in err.message and f"{LOW} bytes free" in err.message and "256 MiB" in err.message
    assert "nothing was" in err.message
    assert err.details["path"] == str(log_dir) and err.details["free_bytes"] == LOW
    assert err.details["min_free_bytes"] == 256 << 20
    await asyncio.sleep(0.5)
    assert sup.state == "ready" and sup.run_id == run_id and sup.proc.pid == pid and not sup.proc.exited
    assert sup.action is None and run_logs(tmp_path) == logs
    assert not (tmp_path / "state" / "switch.json").exists()  # nothing for a later agent to "finish" either
    disk.free()
    await sup.restart(by="test")  # space came back: the same action goes ahead
    await h.wait_for(lambda: sup.state == "ready" and sup.action is None and sup.run_id != run_id, 20,
                     what="restarted once space is back")


async def test_a_start_on_a_full_database_disk_is_refused(make_sup, h, tmp_path, disk):
    """serving.json and the run's TMPDIR live beside the database: its file system counts too."""
    sup = make_sup()
    disk.fill(tmp_path / "state")
    with pytest.raises(ActionError) as exc:
        await sup.start("alpha", by="test")
    assert exc.value.code == "disk_full" and str(tmp_path / "state") in exc.value.message
    assert sup.state == "stopped" and sup.run is None and sup.action is None and not run_logs(tmp_path)


async def test_min_free_mb_zero_turns_the_check_off(make_sup, h, tmp_path, disk):
    sup = make_sup(agent="min_free_mb = 0")
    disk.fill(tmp_path / "state")
    await sup.start("alpha", by="test")
    await h.wait_for(lambda: sup.state == "ready", 15, what="ready with the check off")


# ------------------------------------------------------------------------------- the agent's own starts: wait


async def test_autostart_waits_says_why_once_then_starts_when_space_returns(make_sup, h, store, tmp_path, disk):
    log_dir = tmp_path / "state" / "logs"
    disk.fill(log_dir)
    sup = make_sup()
    await sup.take_over("alpha")
    await h.wait_for(lambda: sup.state == "waiting", 30, what="waiting for space")
    assert str(log_dir) in sup.reason and "full" in sup.reason
    await asyncio.sleep(1.5)  # several re-checks (backoff_initial_s 0.2 here): one event, nothing launched
    held = events(h, store, "agent.autostart_held")
    assert len(held) == 1 and str(log_dir) in held[0]["message"], held
    details = json.loads(held[0]["details"])
    assert details["reason"] == "disk_full" and details["free_bytes"] == LOW
    assert sup.run is None and not run_logs(tmp_path) and not events(h, store, "agent.autostart_failed")
    disk.free()
    await h.wait_for(lambda: sup.state == "ready", 15, what="ready once space is back")
    assert len(run_logs(tmp_path)) == 1 and len(events(h, store, "agent.autostart_held")) == 1


async def test_a_stop_ends_the_wait_for_space(make_sup, h, tmp_path, disk):
    disk.fill(tmp_path / "state" / "logs")
    sup = make_sup()
    await sup.take_over("alpha")
    await h.wait_for(lambda: sup.state == "waiting", 30, what="waiting for space")
    await sup.stop(by="test")
    await h.wait_for(lambda: sup.state == "stopped" and sup.action is None, 30, what="stopped")
    disk.free()
    await asyncio.sleep(0.6)
    assert sup.run is None and not run_logs(tmp_path)


# ------------------------------------------------------------------------------- a load killed by its full disk

DIES = f"#!{sys.executable}\nimport sys, time\ntime.sleep(0.5)\nsys.exit(1)\n"


async def test_a_load_that_dies_with_its_log_disk_full_says_so_and_its_retry_waits(make_sup, h, store, tmp_path,
                                                                                   disk):
    exe = tmp_path / "dies"
    exe.write_text(DIES)
    exe.chmod(0o755)
    sup = make_sup(profiles=profile("load", exe, readiness_timeout_s=20, stop_grace_s=2, shutdown_timeout_s=1))
    await sup.start("load", by="test")
    await h.wait_for(lambda: sup.proc is not None, 10, what="the load started")
    log_dir = tmp_path / "state" / "logs"
    disk.fill(log_dir)  # the disk fills during the load
    await h.wait_for(lambda: events(h, store, "serving.crash"), 10, what="the crash")
    crash = events(h, store, "serving.crash")[0]
    assert f"the run log's file system {log_dir} is full: {LOW} bytes free" in crash["message"], crash["message"]
    assert "exited with code 1" in crash["message"]
    # the retry waits for space instead of crashing again (no crash loop of a load that cannot write its log)
    await h.wait_for(lambda: sup.state == "waiting", 10, what="the retry waiting for space")
    await asyncio.sleep(1.0)
    assert len(events(h, store, "serving.crash")) == 1 and sup.state == "waiting"
    waits = [e for e in events(h, store, "serving.backoff") if json.loads(e["details"]).get("reason") == "disk_full"]
    assert len(waits) == 1, waits


async def test_a_crash_with_space_left_names_only_the_exit(make_sup, h, store, tmp_path):
    exe = tmp_path / "dies"
    exe.write_text(DIES)
    exe.chmod(0o755)
    sup = make_sup(profiles=profile("load", exe, readiness_timeout_s=20, stop_grace_s=2, shutdown_timeout_s=1))
    await sup.start("load", by="test")
    await h.wait_for(lambda: events(h, store, "serving.crash"), 10, what="the crash")
    msg = events(h, store, "serving.crash")[0]["message"]
    assert "exited with code 1 before becoming ready" in msg and "full" not in msg


# ------------------------------------------------------------------------------- the config key


@pytest.mark.parametrize("value", ["-1", "\"lots\"", "1e12", "true"])
def test_a_bad_min_free_mb_is_named_by_config_check(h, tmp_path, value):
    cfg = h.write_config(tmp_path, agent=f"min_free_mb = {value}")
    out = subprocess.run([sys.executable, "-m", "lynxtop", "config", "check", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=60)
    said = out.stdout + out.stderr
    assert out.returncode != 0 and "agent.min_free_mb" in said, out
    assert "expected an integer" in said or "out of range" in said, said


def test_a_good_min_free_mb_passes_config_check(h, tmp_path):
    cfg = h.write_config(tmp_path, agent="min_free_mb = 1024")
    out = subprocess.run([sys.executable, "-m", "lynxtop", "config", "check", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "min_free_mb = 1024" in out.stdout, out


# ------------------------------------------------------------------------------- a real full file system


@pytest.fixture
def tmpfs(tmp_path):
    """A 300m tmpfs (support/small_fs.py)."""
    with mounted(tmp_path / "small", "300m") as mnt:
        yield mnt


@pytest.mark.timeout(120)
async def test_a_real_agent_refuses_a_restart_on_a_full_log_tmpfs(tmp_path, tmpfs, cleanup):
    log_dir = tmpfs / "logs"
    cfg = e2e_config(tmp_path, extra_agent=f"log_dir = {json.dumps(str(log_dir))}")
    a = Agent(tmp_path, cfg)
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    run_id, pid = st["serving"]["run_id"], st["serving"]["pid"]
    fill(tmpfs)
    code, body = await a.api("POST", "/v1/restart", {})
    assert code == 409 and body["error"] == "disk_full", body
    assert str(log_dir) in body["message"] and "bytes free" in body["message"], body
    await asyncio.sleep(1.0)
    st = (await a.status())["serving"]
    assert (st["state"], st["run_id"], st["pid"]) == ("ready", run_id, pid), st
    assert a.stop() == 0
