"""Adopting a live run (agent restart or upgrade) must not re-read the run's whole log before READY=1.

`Run.adopt` caught the phase tracker up from offset 0, keeping every line of the log in one list: a run that had
served for weeks (504 MB of uvicorn access lines and stats lines) took 189 s and ~1 GB of RSS on the event loop,
before the agent told systemd READY=1, so systemd killed the agent at TimeoutStartSec, five times, and the model
was left unsupervised. A ready run's start-up phases are over (nothing to catch up); a loading run's current phase
is in the log's tail. Both are bounded in memory here, on a 64 MiB log (a day at ~10 req/s)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from lynxtop.agent.serving import launcher
from lynxtop.agent.serving.run import Run

pytestmark = pytest.mark.timeout(120)

ACCESS = b'INFO:     10.0.0.1:55555 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
STATS = (b"INFO 12-06 09:00:00 [loggers.py:123] Engine 000: Avg prompt throughput: 1234.5 tokens/s, Avg generation "
         b"throughput: 567.8 tokens/s, Running: 12 reqs, Waiting: 0 reqs, GPU KV cache usage: 23.4%\n")
LOG_BYTES = 64 * 1024 * 1024
PEAK_LIMIT = 16 * 1024 * 1024  # a quarter of the log: reading it all kept several times its size


def _append_noise(log: Path, nbytes: int = LOG_BYTES) -> None:
    block = (ACCESS * 50 + STATS) * 2000
    with open(log, "ab") as f:
        for _ in range(nbytes // len(block) + 1):
            f.write(block)


def _append(log: Path, text: str) -> None:
    with open(log, "a") as f:
        f.write(text)


@pytest.fixture
def live_proc(tmp_path):
    """A real process standing in for the server a previous agent left; its log is written by the test."""
    proc = launcher.spawn(["sleep", "60"], tmp_path / "logs" / "run.log", {}, "alpha", run_id=7)
    yield proc
    proc.popen.kill()
    proc.popen.wait(5)
    proc.close()


def _adopt_measured(proc: launcher.ServerProcess) -> tuple[Run, int]:
    tracemalloc.start()
    try:
        run = Run.adopt(proc, proc.record, 600.0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return run, peak


async def test_adopting_a_ready_run_does_not_catch_up_on_its_long_log(live_proc):
    log = Path(live_proc.record.log_path)
    _append(log, "INFO Loading weights took 600.0 seconds\nINFO:     Application startup complete.\n")
    _append_noise(log)
    live_proc.record.ready_ms = live_proc.record.started_ms + 1000  # ready under the previous agent

    run, peak = _adopt_measured(live_proc)

    assert peak < PEAK_LIMIT, f"adopting kept {peak / 2**20:.0f} MiB of a 64 MiB log in memory"
    assert run.tracker.offset == log.stat().st_size, "a ready run's start-up phases are over: start at the end"
    assert run.tracker.phase == "api up"
    # what the server writes from now on is still read, and only that
    _append(log, "INFO Loading weights took 1.0 seconds\n")
    assert run.new_phases() == []
    assert run.tracker.offset == log.stat().st_size


async def test_adopting_a_loading_run_gets_its_phase_from_the_tail_of_a_long_log(live_proc):
    log = Path(live_proc.record.log_path)
    _append(log, "INFO Starting to load model /models/big\n")
    _append_noise(log)  # e.g. a warning printed per shard, for hours
    _append(log, "INFO Loading weights took 600.0 seconds\nINFO Available KV cache memory: 10.0 GiB\n")
    assert live_proc.record.ready_ms is None  # still loading when the previous agent went away

    run, peak = _adopt_measured(live_proc)

    assert peak < PEAK_LIMIT, f"adopting kept {peak / 2**20:.0f} MiB of a 64 MiB log in memory"
    assert run.tracker.phase == "cuda graphs"  # KV cache sized: graph capture under way
    assert run.ready_deadline_ms is not None
    # the phases still to come are reported as the server prints them
    _append(log, "INFO Starting vLLM API server 0 on http://127.0.0.1:8000\n")
    assert [m.phase for m in run.new_phases()] == ["api up"]
