"""The current run's log is capped (session 17): vLLM writes to it O_APPEND for weeks (uvicorn's access line per
request, the 10 s stats line: 0.2-0.4 GB a day), on the disk that holds the history and serving.json. Past
`[agent] run_log_max_mb` the agent keeps the log's most recent part as `<log>.1` and truncates the log
(copy-truncate: the writer keeps its descriptor, its next O_APPEND write lands at the new end). Real processes
(launcher.spawn), real files, a real LogTail follower and PhaseTracker."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lynxtop.agent.api.logtail import LogTail
from lynxtop.agent.serving import launcher, logcap
from lynxtop.agent.serving.startup import PhaseTracker

pytestmark = pytest.mark.timeout(90)

MB = 1 << 20
LINE = re.compile(rb"^line (\d{9}) x+$")
# a vLLM-like writer: one write() per line (as a line-buffered logger does), ~2 MB/s, until killed
WRITER = r"""
import os, time
i = 0
while True:
    for _ in range(200):
        os.write(1, b"line %09d " % i + b"x" * 86 + b"\n")
        i += 1
    time.sleep(0.01)
"""


def _numbers(data: bytes) -> list[int]:
    """The line numbers of `data`, each line checked whole (a cut line fails the match)."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out = []
    for ln in lines:
        m = LINE.match(ln)
        assert m, f"not a whole line: {ln[:60]!r}"
        out.append(int(m.group(1)))
    return out


@pytest.fixture
def writer(tmp_path):
    log_path = tmp_path / "logs" / "20260101T000000Z_v4_0123abcd.log"
    proc = launcher.spawn([sys.executable, "-c", WRITER], log_path, {}, "v4")
    yield proc, log_path
    proc.popen.kill()
    proc.popen.wait(5)


