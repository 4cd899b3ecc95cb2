"""The tick's hand-offs (agent/ticker.py, agent/sampling.py; issue 29.3): the schedule is kept by the ticker's clock
thread, which reads the host row and the GPU sample (NVML in the same thread) and hands the tick to the loop
once; no executor job a tick, no task when nothing is to be awaited, about one loop turn a tick (the loop's timer,
the executor hand-off and the wake-ups on its completion were ~11 turns and 3 tasks a tick, and cost more than the
sampling at 10 Hz). Every tick still carries its host and GPU rows, a stuck GPU never holds the host back, a thread
that cannot start fails ticks (counted) and the clock goes on, and stopping the clock ends its threads."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from support.node import close_node, count_loop_turns, open_node, run_clock
from support.waits import wait_for_async

from lynxtop.agent import ticker

pytestmark = pytest.mark.timeout(90)


class _CountingExecutor(ThreadPoolExecutor):
    """The loop's default executor, counting the jobs it is given (every `asyncio.to_thread` goes through it)."""

    def __init__(self) -> None:
        super().__init__(max_workers=4)
        self.jobs = 0

    def submit(self, fn, /, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN201
        self.jobs += 1
        return super().submit(fn, *args, **kwargs)


def _distinct(h, node, table: str) -> int:
    node.writer.flush()
    return h.db_rows(node.writer.path, f"SELECT count(DISTINCT ts_ms) AS n FROM {table}")[0]["n"]


def _threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name and t.is_alive()]


async def test_a_tick_at_10_hz_is_handed_to_the_loop_once_and_keeps_its_host_and_gpu_rows(tmp_path, h):
    node = open_node(h.write_config(tmp_path, 'sample_interval_s = 0.1\nfake_nvml = "h200x8"'))
    loop = asyncio.get_running_loop()
    executor = _CountingExecutor()
    loop.set_default_executor(executor)
    made = [0]

    def factory(loop: asyncio.AbstractEventLoop, coro, **kwargs):  # noqa: ANN001, ANN003, ANN202
        made[0] += 1
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)
    turns = count_loop_turns(loop)
    try:
        await run_clock(node, 3.0, settle_s=0.0)
        t = node.ticker
        assert t.ticks >= 15 and t.failed_ticks == 0, (t.ticks, t.missed_ticks, t.last_tick_error)
        assert executor.jobs == 0, executor.jobs  # was one a tick (the host row and the GPU sample in one job)
        assert made[0] <= 2, (made[0], t.ticks)  # run_clock's own task and one cut off: was 3 a tick
        # one turn a tick for the clock thread's hand-off (+ a few for run_clock's sleep and its cancellation):
        # the loop's timer, the task steps, the job's two wake-ups and the waits were ~11 a tick
        assert turns[0] <= 2 * t.ticks + 10, (turns[0], t.ticks)
        assert _distinct(h, node, "host_samples") >= t.ticks - 1
        assert _distinct(h, node, "gpu_samples") >= t.ticks - 2
        assert node.gpu_source.late == 0
    finally:
        del loop._run_once  # type: ignore[attr-defined]
        loop.set_task_factory(None)
        loop.set_default_executor(ThreadPoolExecutor())
        executor.shutdown(wait=False)
        close_node(node)
    assert not _threads("lynxtop-clock")  # stopping the clock ended its thread


async def test_a_gpu_sample_still_running_never_holds_the_host_back_nor_the_clock_stopping(tmp_path, h, monkeypatch):
    node = open_node(h.write_config(tmp_path, 'sample_interval_s = 0.1\nfake_nvml = "h200x8"'))
    release = threading.Event()
    real = node.sampler.sample
    calls = [0]

    def stuck(pids):
        calls[0] += 1
        release.wait(10)  # NVML hung
        return real(pids)

    monkeypatch.setattr(node.sampler, "sample", stuck)
    try:
        await run_clock(node, 2.0, settle_s=0.0)
        t = node.ticker
        assert t.ticks >= 10 and t.failed_ticks == 0, (t.ticks, t.missed_ticks, t.last_tick_error)
        assert _distinct(h, node, "host_samples") >= t.ticks - 1  # every tick's host row, the GPU stuck
        assert _distinct(h, node, "gpu_samples") == 0 and node.gpu_source.late >= t.ticks - 1
        assert calls[0] == 1  # the stuck sample waited for again by every tick, never doubled
        # the clock stopped without waiting for NVML: only the thread inside the call is left, to end with it
        assert len(_threads("lynxtop-clock")) == 1
        release.set()
        await wait_for_async(lambda: not _threads("lynxtop-clock"), 20, what="the stuck thread ending after NVML")
    finally:
        release.set()
        close_node(node)


