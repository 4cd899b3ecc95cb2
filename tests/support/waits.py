"""Polling until a condition holds, with a failure that names what was awaited and the last value seen.

The default deadline (30 s) only bounds a failure: CI's loaded 2-core machine (load average up to 18) makes things
that must eventually happen take seconds. A test whose deadline is the behaviour (promptness) names it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any


def _timeout_message(timeout: float, what: str, last: Any) -> str:
    return f"timed out after {timeout:g} s waiting for {what}; last seen: {last!r}"[:3000]


def wait_for(pred: Callable[[], Any], timeout: float = 30.0, what: str = "condition", interval: float = 0.05,
             ignore: tuple[type[BaseException], ...] = ()) -> Any:
    """Poll pred() until it is truthy and return its value; exceptions in `ignore` count as "not yet"."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = pred()
        except ignore as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise AssertionError(_timeout_message(timeout, what, last))
        time.sleep(interval)


async def wait_for_async(pred: Callable[[], Any], timeout: float = 30.0, step: float = 0.02,
                         what: str = "condition", sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> Any:
    """The same inside an event loop: the loop keeps running between polls (`sleep`: e.g. a Textual pilot's
    pause, so the app under test processes its messages)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = pred()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(_timeout_message(timeout, what, last))
        await sleep(step)


def _holds_message(duration: float, what: str, after: float, last: Any) -> str:
    return f"{what} stopped holding after {after:.2f} s of the {duration:g} s it must hold; last seen: {last!r}"[:3000]


def holds(pred: Callable[[], Any], duration: float, what: str = "condition", interval: float = 0.05) -> None:
    """Check that pred() stays truthy for `duration` seconds, polling throughout: the form of "nothing happens"
    checks (a process stays up, a counter stays flat) that fails at the first lapse, not only at the end."""
    start = time.monotonic()
    while True:
        last = pred()
        if not last:
            raise AssertionError(_holds_message(duration, what, time.monotonic() - start, last))
        if time.monotonic() - start >= duration:
            return
        time.sleep(interval)


async def holds_async(pred: Callable[[], Any], duration: float, what: str = "condition", step: float = 0.05,
                      sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
    """`holds` inside an event loop; pred may return an awaitable (e.g. an agent's status call)."""
    start = time.monotonic()
    while True:
        last = pred()
        if asyncio.iscoroutine(last) or isinstance(last, asyncio.Future):
            last = await last
        if not last:
            raise AssertionError(_holds_message(duration, what, time.monotonic() - start, last))
        if time.monotonic() - start >= duration:
            return
        await sleep(step)