def _wait_size(path: Path, size: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while path.stat().st_size < size:
        assert time.monotonic() < deadline, f"{path} did not reach {size} bytes"
        time.sleep(0.02)


async def test_a_live_writers_log_is_capped_and_it_keeps_writing(writer, monkeypatch):
    proc, log_path = writer
    monkeypatch.setattr(logcap, "CHECK_EVERY_S", 0.1)
    task = asyncio.create_task(logcap.keep_capped(str(log_path), lambda: 1, lambda: proc.popen.poll() is None))
    rotated = Path(str(log_path) + ".1")
    biggest = 0
    try:
        deadline = time.monotonic() + 30
        while not rotated.exists():
            assert time.monotonic() < deadline, "the log was never capped"
            biggest = max(biggest, log_path.stat().st_size)
            await asyncio.sleep(0.02)
        kept = rotated.read_bytes()
        size_after = log_path.stat().st_size
        await asyncio.sleep(0.5)
        later = log_path.read_bytes()
        for _ in range(40):  # a few more rounds: the log stays bounded
            biggest = max(biggest, log_path.stat().st_size)
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
    assert proc.popen.poll() is None, "the writer died"
    assert 0 < len(kept) <= MB // 2, len(kept)
    in_kept = _numbers(kept)  # starts at a line boundary, whole lines
    assert in_kept == list(range(in_kept[0], in_kept[0] + len(in_kept))), "the kept part is not the log's tail"
    assert size_after < MB, size_after
    assert biggest <= 2 * MB, f"the log grew to {biggest} bytes past a 1 MiB cap"
    in_log = _numbers(later)  # the writer's next writes landed at the new end: no hole of zeros, whole lines
    assert in_log and in_log[0] > in_kept[-1] and len(in_log) > 10, "the writer does not write to the log any more"


def test_a_follower_and_the_phase_tracker_go_on_after_a_cap(writer):
    proc, log_path = writer
    _wait_size(log_path, MB // 4)
    tracker = PhaseTracker(log_path, started_ms=0)
    assert tracker.poll(1) == []
    tail = LogTail(str(log_path), 1000, 4 * MB)
    tail.locate()
    after, inode = tail.next, tail.inode
    _wait_size(log_path, MB + 1)
    capped = logcap.cap(log_path, MB)
    assert capped is not None and capped.error is None and capped.kept > 0
    assert capped.kept <= MB // 2 and Path(str(log_path) + ".1").stat().st_size == capped.kept
    assert log_path.stat().st_size < MB // 2
    # vLLM goes on loading after the truncate: its next milestone is in the new, short file
    with open(log_path, "ab") as f:
        f.write(b"INFO Loading weights took 3.1 seconds\n")
    assert [m.phase for m in tracker.poll(2)] == ["kv cache"], "the tracker missed a line written after the cap"
    tail = LogTail(str(log_path), 100_000, 4 * MB)
    tail.follow(after, inode)
    assert tail.reset == "truncated"
    lines = json.loads("[" + "".join(tail.reader()) + "]")
    assert "INFO Loading weights took 3.1 seconds" in lines
    _wait_size(log_path, tail.next + 2000)
    again = LogTail(str(log_path), 100_000, 4 * MB)
    again.follow(tail.next, tail.inode)  # and it follows on, from where it was in the new file
    assert again.reset is None
    new = json.loads("[" + "".join(again.reader()) + "]")
    assert new and all(LINE.match(s.encode()) for s in new)


def test_under_the_cap_or_off_nothing_happens(tmp_path):
    log_path = tmp_path / "run.log"
    log_path.write_bytes(b"a line\n" * 1000)
    assert logcap.cap(log_path, 1 * MB) is None
    assert logcap.cap(log_path, 0) is None  # run_log_max_mb = 0: no cap
    assert logcap.cap(tmp_path / "gone.log", 1) is None
    assert log_path.stat().st_size == 7000 and not Path(str(log_path) + ".1").exists()


def test_a_single_huge_line_is_not_copied_whole(tmp_path):
    """The copy is bounded: no line boundary in the last max/2 bytes, nothing kept (the log is emptied anyway)."""
    log_path = tmp_path / "run.log"
    log_path.write_bytes(b"x" * (3 * MB))
    capped = logcap.cap(log_path, MB)
    assert capped is not None and capped.kept == 0 and log_path.stat().st_size == 0
    assert Path(str(log_path) + ".1").stat().st_size == 0


def test_prune_logs_counts_a_kept_part_with_its_log(tmp_path):
    d = tmp_path / "logs"
    d.mkdir()
    logs = []
    for i in range(5):
        p = d / f"2026010{i}T000000Z_v4_{i:08x}.log"
        p.write_text("x\n")
        Path(str(p) + ".1").write_text("old\n")
        os.utime(p, (1000 + i, 1000 + i))
        os.utime(str(p) + ".1", (1000 + i, 1000 + i))
        logs.append(p)
    assert launcher.prune_logs(d, 5) == []  # five runs, five logs: a .1 is not a sixth
    removed = launcher.prune_logs(d, 2, protect={str(logs[0])})
    assert sorted(removed) == sorted([logs[1], logs[2]])
    left = sorted(p.name for p in d.iterdir())
    assert left == sorted(n for p in (logs[0], logs[3], logs[4]) for n in (p.name, p.name + ".1"))


async def test_the_supervisor_caps_its_runs_log(make_sup, h, tmp_path, monkeypatch):
    """Wired in: a run of the stand-in vLLM whose log passes run_log_max_mb is capped while it serves."""
    monkeypatch.setattr(logcap, "CHECK_EVERY_S", 0.1)
    sup = make_sup(agent="run_log_max_mb = 1")
    await sup.start("alpha", by="test")
    await h.wait_for(lambda: sup.state == "ready" and sup.action is None, 15, what="alpha ready")
    log_path = Path(sup.proc.record.log_path)
    with open(log_path, "ab") as f:  # as vLLM appends: uvicorn's access lines
        f.write(b'INFO: 10.0.0.1:5555 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n' * (2 * MB // 66))
    await h.wait_for(lambda: Path(str(log_path) + ".1").exists(), 10, what="the run's log capped")
    assert log_path.stat().st_size < MB and sup.state == "ready"


@pytest.mark.parametrize("value", ["-1", "\"lots\"", "1.5", "true"])
def test_a_bad_run_log_max_mb_is_named_by_config_check(h, tmp_path, value):
    cfg = h.write_config(tmp_path, agent=f"run_log_max_mb = {value}")
    out = subprocess.run([sys.executable, "-m", "lynxtop", "config", "check", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=60)
    said = out.stdout + out.stderr
    assert out.returncode != 0 and "agent.run_log_max_mb" in said, out
    assert "expected an integer" in said or "out of range" in said, said


def test_a_good_run_log_max_mb_passes_config_check(h, tmp_path):
    cfg = h.write_config(tmp_path, agent="run_log_max_mb = 64")
    out = subprocess.run([sys.executable, "-m", "lynxtop", "config", "check", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "run_log_max_mb = 64" in out.stdout, out


def test_run_log_max_mb_default_and_zero(h, tmp_path):
    from lynxtop.contract.config import load_config

    assert load_config(str(h.write_config(tmp_path))).agent.run_log_max_mb == 512
    assert load_config(str(h.write_config(tmp_path, agent="run_log_max_mb = 0"))).agent.run_log_max_mb == 0