async def test_threads_that_cannot_start_fail_ticks_and_the_clock_goes_on(tmp_path, h, monkeypatch):
    node = open_node(h.write_config(tmp_path, 'sample_interval_s = 0.1\nfake_nvml = "h200x8"'))
    real = ticker.start_thread
    broken = [True]

    def start_thread(target, name):  # noqa: ANN001, ANN202
        if broken[0]:
            raise RuntimeError("can't start new thread")  # as when the process is out of threads
        return real(target, name)

    monkeypatch.setattr(ticker, "start_thread", start_thread)
    task = asyncio.create_task(node.ticker.run())
    try:
        t = node.ticker
        await wait_for_async(lambda: t.failed_ticks >= 3, 20, what="ticks failing without a clock thread")
        assert "can't start new thread" in (t.last_tick_error or "") and t.ticks == 0
        assert t.missed_ticks >= t.failed_ticks
        broken[0] = False  # threads again: the clock was never stuck on a tick that cannot run
        await wait_for_async(lambda: t.ticks >= 5, 20, what="ticks once threads are back")
        assert _distinct(h, node, "gpu_samples") >= 1
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        close_node(node)


async def test_a_loop_that_has_not_finished_a_tick_skips_the_next_and_counts_it(tmp_path, h, monkeypatch):
    node = open_node(h.write_config(tmp_path, 'sample_interval_s = 0.1\nfake_nvml = "h200x8"'))
    monkeypatch.setattr(node.gpu_source, "finish", lambda tick: False)  # every tick needs the loop (none quiet)
    t = node.ticker
    task = asyncio.create_task(t.run())
    try:
        await wait_for_async(lambda: t.ticks >= 3, 20, what="the first ticks")
        missed = t.missed_ticks
        time.sleep(0.6)  # the loop busy (a long callback): the clock thread's tick waits on it, later ones are due
        await wait_for_async(lambda: t.ticks >= 8, 20, what="ticks after the busy loop")
        assert t.missed_ticks >= missed + 2 and t.failed_ticks == 0, (t.missed_ticks, missed)
        assert _distinct(h, node, "host_samples") >= t.ticks - 1  # every tick that ran was written, in order
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        close_node(node)


class _DiesOnce:
    """Wraps the real host sampler; its first `sample` ends the thread it runs in (not an Exception)."""

    def __init__(self, real) -> None:
        self._real, self.died = real, False

    def __getattr__(self, name):  # noqa: ANN001, ANN204
        return getattr(self._real, name)

    def sample(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        if not self.died:
            self.died = True
            raise SystemExit("the clock thread ends")  # what no sampler's error handling catches
        return self._real.sample(*args, **kwargs)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the SystemExit, as meant
async def test_a_clock_thread_that_ends_is_started_again_and_its_tick_counted_missed(tmp_path, h):
    node = open_node(h.write_config(tmp_path, 'sample_interval_s = 0.1\nfake_nvml = "h200x8"'))
    node.host_sampler = dying = _DiesOnce(node.host_sampler)
    try:
        await run_clock(node, 30.0, until=lambda: node.ticker.ticks >= 5, what="ticks after the clock thread ended")
        t = node.ticker
        assert dying.died and t.missed_ticks >= 1 and t.failed_ticks == 0, (t.missed_ticks, t.failed_ticks)
    finally:
        close_node(node)


async def test_a_tick_that_cannot_be_made_is_a_failed_tick_and_the_clock_goes_on(tmp_path, h, monkeypatch):
    node = open_node(h.write_config(tmp_path, 'sample_interval_s = 0.1\nfake_nvml = "h200x8"'))
    real, calls = node.timeline.check, [0]

    def check():  # noqa: ANN202
        calls[0] += 1
        if calls[0] <= 3:
            raise OSError("the clock cannot be read")
        return real()

    monkeypatch.setattr(node.timeline, "check", check)
    try:
        await run_clock(node, 30.0, until=lambda: node.ticker.ticks >= 5, what="ticks after three that failed")
        t = node.ticker
        assert t.failed_ticks == 3 and "the clock cannot be read" in (t.last_tick_error or "")
    finally:
        close_node(node)


async def test_a_gpu_slower_than_the_tick_is_never_sampled_twice_at_once_and_leaves_no_threads(tmp_path, h,
                                                                                               monkeypatch):
    node = open_node(h.write_config(tmp_path, 'sample_interval_s = 0.1\nfake_nvml = "h200x8"'))
    real = node.sampler.sample
    inside, most, lock = [0], [0], threading.Lock()

    def slow(pids):  # NVML answering in 1.5 intervals every time: each tick's clock thread is rescued
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        try:
            time.sleep(0.15)
            return real(pids)
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setattr(node.sampler, "sample", slow)
    try:
        await run_clock(node, 30.0, settle_s=0.0, until=lambda: node.ticker.ticks >= 15, what="ticks with a slow GPU")
        t = node.ticker
        assert t.failed_ticks == 0 and most[0] == 1, (t.failed_ticks, most[0])  # never two NVML samples at once
        assert _distinct(h, node, "host_samples") >= t.ticks - 1  # every tick its host row
        assert node.gpu_source.late >= 1 and _distinct(h, node, "gpu_samples") >= 1  # some late, some with GPU rows
        # the threads of rescued ticks end with their call: none left once the last one returns
        await wait_for_async(lambda: not _threads("lynxtop-clock"), 20, what="the clock's threads ending")
    finally:
        close_node(node)
