"""A tick that fails is a missed tick, and a failure that repeats is one log line per episode (issue 11 §2).

Before: `_tick` caught the exception with log.exception and returned, so 114 s of EMFILE gave 114 tracebacks per
second-ish (633k in all with the accept loop) and a status that said healthy with 0 missed ticks afterwards.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Callable

import pytest
from support.node import close_node, open_node
from support.waits import wait_for_async

from lynxtop.agent.api.connguard import Episodes, install_loop_handler
from lynxtop.agent.node import Node

pytestmark = pytest.mark.timeout(60)


class _Failing:
    """Wraps the real host sampler; `sample` raises `exc` while `failing` is set."""

    def __init__(self, real, exc: Exception):
        self._real, self.exc, self.failing = real, exc, True

    def __getattr__(self, name):
        return getattr(self._real, name)

    def sample(self, *args, **kwargs):
        if self.failing:
            raise self.exc
        return self._real.sample(*args, **kwargs)


def _node(tmp_path, h) -> Node:
    return open_node(h.write_config(tmp_path, 'sample_interval_s = 0.1\nfake_nvml = "h200x8"'))


async def _clock_until(node: Node, until: Callable[[], object], timeout: float = 30) -> asyncio.Task:
    """The clock started, once `until()` holds (a loaded machine ticks late): the running task."""
    task = asyncio.create_task(node.ticker.run())
    try:
        await wait_for_async(until, timeout, what="ticks of the failing node")
    except BaseException:
        task.cancel()
        raise
    return task


async def _stop(task: asyncio.Task) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.3)  # a sampler thread of the cancelled tick finishes (nothing to wait on: it is not ours)


def _lines(caplog, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if text in r.getMessage()]


async def test_emfile_ticks_are_missed_counted_and_logged_once(tmp_path, h, caplog):
    caplog.set_level(logging.INFO)
    node = _node(tmp_path, h)
    failing = _Failing(node.host_sampler, OSError(errno.EMFILE, "Too many open files"))
    node.host_sampler = failing
    try:
        task = await _clock_until(node, lambda: node.ticker.failed_ticks >= 5)
        assert node.ticker.failed_ticks >= 5 and node.ticker.ticks == 0, (node.ticker.failed_ticks, node.ticker.ticks)
        st = node.status().agent
        assert st.failed_ticks == node.ticker.failed_ticks and st.missed_ticks >= node.ticker.failed_ticks
        assert "Too many open files" in st.last_tick_error
        assert "failed" in node.status_line() and "missed ticks" in node.status_line()
        # one line for the whole episode, and no traceback for an exhausted resource
        assert len(_lines(caplog, "sampling ticks fail")) == 1
        assert not [r for r in caplog.records if r.exc_info]
        failing.failing = False  # descriptors are back
        await wait_for_async(lambda: _lines(caplog, "ended after") and node.ticker.ticks >= 3, 30,
                             what="a good tick ending the episode")
        await _stop(task)
        assert node.ticker.ticks >= 3
        ended = _lines(caplog, "ended after")
        assert len(ended) == 1 and f"{node.ticker.failed_ticks} failed" in ended[0].getMessage()
    finally:
        close_node(node)


async def test_a_bug_in_a_tick_logs_one_traceback_per_episode(tmp_path, h, caplog):
    caplog.set_level(logging.INFO)
    node = _node(tmp_path, h)
    node.host_sampler = _Failing(node.host_sampler, RuntimeError("sampler bug"))
    try:
        task = await _clock_until(node, lambda: node.ticker.failed_ticks >= 5)
        await _stop(task)
        assert node.ticker.failed_ticks >= 5
        assert len([r for r in caplog.records if r.exc_info]) == 1
        assert node.status().agent.missed_ticks >= node.ticker.failed_ticks
    finally:
        close_node(node)


async def test_accept_emfile_from_the_event_loop_is_one_line_per_episode(caplog):
    lines: list[str] = []
    episodes = Episodes(lines.append, quiet_s=0.2)
    loop = asyncio.get_running_loop()
    old = loop.get_exception_handler()
    install_loop_handler(loop, episodes)
    try:
        for _ in range(1000):  # what asyncio reports on every failed accept() at the descriptor limit
            loop.call_exception_handler({"message": "socket.accept() out of system resource",
                                         "exception": OSError(errno.EMFILE, "Too many open files")})
        assert len(lines) == 1 and "out of descriptors" in lines[0]
        # the episode closes once quiet for quiet_s: polled until it has, however slow the machine
        await wait_for_async(lambda: episodes.poll() or len(lines) >= 2, 10, what="the episode's summary line")
        assert len(lines) == 2 and "1000 occurrence(s)" in lines[1]
    finally:
        loop.set_exception_handler(old)
