"""The runs table as the supervisor sees it: the store writer's run calls, made so serving never waits on them.

A history store that fails or is slow (a full disk) is logged and the call's result is None: serving does not
depend on the history.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger(__name__)


class RunStore(Protocol):
    """The part of `lynxtop.store.writer.StoreWriter` the supervisor uses (events take agent/events.py)."""

    def create_run(self, run_id: int | None = None, **fields: Any) -> int: ...

    def update_run(self, run_id: int, **fields: Any) -> None: ...


async def store_call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - serving does not depend on the history store
        log.error("history store call %s failed: %s", getattr(fn, "__name__", fn), exc)
        return None
