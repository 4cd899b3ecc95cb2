"""Ended runs' logs are bounded in bytes too (session 21): before, `<log_dir>` kept the newest 200 run logs
whatever their size, and each (with its `.1`) may reach `run_log_max_mb` x 1.5 = 768 MB by default: 150 GB
on the database's file system after months of restarts. `[agent] run_logs_max_total_mb` (default 10240) is the
most the run logs may hold together; launcher.prune_logs drops the oldest ended ones (with their `.1`) until
count and bytes fit, never the current run's log, never a symlink or a file that is not a run log.

Real files with real blocks (a disk budget counts what the disk holds: st_blocks, and never less than the
file's length), the real `lynxtop config check`, and the real supervisor's launch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lynxtop.agent.serving import launcher, logreserve
from lynxtop.contract.config import AgentConfig, load_config

pytestmark = pytest.mark.timeout(90)

MB = 1 << 20


def _write(path: Path, nbytes: int, mtime: int) -> Path:
    """A file of `nbytes` real (allocated) bytes, its mtime set."""
    with open(path, "wb") as f:
        f.write(b"x" * nbytes)
    os.utime(path, (mtime, mtime))
    return path


def _runs(d: Path, n: int, log_bytes: int, part_bytes: int = 0) -> list[Path]:
    """`n` ended runs' logs, oldest first, each with a `.1` of `part_bytes` if any."""
    logs = []
    for i in range(n):
        log = _write(d / f"20260{i:03d}T000000Z_v4_{i:08x}.log", log_bytes, 1_700_000_000 + i)
        if part_bytes:
            _write(Path(f"{log}.1"), part_bytes, 1_700_000_000 + i)
        logs.append(log)
    return logs


def _held(d: Path) -> int:
    return sum(launcher.log_bytes(p.lstat()) for p in d.iterdir())


