"""Is the served engine healthy: hang detection from the scraped counters and the `/health` probe.

Both turn raw readings into a `Verdict` (hung, unhealthy, or healthy again) and leave the consequences to the
supervisor, which only marks the run degraded, clears it, or restarts it. Every GET the agent makes to vLLM goes
through one `HttpClient` (one aiohttp session, one connection pool): the scrape, the readiness and `/health`
probes and `/version`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import aiohttp

PROBE_TIMEOUT_S = 3.0


class HttpClient:
    """The agent's one HTTP session to the served engine, opened on first use (it needs the running loop)."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def get(self, url: str, timeout_s: float = PROBE_TIMEOUT_S) -> tuple[int | None, Any]:
        """(HTTP status, JSON body or None); (None, None) when nothing answered in time."""
        try:
            async with self.session().get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                body: Any = None
                if resp.content_type == "application/json":
                    with contextlib.suppress(ValueError, aiohttp.ContentTypeError):
                        body = await resp.json()
                return resp.status, body
        except (TimeoutError, aiohttp.ClientError, OSError):
            return None, None

    @property
    def closed(self) -> bool:
        return self._session is None or self._session.closed

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()


class Health(StrEnum):
    HUNG = "hung"
    PROGRESSING = "progressing"  # tokens flow again (or nothing is asked): a hang is over
    UNHEALTHY = "unhealthy"
    HEALTHY = "healthy"


@dataclass(frozen=True)
class Verdict:
    health: Health
    reason: str

    @property
    def condition(self) -> str:
        """What the verdict is about: "hang" (the counters) or "health" (`GET /health`)."""
        return "hang" if self.health in (Health.HUNG, Health.PROGRESSING) else "health"

    @property
    def bad(self) -> bool:
        return self.health in (Health.HUNG, Health.UNHEALTHY)


class HangDetector:
    """A run whose requests wait or run while no token is generated for `timeout_s` is hung.

    Fed with the scraper's counters every tick of one run (a new run gets a new detector). Requests that only
    wait (none running) count too: an engine hung before it scheduled them shows 0 running and N waiting.
    """

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.hung = False
        self._last_tokens: float | None = None
        self._last_progress: float | None = None

    def observe(self, running: float | None, tokens_total: float | None, waiting: float | None = None,
                now: float | None = None) -> Verdict | None:
        if running is None or tokens_total is None:
            # a gap in the readings (/metrics down) is not a stall: the clock restarts when they come back, or
            # the first request after a long idle outage would look hung at once (and be restarted, if enabled)
            self._last_tokens = self._last_progress = None
            return None
        now = time.monotonic() if now is None else now
        pending = running + (waiting or 0)
        if self._last_tokens is None or tokens_total != self._last_tokens or pending <= 0:
            self._last_tokens, self._last_progress = tokens_total, now
            self.hung = False
            return Verdict(Health.PROGRESSING, "tokens are being generated again")
        stalled = now - (self._last_progress if self._last_progress is not None else now)
        if stalled < self.timeout_s or self.hung:
            return None
        self.hung = True
        what = f"{running:g} requests running" + (f", {waiting:g} waiting" if waiting else "")
        return Verdict(Health.HUNG, f"hang: {what} and no token generated for {stalled:.0f} s")


class HealthProbe:
    """`GET /health` of one run: unhealthy after `fail_threshold` failures in a row, healthy on a 200.

    With `hang_timeout_s`, a server that gives no answer at all for that long is hung too: a frozen server
    (SIGSTOP, a wedged API process) generates no token, but its counters cannot be read either, so the
    counters' hang clock never ran and `restart_on_hang` did nothing for it.
    """

    def __init__(self, http: HttpClient, url: str, fail_threshold: int, hang_timeout_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.http = http
        self.url = url.rstrip("/") + "/health"
        self.fail_threshold = fail_threshold
        self.hang_timeout_s = hang_timeout_s
        self.clock = clock
        self.fails = 0
        self.hung = False
        self.answered_at = clock()  # probing starts on a server that has just answered (it became ready)

    async def ok(self) -> bool:
        """One probe that only says whether it answered 200 (readiness)."""
        status, _ = await self.http.get(self.url)
        return status == 200

    async def probe(self) -> Verdict | None:
        status, _ = await self.http.get(self.url)
        now = self.clock()
        if status is not None:
            self.answered_at = now
        if status == 200:
            self.fails = 0
            if self.hung:  # the "health" condition is cleared by the next probe's HEALTHY
                self.hung = False
                return Verdict(Health.PROGRESSING, "GET /health answers again")
            return Verdict(Health.HEALTHY, "GET /health answers 200 again")
        self.fails += 1
        silent = now - self.answered_at
        if self.hang_timeout_s is not None and status is None and not self.hung and silent >= self.hang_timeout_s:
            self.hung = True
            return Verdict(Health.HUNG, f"hang: GET /health unanswered for {silent:.0f} s (hang_timeout_s "
                                        f"{self.hang_timeout_s:g}): the server is frozen")
        if self.fails < self.fail_threshold:
            return None
        what = f"HTTP {status}" if status else "no answer"
        return Verdict(Health.UNHEALTHY, f"GET /health failing ({what}, {self.fails} times in a row)")
