"""One executor hand-off per tick (agent/sampling.py): the host row and the GPU sample run as one job, so a tick at
10 Hz pays one `asyncio.to_thread`, not two (issue 29.3: the two hand-offs weighed twice the sampling itself);
every tick still carries its host and GPU rows, and a GPU sample still running never holds the host back."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from support.node import close_node, open_node, run_clock
from support.waits import wait_for_async

pytestmark = pytest.mark.timeout(90)


def _count_hops(monkeypatch) -> list[int]:
    """asyncio.to_thread counted (the seam every executor hand-off of the tick goes through)."""
    hops = [0]
    real = asyncio.to_thread

    async def counting(func, /, *args, **kwargs):
        hops[0] += 1
        return await real(func, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counting)
    return hops


def _distinct(h, node, table: str) -> int:
    node.writer.flush()
    return h.db_rows(node.writer.path, f"SELECT count(DISTINCT ts_ms) AS n FROM {table}")[0]["n"]


async def test_a_tick_at_10_hz_hands_off_once_and_keeps_its_host_and_gpu_rows(tmp_path, h, monkeypatch):
    node = open_node(h.write_config(tmp_path, 'sample_interval_s = 0.1\nfake_nvml = "h200x8"'))
    hops = _count_hops(monkeypatch)
    try:
        await run_clock(node, 3.0)
        t = node.ticker
        assert t.ticks >= 15 and t.failed_ticks == 0, (t.ticks, t.missed_ticks, t.last_tick_error)
        assert hops[0] <= t.ticks + 2, (hops[0], t.ticks)  # was 2 a tick (host, then GPUs); +1 for a cut-off tick
        assert _distinct(h, node, "host_samples") >= t.ticks - 1
        assert _distinct(h, node, "gpu_samples") >= t.ticks - 2
        assert node.gpu_source.late == 0
    finally:
        close_node(node)


async def test_a_gpu_sample_still_running_leaves_the_host_its_own_hand_off(tmp_path, h, monkeypatch):
    node = open_node(h.write_config(tmp_path, 'sample_interval_s = 0.1\nfake_nvml = "h200x8"'))
    release = threading.Event()
    real = node.sampler.sample

    def stuck(pids):
        release.wait(10)  # NVML hung
        return real(pids)

    monkeypatch.setattr(node.sampler, "sample", stuck)
    try:
        await run_clock(node, 2.0)
        t = node.ticker
        assert t.ticks >= 10 and t.failed_ticks == 0, (t.ticks, t.missed_ticks, t.last_tick_error)
        assert _distinct(h, node, "host_samples") >= t.ticks - 1  # every tick's host row, the GPU stuck
        assert _distinct(h, node, "gpu_samples") == 0 and node.gpu_source.late >= t.ticks - 1
    finally:
        release.set()
        await asyncio.sleep(0.3)
        close_node(node)


class _NoThreads(ThreadPoolExecutor):
    """An executor that cannot start work, as when the process is out of threads."""

    def submit(self, fn, /, *args, **kwargs):
        raise RuntimeError("can't start new thread")


async def test_a_job_that_cannot_start_fails_the_tick_and_the_clock_goes_on(tmp_path, h):
    node = open_node(h.write_config(tmp_path, 'sample_interval_s = 0.1\nfake_nvml = "h200x8"'))
    loop = asyncio.get_running_loop()
    broken, fine = _NoThreads(max_workers=1), ThreadPoolExecutor(max_workers=4)
    loop.set_default_executor(broken)
    task = asyncio.create_task(node.ticker.run())
    try:
        t = node.ticker
        await wait_for_async(lambda: t.failed_ticks >= 3, 20, what="ticks failing without threads")
        assert "can't start new thread" in (t.last_tick_error or "")
        loop.set_default_executor(fine)  # threads again: the clock was never stuck on a tick that cannot end
        done = t.ticks
        await wait_for_async(lambda: t.ticks >= done + 5, 20, what="ticks once threads are back")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.3)
        close_node(node)
        loop.set_default_executor(ThreadPoolExecutor())
        fine.shutdown(wait=False)
