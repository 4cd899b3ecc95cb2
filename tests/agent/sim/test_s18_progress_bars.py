"""The simulator's load prints vLLM's checkpoint-shard progress bar (session 18), and dies of a full disk as vLLM
does: its log lines go through `logging`, which swallows a failed write, but tqdm re-raises the OSError, so a log
file system that fills during the load ends it with exit 1. Without this the simulator survived what kills real
vLLM, and nothing the agent does against a full disk during a load could be tested."""

from __future__ import annotations

import contextlib
import os
import re
import signal
from pathlib import Path

import pytest
from support.small_fs import fill, mounted
from support.waits import wait_for

from lynxtop.agent.serving import launcher
from lynxtop.agent.serving.startup import PhaseTracker

# vLLM's bar_format: "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]\n"
BAR = re.compile(r"\rLoading safetensors checkpoint shards: +(\d+)% Completed \| (\d+)/(\d+) "
                 r"\[\d\d:\d\d<(?:\d\d:\d\d|\?), (?:\?|[ \d.]+)(?:it/s|s/it)\]\n")


def test_the_load_prints_the_checkpoint_shard_bar_from_0_to_100_between_vllms_load_lines(start_sim):
    sp = start_sim(startup=2.0)
    sp.wait_ready()
    text = sp.log_path.read_bytes().decode()  # as written: read_text() would turn the bar's \r into \n
    bars = [(int(p), int(n), int(t)) for p, n, t in BAR.findall(text)]
    assert bars, text
    total = bars[0][2]
    assert total == 60  # DeepSeek-V4.1's 296 GB in shards of ~5 GB
    assert bars[0] == (0, 0, total) and bars[-1] == (100, total, total), bars
    assert [n for _, n, _ in bars] == sorted(n for _, n, _ in bars), bars
    assert all(t == total and p == round(100 * n / total) for p, n, t in bars), bars
    # tqdm's close leaves an empty line after the bar, as in a real vLLM log
    assert re.search(rf"\| {total}/{total} \[[^\n]*\]\n\n\(EngineCore", text), text
    first = text.index("Loading safetensors checkpoint shards")
    assert text.index("Starting to load model") < first < text.rindex("Loading safetensors") < \
        text.index("Loading weights took"), text
    assert "Application startup complete." in text


def test_no_use_tqdm_on_load_prints_no_bar(start_sim):
    sp = start_sim("--no-use-tqdm-on-load", startup=1.0)
    sp.wait_ready()
    assert "checkpoint shards" not in sp.text()


def test_the_phase_tracker_reads_the_bars_as_the_weight_load(start_sim):
    sp = start_sim(startup=1.0)
    sp.wait_ready()
    tracker = PhaseTracker(sp.log_path, started_ms=0)
    tracker.poll(1)
    assert [m.phase for m in tracker.marks] == ["loading weights", "kv cache", "cuda graphs", "api up"]


def fill_last_block(log: Path) -> None:
    """Append one line that ends at the log's last block boundary: once the disk is full, the log's next write
    needs a new block (a short log would otherwise take a whole load's bar into its last block's slack)."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    try:
        st = os.fstat(fd)
        n = -st.st_size % st.st_blksize
        if n:
            os.write(fd, b"#" * (n - 1) + b"\n")
    finally:
        os.close(fd)


@pytest.fixture
def small_fs(tmp_path):
    with mounted(tmp_path / "small", "8m") as mnt:
        yield mnt


@pytest.mark.timeout(90)
def test_a_log_disk_that_fills_during_the_load_kills_it_with_exit_1(kit, sim_argv0, small_fs, tmp_path):
    log = small_fs / "run.log"
    argv = [*sim_argv0, "serve", kit.MODEL, "--port", str(kit.free_port()), "-tp", "8", "--max-model-len", "32768",
            "--sim-startup-seconds", "8", "--sim-state-dir", str(tmp_path / "simstate"), "--no-sim-workers"]
    proc = launcher.spawn(argv, log, {}, "v4")  # as the agent starts vLLM: the log O_APPEND, its own session
    try:
        wait_for(lambda: b"checkpoint shards:   0%" in log.read_bytes(), 30, what="the bar's first line")
        fill(small_fs)
        fill_last_block(log)
        assert proc.popen.wait(30) == 1
        text = log.read_bytes()
        assert b"Application startup complete." not in text and b"100% Completed" not in text
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.popen.wait(5)
