"""The run log's disk reserve (session 18, agent/serving/logreserve.py): blocks allocated past the log's end
(fallocate KEEP_SIZE) take vLLM's writes when the disk is full; topped up below half, made again after logcap's
truncate, given back when the run ends (the stop, or the cleanup of a run that ended while the agent was down),
off at 0, skipped where the file system has no fallocate. And logcap's truncate keeps the line naming the run's
`vllm_dist_*` rendezvous file, which runfiles reads from the log's start when the run ends.

Real files (tmp_path, ext4 here), a real tmpfs filled to the last byte (root, as in CI), real processes."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.small_fs import fill, mounted

from lynxtop.agent.serving import launcher, logcap, logreserve, runfiles
from lynxtop.contract.config import load_config

pytestmark = pytest.mark.timeout(90)

MB = 1 << 20
BLOCK = 4096


def _left(path: Path) -> int:
    st = os.stat(path)
    return st.st_blocks * 512 - st.st_size


def _append(path: Path, nbytes: int) -> None:
    """`nbytes` of whole lines, one write each, O_APPEND (as vLLM writes its log)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        line = b"x" * 99 + b"\n"
        for _ in range(nbytes // len(line)):
            os.write(fd, line)
    finally:
        os.close(fd)


def _fill_last_block(path: Path) -> None:
    """Append up to the log's last block boundary: its next write needs a block of its own."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        st = os.fstat(fd)
        if n := -st.st_size % st.st_blksize:
            os.write(fd, b"#" * (n - 1) + b"\n")
    finally:
        os.close(fd)


@pytest.fixture
def log(tmp_path) -> Path:
    p = tmp_path / "logs" / "20260101T000000Z_v4_0123abcd.log"
    p.parent.mkdir()
    p.write_bytes(b"INFO starting\n" * 100)
    return p


@pytest.fixture
def small_fs(tmp_path):
    with mounted(tmp_path / "small", "4m") as mnt:
        yield mnt


# ------------------------------------------------------------------------------- made, used, topped up


def test_the_reserve_is_allocated_past_the_end_without_changing_the_log(log):
    before = log.read_bytes()
    assert logreserve.Keeper(str(log)).check(MB) >= MB - BLOCK
    assert log.read_bytes() == before  # the size and the bytes the readers see are unchanged
    assert _left(log) >= MB


def test_appends_into_the_reserve_succeed_on_a_full_tmpfs_and_only_as_far_as_it_goes(small_fs):
    log = small_fs / "run.log"
    log.write_bytes(b"INFO starting\n")
    assert logreserve.reserve(log, MB) > 0
    fill(small_fs)
    _fill_last_block(log)
    _append(log, MB - 2 * BLOCK)  # the reserve takes them: the writer would have died of ENOSPC
    with pytest.raises(OSError) as exc:
        _append(log, 2 * MB)
    assert exc.value.errno == errno.ENOSPC


def test_the_reserve_is_topped_up_only_once_less_than_half_is_left(log):
    keeper = logreserve.Keeper(str(log))
    keeper.check(MB)
    _append(log, 300 * 1024)
    assert keeper.check(MB) == 0  # more than half left: an fstat, nothing else
    _append(log, 300 * 1024)
    assert _left(log) < MB // 2
    assert keeper.check(MB) > 0
    assert _left(log) >= MB


async def test_the_watch_makes_the_reserve_at_once_and_keeps_it(log, monkeypatch):
    monkeypatch.setattr(logreserve, "CHECK_EVERY_S", 0.05)
    task = asyncio.create_task(logreserve.keep_reserved(str(log), lambda: 1, lambda: True))
    try:
        await _until(lambda: _left(log) >= MB, "the reserve made")
        _append(log, 800 * 1024)
        assert _left(log) < MB // 2
        await _until(lambda: _left(log) >= MB, "the reserve topped up")
    finally:
        task.cancel()


async def _until(pred, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


async def test_zero_is_off(log, monkeypatch):
    monkeypatch.setattr(logreserve, "CHECK_EVERY_S", 0.02)
    task = asyncio.create_task(logreserve.keep_reserved(str(log), lambda: 0, lambda: True))
    await asyncio.sleep(0.3)
    task.cancel()
    assert _left(log) < BLOCK
    _append(log, 2 * MB)
    assert logcap.cap(log, MB, 0) is not None and _left(log) < BLOCK


# ------------------------------------------------------------------------------- a full disk, no fallocate


def test_a_top_up_on_a_full_disk_fails_quietly_once_per_episode_and_takes_no_block(small_fs, caplog):
    log = small_fs / "run.log"
    log.write_bytes(b"INFO starting\n")
    filler = fill(small_fs)
    filler.write_bytes(filler.read_bytes()[:-3 * BLOCK])  # a few blocks free: a fallocate could take them
    free = os.statvfs(small_fs).f_bfree
    keeper = logreserve.Keeper(str(log))
    with caplog.at_level(logging.INFO, logger="lynxtop.agent.serving.logreserve"):
        for _ in range(5):
            assert keeper.check(MB) == 0
        assert os.statvfs(small_fs).f_bfree == free  # a reserve that cannot be whole takes nothing
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 1 and "cannot top up" in said[0] and str(log) in said[0], said
        assert "No space left on device" in said[0], said
        filler.unlink()  # space returns: the next check makes it, and says so once
        assert keeper.check(MB) > 0 and _left(log) >= MB
        assert keeper.check(MB) == 0
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 2 and "has its disk reserve again" in said[1], said


async def test_a_file_system_without_fallocate_runs_without_a_reserve_said_once(log, monkeypatch, caplog):
    calls = []

    def no_fallocate(*args):
        calls.append(args)
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(logreserve, "fallocate", no_fallocate)
    monkeypatch.setattr(logreserve, "CHECK_EVERY_S", 0.02)
    with caplog.at_level(logging.WARNING, logger="lynxtop.agent.serving.logreserve"):
        await asyncio.wait_for(logreserve.keep_reserved(str(log), lambda: 1, lambda: True), 5)  # it gives up
    assert len(calls) == 1
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "no fallocate" in said[0], said
    _append(log, 2 * MB)
    capped = logcap.cap(log, MB, MB)  # the cap goes on without it
    assert capped is not None and capped.kept > 0 and "disk reserve" in (capped.error or "")


# ------------------------------------------------------------------------------- logcap's truncate


def test_a_cap_makes_the_reserve_again_and_keeps_the_rendezvous_files_line(log, tmp_path):
    dist = tmp_path / "vllm_dist_0123456789abcdef0123456789abcdef"
    log.write_bytes(b"(Worker pid=7) INFO [parallel_state.py] world_size=1 rank=0 local_rank=0 "
                    b"distributed_init_method=file://" + str(dist).encode() + b" backend=gloo\n")
    logreserve.reserve(log, MB)
    _append(log, 3 * MB)
    capped = logcap.cap(log, 2 * MB, MB)
    assert capped is not None and capped.error is None, capped
    assert runfiles.dist_files_in_log(log) == {str(dist)}  # still named at the log's start
    assert log.read_bytes().startswith(b"[lynxtop] kept from the start of this log when it was capped: ")
    assert log.stat().st_size < 1024 and _left(log) >= MB
    _append(log, 3 * MB)  # a second cap keeps it again (from the line the first one wrote)
    assert logcap.cap(log, 2 * MB, MB) is not None
    assert runfiles.dist_files_in_log(log) == {str(dist)}


async def test_the_runs_log_upkeep_makes_the_reserve_again_right_after_each_cap(log, monkeypatch):
    """logcap.look_after, as the lifecycle runs it: the keeper's next check is an hour away, so only the cap's own
    re-reserve can have put the reserve back after the truncate."""
    monkeypatch.setattr(logcap, "CHECK_EVERY_S", 0.05)
    monkeypatch.setattr(logreserve, "CHECK_EVERY_S", 3600)

    class Agent:
        run_log_max_mb, run_log_reserve_mb = 2, 1

    task = asyncio.create_task(logcap.look_after(str(log), lambda: Agent, lambda: True))
    try:
        await _until(lambda: _left(log) >= MB, "the reserve made at once")
        for _ in range(2):
            _append(log, 3 * MB)  # past the cap; the reserve used up
            assert _left(log) < MB // 2
            await _until(lambda: log.stat().st_size < MB, "the cap")
            # within 30 s, the keeper's check an hour away: the cap's own re-reserve (2 s: short on a loaded machine)
            await _until(lambda: _left(log) >= MB, "the reserve made again after the truncate")
    finally:
        task.cancel()
    assert logcap.kept_path(log).exists()


# ------------------------------------------------------------------------------- given back at the run's end

DIST_THEN_SLEEP = """
import sys, time
print("INFO distributed_init_method=file://" + sys.argv[1] + " backend=gloo", flush=True)
time.sleep(600)
"""


@pytest.fixture
def run(tmp_path):
    dist = tmp_path / "vllm_dist_fedcba9876543210fedcba9876543210"
    dist.write_text("rendezvous")
    proc = launcher.spawn([sys.executable, "-c", DIST_THEN_SLEEP, str(dist)], tmp_path / "logs" / "run.log",
                          {}, "v4")
    log = Path(proc.record.log_path)
    deadline = time.monotonic() + 20
    while b"distributed_init_method" not in log.read_bytes():
        assert time.monotonic() < deadline, "the run never wrote its start-up line"
        time.sleep(0.02)
    yield proc, log, dist
    if proc.popen.poll() is None:
        proc.popen.kill()
        proc.popen.wait(5)


async def test_a_stopped_run_gives_its_reserve_back_and_removes_its_rendezvous_file_after_a_cap(run):
    proc, log, dist = run
    logreserve.reserve(log, MB)
    _append(log, 3 * MB)
    assert logcap.cap(log, 2 * MB, MB) is not None  # the start-up line is gone from the log
    assert _left(log) >= MB
    res = await proc.stop(5.0)
    assert not res.survivors
    assert str(dist) in res.removed and not dist.exists(), res  # it stayed in /tmp before the fix
    assert _left(log) < BLOCK, "the ended run's log kept its reserve"


async def test_a_run_that_ended_while_the_agent_was_down_gives_its_reserve_back_when_cleaned_up(run):
    """The adopting agent finds the recorded server gone (adoption's `_not_adopted`): kill_leftovers cleans up."""
    proc, log, dist = run
    logreserve.reserve(log, MB)
    proc.popen.kill()
    proc.popen.wait(5)
    res = await launcher.kill_leftovers(proc.record)
    assert not res.survivors and not dist.exists()
    assert _left(log) < BLOCK, "the log of a run that ended unseen kept its reserve"


def test_release_frees_the_blocks_on_a_tmpfs_too(small_fs):
    log = small_fs / "run.log"
    log.write_bytes(b"INFO starting\n")
    free = os.statvfs(small_fs).f_bfree
    logreserve.reserve(log, MB)
    os.utime(log, ns=(1_000_000_000, 2_000_000_000))
    assert os.statvfs(small_fs).f_bfree <= free - MB // BLOCK
    assert logreserve.release(log) >= MB
    assert os.statvfs(small_fs).f_bfree == free and log.read_bytes() == b"INFO starting\n"
    assert log.stat().st_mtime_ns == 2_000_000_000  # the log's age, which retention goes by, is its own
    assert logreserve.release(log) == 0 and logreserve.release(small_fs / "gone.log") == 0


# ------------------------------------------------------------------------------- the config key


@pytest.mark.parametrize("value", ["-1", "\"lots\"", "1.5", "true", "1048577"])
def test_a_bad_run_log_reserve_mb_is_named_by_config_check(h, tmp_path, value):
    cfg = h.write_config(tmp_path, agent=f"run_log_reserve_mb = {value}")
    out = subprocess.run([sys.executable, "-m", "lynxtop", "config", "check", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=60)
    said = out.stdout + out.stderr
    assert out.returncode != 0 and "agent.run_log_reserve_mb" in said, out
    assert "expected an integer" in said or "out of range" in said, said


def test_a_good_run_log_reserve_mb_passes_config_check_and_the_default_is_64(h, tmp_path):
    cfg = h.write_config(tmp_path, agent="run_log_reserve_mb = 16")
    out = subprocess.run([sys.executable, "-m", "lynxtop", "config", "check", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "run_log_reserve_mb = 16" in out.stdout, out
    assert load_config(str(h.write_config(tmp_path))).agent.run_log_reserve_mb == 64
    assert load_config(str(h.write_config(tmp_path, agent="run_log_reserve_mb = 0"))).agent.run_log_reserve_mb == 0
