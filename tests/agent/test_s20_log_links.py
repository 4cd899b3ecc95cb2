"""A run's log (vLLM's, Ray's) is never written or served through whatever someone planted at its path.

The log directory may be writable by others (a configured `[agent] log_dir`, the service user vLLM runs as), and
Ray's log name is predictable (`ray-%Y%m%d-%H%M%S-mmm.log`). A symlink there once made the agent append a run's
output to a root-only file, and served a 0600 file as a run's log lines through `GET /v1/logs`. Now `spawn`
creates a new log with O_EXCL|O_NOFOLLOW (appends only to its own regular file with one name) and refuses to start
otherwise; every read (LogTail, the phase tracker, an event's log tail) takes only a regular file with one name,
opened without following a link. Real files, FIFOs, processes and a real API socket.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from datetime import UTC, datetime

import aiohttp
import pytest
from support.log_agent import FileController

from lynxtop.agent.api.logtail import LogTail
from lynxtop.agent.api.routes import ApiServer
from lynxtop.agent.serving import launcher
from lynxtop.agent.serving.startup import PhaseTracker, tail_lines

pytestmark = pytest.mark.timeout(90)

SECRET = "root:$6$hash-of-roots-password:19000:0:99999:7:::\n"
PRINT = [sys.executable, "-c", "print('OUTPUT-OF-THE-RUN', flush=True)"]


def _secret(tmp_path):
    secret = tmp_path / "shadow"
    secret.write_text(SECRET)
    os.chmod(secret, 0o600)
    return secret


# ------------------------------------------------------------------------------------------ spawn (writing)

def test_spawn_refuses_a_symlink_at_the_log_path_and_starts_nothing(tmp_path):
    victim = tmp_path / "victim.conf"
    victim.write_text("root-only content\n")
    os.chmod(victim, 0o600)
    logs = tmp_path / "logs"
    logs.mkdir()
    log_path = logs / "ray-20261206-195100-123.log"
    log_path.symlink_to(victim)
    with pytest.raises(OSError) as exc:  # what the callers' start-failure paths catch (RunLogRefused)
        launcher.spawn(PRINT, log_path, {}, "ray")
    message = str(exc.value)
    assert str(log_path) in message and "symbolic link" in message and "not started" in message
    time.sleep(0.5)  # had anything been started, its line would be there by now
    assert victim.read_text() == "root-only content\n" and log_path.is_symlink()


def test_spawn_never_creates_the_target_of_a_dangling_link(tmp_path):
    target = tmp_path / "etc" / "cron.d-job"
    target.parent.mkdir()
    log_path = tmp_path / "run.log"
    log_path.symlink_to(target)
    with pytest.raises(OSError, match="symbolic link"):
        launcher.spawn(PRINT, log_path, {}, "alpha")
    assert not target.exists()


def test_spawn_refuses_a_hard_link_to_another_file(tmp_path):
    victim = tmp_path / "victim.conf"
    victim.write_text("kept\n")
    log_path = tmp_path / "run.log"
    os.link(victim, log_path)  # a second name for someone's file: a regular file, so only its link count tells
    with pytest.raises(OSError, match="hard link"):
        launcher.spawn(PRINT, log_path, {}, "alpha")
    time.sleep(0.5)
    assert victim.read_text() == "kept\n"


def test_spawn_refuses_a_fifo_at_the_log_path_without_blocking(tmp_path):
    log_path = tmp_path / "run.log"
    os.mkfifo(log_path)
    result: dict[str, object] = {}

    def go() -> None:
        try:
            proc = launcher.spawn(PRINT, log_path, {}, "alpha")
            result["proc"] = proc
        except OSError as exc:
            result["error"] = exc

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(20)
    if t.is_alive():  # the old code: open() of a FIFO waits for a reader; give it one to end the thread
        fd = os.open(log_path, os.O_RDONLY | os.O_NONBLOCK)
        t.join(20)
        os.close(fd)
    proc = result.get("proc")
    if proc is not None:
        proc.popen.wait(30)  # type: ignore[attr-defined]
    assert isinstance(result.get("error"), OSError), f"a FIFO at the log path was used: {result}"
    assert "FIFO" in str(result["error"]) and str(log_path) in str(result["error"])


# ------------------------------------------------------------------------------------------ reads

def test_logtail_serves_nothing_through_a_symlink_and_says_why(tmp_path):
    secret = _secret(tmp_path)
    log_path = tmp_path / "run.log"
    log_path.symlink_to(secret)
    tail = LogTail(str(log_path), lines=100, max_bytes=1 << 20)
    tail.locate()
    served = "".join(tail.reader())
    assert "hash-of-roots-password" not in served and served == ""
    info = tail.follow_info()
    assert info["error"] and str(log_path) in info["error"] and "symbolic link" in info["error"]
    assert info["inode"] is None and info["next"] == 0


def test_logtail_refuses_a_fifo_without_blocking(tmp_path):
    log_path = tmp_path / "run.log"
    os.mkfifo(log_path)
    tail = LogTail(str(log_path), lines=100, max_bytes=1 << 20)
    t = threading.Thread(target=tail.locate, daemon=True)
    t.start()
    t.join(20)
    if t.is_alive():  # the old code blocks in open() until a writer comes: be that writer to end the thread
        fd = os.open(log_path, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        t.join(20)
        pytest.fail("reading the logs of a run whose log is a FIFO blocked the reader")
    assert tail.error and "FIFO" in tail.error


def test_phases_and_event_log_tails_never_read_through_a_symlink(tmp_path):
    secret = tmp_path / "shadow"
    secret.write_text("INFO Starting to load model secret-weights\nroot:$6$hash-of-roots-password:1:0\n")
    os.chmod(secret, 0o600)
    log_path = tmp_path / "run.log"
    log_path.symlink_to(secret)
    assert tail_lines(log_path, 20) == []  # what an exit event carries as `log_tail`
    tracker = PhaseTracker(log_path, started_ms=1)
    tracker.start_at_tail()
    assert tracker.poll(2) == [] and tracker.offset == 0


async def test_logs_answer_says_the_log_cannot_be_read_on_a_real_socket(sock_dir, tmp_path):
    secret = _secret(tmp_path)
    log_path = tmp_path / "run.log"
    log_path.symlink_to(secret)
    server = ApiServer(FileController(log_path), sock_dir / "agent.sock", group="nogroup-lynxtop-test",
                       log=lambda m: None)
    await server.start()
    try:
        connector = aiohttp.UnixConnector(path=str(sock_dir / "agent.sock"))
        async with aiohttp.ClientSession(connector=connector) as s, s.get("http://agent/v1/logs?lines=100") as resp:
            status, text = resp.status, await resp.text()
    finally:
        await server.stop()
    assert status == 200 and "hash-of-roots-password" not in text
    body = json.loads(text)
    assert body["lines"] == [] and str(log_path) in body["error"] and "symbolic link" in body["error"]


# ------------------------------------------------------------------------------------------ the agent's start

async def test_a_run_whose_log_path_is_a_link_fails_to_start_with_one_event(make_sup, h, store, tmp_path,
                                                                            monkeypatch):
    """The supervisor's own start path: one serving.start_failed naming the path, stopped, no retries, nothing
    written through the link. The run's log name is `<stamp>_<profile>_<token[:8]>.log`: the token is fixed here
    and links planted for every second of the next two minutes, as someone who knew the token could."""
    victim = tmp_path / "victim.conf"
    victim.write_text("kept\n")
    monkeypatch.setattr(launcher, "new_token", lambda: "feedc0de" * 2)
    sup = make_sup()
    logs = tmp_path / "state" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for s in range(-5, 120):
        stamp = datetime.fromtimestamp(now + s, UTC).strftime("%Y%m%dT%H%M%SZ")
        (logs / f"{stamp}_alpha_feedc0de.log").symlink_to(victim)
    await sup.start("alpha", by="test")
    await h.wait_for(lambda: sup.state == "stopped", 30, what="stopped after the refused log")
    await asyncio.sleep(1.0)  # a retry (backoff_initial_s 0.2 here) would have come by now
    store.flush()
    failed = h.db_rows(store.path, "SELECT * FROM events WHERE kind = 'serving.start_failed'", ())
    assert len(failed) == 1, failed
    assert "symbolic link" in failed[0]["message"] and str(logs) in failed[0]["message"]
    assert "Traceback" not in failed[0]["message"]
    assert sup.run is None and victim.read_text() == "kept\n"
    assert "symbolic link" in sup.reason
