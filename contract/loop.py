"""The event loop the agent, bench and the simulator run on: uvloop where installed, as vLLM's API server does.

Its socket reads and writes are in C: half the CPU per streamed token for `lynxtop bench`'s client (which shares
the cores with the server it measures) and for the simulator's API server. asyncio's own loop otherwise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run, on uvloop where it is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
