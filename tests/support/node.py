"""An agent Node in the test's own event loop: opened on a config file, its clock run for a while, closed.

For tests of the tick itself (clock, failures, scrape cadence, status): no socket, no supervisor actions; the GPU
sampler is opened and closed here so no NVML session outlives the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lynxtop.agent.node import Node
from lynxtop.agent.notify import Notifier
from lynxtop.contract.config import load_config
from support.waits import wait_for_async


def open_node(config_path: str | Path) -> Node:
    node = Node(load_config(str(config_path)), Notifier(None))
    node._open_parts()
    node.gpu_view.update(time.monotonic(), [], node.sampler.open(), node.sampler.static())
    return node


async def run_clock(node: Node, seconds: float, settle_s: float = 0.3, until: Callable[[], Any] | None = None,
                    what: str = "a condition on the ticking node") -> None:
    """Tick for `seconds` (the span is what a cadence test measures), or with `until` for as long as it takes
    `until()` to hold (`seconds` is then the deadline: a loaded machine ticks late, never fewer times by a clock);
    then stop the clock and let a straggling sampler thread finish."""
    task = asyncio.create_task(node.ticker.run())
    try:
        if until is None:
            await asyncio.sleep(seconds)
        else:
            await wait_for_async(until, seconds, what=what)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await asyncio.sleep(settle_s)  # a sampler thread of the cancelled tick finishes: nothing of ours to wait on


def close_node(node: Node) -> None:
    with contextlib.suppress(Exception):
        node.sampler.close()
    node.writer.close()


def count_loop_turns(loop: asyncio.AbstractEventLoop) -> list[int]:
    """The loop's turns (each wake-up from its selector), counted by wrapping its `_run_once`."""
    turns = [0]
    real = loop._run_once  # type: ignore[attr-defined]

    def counting() -> None:
        turns[0] += 1
        real()

    loop._run_once = counting  # type: ignore[attr-defined]
    return turns
