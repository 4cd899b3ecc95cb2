"""The one restart policy for everything the agent supervises (vLLM and, on multi-node roles, Ray).

Exponential backoff with jitter between retries, and a crash loop once too many failures fall in one window:
an operator then has to act. A run that stayed up for `stable_after_s` clears the count.
"""

from __future__ import annotations

import random
import time
from collections import deque

from lynxtop.contract.config import AgentConfig


class FailureWindow:
    def __init__(self, agent: AgentConfig, rng: random.Random | None = None):
        self.agent = agent
        self.rng = rng or random.Random()
        self.times: deque[float] = deque()
        self.consecutive = 0

    def reset(self) -> None:
        """An operator acted, or the run stayed up for stable_after_s: the count starts again."""
        self.times.clear()
        self.consecutive = 0

    def __bool__(self) -> bool:
        return bool(self.consecutive or self.times)

    def fail(self, now: float | None = None) -> float | None:
        """Count one failure; the delay before the retry, or None for a crash loop (no retry)."""
        now = time.monotonic() if now is None else now
        self.times.append(now)
        while self.times and now - self.times[0] > self.agent.crash_loop_window_s:
            self.times.popleft()
        self.consecutive += 1
        if len(self.times) >= self.agent.crash_loop_failures:
            return None
        return self.delay(self.consecutive)

    def delay(self, consecutive: int) -> float:
        a = self.agent
        base = min(a.backoff_initial_s * 2 ** (consecutive - 1), a.backoff_max_s)
        return min(base * self.rng.uniform(0.8, 1.2), a.backoff_max_s)

    def __len__(self) -> int:
        return len(self.times)
