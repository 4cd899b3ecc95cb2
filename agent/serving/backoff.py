"""The failure history of one supervised thing (vLLM, or Ray on multi-node roles), over the one restart policy.

The decisions are agent/serving/policy.py's (pure); this keeps what they need between failures: the failure times
in the crash-loop window, the consecutive count and the readiness timeouts in a row. A run that stayed up for
`stable_after_s`, or an operator's action, clears them all; a run that became ready clears the timeouts in a row.
"""

from __future__ import annotations

import random
import time
from collections import deque

from lynxtop.agent.serving import policy
from lynxtop.contract.config import AgentConfig


class FailureWindow:
    def __init__(self, agent: AgentConfig, rng: random.Random | None = None):
        self.agent = agent
        self.rng = rng or random.Random()
        self.times: deque[float] = deque()
        self.consecutive = 0
        self.timeouts_in_a_row = 0  # readiness timeouts since a run last became ready
        self.last: policy.Decision | None = None  # the decision on the latest failure

    def reset(self) -> None:
        """An operator acted, or the run stayed up for stable_after_s: the count starts again."""
        self.times.clear()
        self.consecutive = 0
        self.timeouts_in_a_row = 0

    def ready(self) -> None:
        """A run became ready: the load fits its timeout, so earlier readiness timeouts are no longer in a row."""
        self.timeouts_in_a_row = 0

    def __bool__(self) -> bool:
        return bool(self.consecutive or self.times or self.timeouts_in_a_row)

    def fail(self, now: float | None = None, readiness_timeout: bool = False) -> float | None:
        """Count one failure (`readiness_timeout`: the run was stopped for not becoming ready in time); the delay
        before the retry, or None for a crash loop (no retry)."""
        now = time.monotonic() if now is None else now
        self.times.append(now)
        self.times = deque(policy.in_window(self.times, now, self.agent.crash_loop_window_s))
        self.consecutive += 1
        if readiness_timeout:
            self.timeouts_in_a_row += 1
        self.last = policy.after_failure(self.times, self.consecutive, self.agent,
                                         timeouts_in_a_row=self.timeouts_in_a_row)
        if self.last.next is policy.Next.GIVE_UP:
            return None
        return self.delay(self.consecutive)  # the jitter drawn only for a retry, as before

    def delay(self, consecutive: int) -> float:
        return policy.backoff_s(consecutive, self.agent, self.rng.uniform(0.8, 1.2))

    def __len__(self) -> int:
        return len(self.times)
