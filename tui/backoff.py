"""Retry spacing for polls while the agent is unreachable: fast at first, then no more than every `cap_s`."""

from __future__ import annotations


class Backoff:
    def __init__(self, base_s: float = 1.0, cap_s: float = 30.0, factor: float = 2.0):
        self.base_s = base_s
        self.cap_s = cap_s
        self.factor = factor
        self.failures = 0

    def next_delay(self) -> float:
        """The wait before the next attempt after one more failure."""
        delay = min(self.cap_s, self.base_s * self.factor ** self.failures)
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0
