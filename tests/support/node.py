"""An agent Node in the test's own event loop: opened on a config file, its clock run for a while, closed.

For tests of the tick itself (clock, failures, scrape cadence, status): no socket, no supervisor actions; the GPU
sampler is opened and closed here so no XID thread outlives the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from lynxtop.agent.node import Node
from lynxtop.agent.notify import Notifier
from lynxtop.contract.config import load_config


def open_node(config_path: str | Path) -> Node:
    node = Node(load_config(str(config_path)), Notifier(None))
    node._open_parts()
    node.gpu_view.update(time.monotonic(), [], node.sampler.open(), node.sampler.static())
    return node


async def run_clock(node: Node, seconds: float, settle_s: float = 0.3) -> None:
    """Tick for `seconds`, then stop the clock and let a straggling sampler thread finish."""
    task = asyncio.create_task(node.ticker.run())
    await asyncio.sleep(seconds)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await asyncio.sleep(settle_s)


def close_node(node: Node) -> None:
    with contextlib.suppress(Exception):
        node.sampler.close()
    node.writer.close()