def test_the_oldest_ended_logs_go_until_the_bytes_fit(tmp_path):
    logs = _runs(tmp_path, 8, MB, MB // 2)  # 1.5 MiB a run, 12 MiB in all
    current = logs[0]  # the oldest file is the current run's (an adopted run that served for months)
    removed = launcher.prune_logs(tmp_path, 200, protect={str(current)}, max_bytes=6 * MB)
    # the current run's 1.5 MiB counts but stays; the newest ended runs that fit beside it are kept: 3 of them
    assert sorted(removed) == logs[1:5], removed
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(n for p in (current, *logs[5:]) for n in (p.name, p.name + ".1")), left
    assert _held(tmp_path) <= 6 * MB
    assert launcher.prune_logs(tmp_path, 200, protect={str(current)}, max_bytes=6 * MB) == []  # it fits now


def test_a_kept_part_whose_log_is_gone_counts_and_goes(tmp_path):
    logs = _runs(tmp_path, 3, MB)
    orphan = _write(tmp_path / "20250101T000000Z_v4_0000000a.log.1", 2 * MB, 1_600_000_000)  # oldest
    removed = launcher.prune_logs(tmp_path, 200, max_bytes=3 * MB)
    assert removed == [tmp_path / "20250101T000000Z_v4_0000000a.log"] and not orphan.exists()
    assert all(p.exists() for p in logs)


def test_count_and_bytes_both_apply(tmp_path):
    logs = _runs(tmp_path, 6, 64 * 1024)
    assert sorted(launcher.prune_logs(tmp_path, 4, max_bytes=100 * MB)) == logs[:2]  # the count binds
    assert sorted(launcher.prune_logs(tmp_path, 4, max_bytes=0)) == []  # 0: no byte bound, count only
    assert sorted(launcher.prune_logs(tmp_path, 200, max_bytes=3 * 64 * 1024)) == logs[2:3]  # the bytes bind


def test_the_current_log_alone_over_the_budget_stays(tmp_path):
    logs = _runs(tmp_path, 3, MB)
    removed = launcher.prune_logs(tmp_path, 200, protect={str(logs[2])}, max_bytes=MB // 2)
    assert sorted(removed) == logs[:2] and logs[2].exists()


def test_blocks_held_past_the_end_count(tmp_path):
    """A reserve left past a log's end (an agent killed before it gave it back) fills the disk: it counts."""
    logs = _runs(tmp_path, 3, 4096)
    try:
        got = logreserve.reserve(logs[0], 4 * MB)
    except OSError as exc:
        pytest.skip(f"no fallocate here: {exc}")
    if got < 4 * MB:
        pytest.skip("the file system kept no reserve")
    os.utime(logs[0], (1_700_000_000, 1_700_000_000))  # fallocate touched it: the oldest again
    assert logs[0].stat().st_size == 4096
    assert launcher.prune_logs(tmp_path, 200, max_bytes=2 * MB) == [logs[0]]
    assert logs[1].exists() and logs[2].exists()


def test_a_sparse_log_counts_its_length(tmp_path):
    """A log's length is what a copy or backup of it takes: a sparse one is not free (the auditor's case)."""
    logs = _runs(tmp_path, 3, 4096)
    with open(logs[0], "r+b") as f:
        f.truncate(64 * MB)
    os.utime(logs[0], (1_700_000_000, 1_700_000_000))
    assert launcher.prune_logs(tmp_path, 200, max_bytes=MB) == [logs[0]]


def test_symlinks_and_other_files_are_neither_counted_nor_removed(tmp_path):
    d = tmp_path / "logs"
    d.mkdir()
    outside = _write(tmp_path / "elsewhere.log", 4 * MB, 1_500_000_000)
    link = d / "20240101T000000Z_v4_deadbeef.log"
    link.symlink_to(outside)  # old, and its target big: neither followed nor removed
    part_link = d / "20240101T000000Z_v4_feedface.log.1"
    part_link.symlink_to(outside)
    other = _write(d / "notes.txt", 4 * MB, 1_500_000_000)
    logs = _runs(d, 2, MB)
    assert launcher.prune_logs(d, 200, max_bytes=3 * MB) == []  # 2 MiB of run logs: they fit
    assert outside.exists() and link.is_symlink() and part_link.is_symlink() and other.exists()
    assert all(p.exists() for p in logs)


def test_the_default_budget_bounds_the_auditors_case(tmp_path):
    """Sparse stand-ins of 210 capped runs (the auditor's scratch test) under the default budget."""
    default = AgentConfig.__dataclass_fields__["run_logs_max_total_mb"].default
    cap = AgentConfig.__dataclass_fields__["run_log_max_mb"].default * MB
    assert 1024 <= default <= 16 * 1024
    for i in range(210):
        log = tmp_path / f"2026{i:06d}_p_{i:08x}.log"
        with open(log, "wb") as f:
            f.truncate(cap)
        with open(f"{log}.1", "wb") as f:
            f.truncate(cap // 2)
        os.utime(log, (1_700_000_000 + i, 1_700_000_000 + i))
    launcher.prune_logs(tmp_path, 200, max_bytes=default * MB)
    assert _held(tmp_path) <= default * MB
    names = {p.name for p in tmp_path.iterdir()}
    assert "2026000209_p_000000d1.log" in names and "2026000000_p_00000000.log" not in names  # newest kept


async def test_a_launch_prunes_by_the_configured_budget(make_sup, h, tmp_path):
    """Wired in: the supervisor's launch passes `[agent] run_logs_max_total_mb`."""
    sup = make_sup(agent="run_logs_max_total_mb = 2")
    d = tmp_path / "state" / "logs"  # the default log_dir: <database dir>/logs
    d.mkdir(parents=True, exist_ok=True)
    old = _runs(d, 4, MB)  # 4 MiB of ended runs; 2 MiB allowed
    await sup.start("alpha", by="test")
    await h.wait_for(lambda: sup.state == "ready" and sup.action is None, 30, what="alpha ready")
    assert not old[0].exists() and not old[1].exists()  # pruned before the new run's log is made
    assert old[2].exists() and old[3].exists() and Path(sup.proc.record.log_path).exists()


@pytest.mark.parametrize(("value", "why"), [("-1", "out of range"), ("1.5", "expected an integer"),
                                            ("\"10G\"", "expected an integer"), ("16777217", "out of range")])
def test_a_bad_budget_is_named_by_config_check(h, tmp_path, value, why):
    cfg = h.write_config(tmp_path, agent=f"run_logs_max_total_mb = {value}")
    out = subprocess.run([sys.executable, "-m", "lynxtop", "config", "check", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=60)
    said = out.stdout + out.stderr
    assert out.returncode != 0 and "agent.run_logs_max_total_mb" in said and why in said, out


def test_the_budget_default_and_zero(h, tmp_path):
    assert load_config(str(h.write_config(tmp_path))).agent.run_logs_max_total_mb == 10240
    cfg = h.write_config(tmp_path, agent="run_logs_max_total_mb = 0")
    assert load_config(str(cfg)).agent.run_logs_max_total_mb == 0
    out = subprocess.run([sys.executable, "-m", "lynxtop", "config", "check", "--config",
                          str(h.write_config(tmp_path, agent="run_logs_max_total_mb = 2048"))],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "run_logs_max_total_mb = 2048" in out.stdout, out
