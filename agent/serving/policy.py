"""The restart policy, pure: what to do after a failure, and whether a verdict restarts the run.

No clock, no processes, no I/O: the inputs are the history (failure times on the monotonic clock, the
consecutive count), the verdict and the config; the output is a decision. `backoff.FailureWindow` keeps the
history for vLLM and Ray and asks here; the run lifecycle carries the decision out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from lynxtop.contract.config import AgentConfig

# Readiness timeouts of one profile in a row (no run became ready between them) after which the agent gives up.
# The crash-loop window cannot catch them: each comes a whole readiness_timeout_s (30 min by default, as long as the
# window) after the one before, so a load slower than its timeout was killed and reloaded forever. One retry is
# worth it (a cold page cache, a slow first download); a second timeout says the timeout is too short for the load.
READINESS_TIMEOUTS_IN_A_ROW = 2


class Next(StrEnum):
    RESTART = "restart"  # now (a hang with restart_on_hang)
    RETRY = "retry"  # after `delay_s` (backoff)
    GIVE_UP = "give_up"  # crash loop: an operator has to act


@dataclass(frozen=True)
class Decision:
    next: Next
    delay_s: float = 0.0
    failures_in_window: int = 0  # the failures the decision counted (this one included)
    readiness_timeouts: bool = False  # GIVE_UP because of READINESS_TIMEOUTS_IN_A_ROW, not the window


def in_window(times: Sequence[float], now: float, window_s: float) -> list[float]:
    """The failure times still inside the crash-loop window ending at `now`."""
    return [t for t in times if now - t <= window_s]


def backoff_s(consecutive: int, agent: AgentConfig, jitter: float = 1.0) -> float:
    """Exponential backoff for the `consecutive`-th failure in a row, times `jitter` (0.8..1.2), capped.

    The count grows without bound while failures come slower than the crash-loop window catches them (one every
    8 minutes for a week is over a thousand): the exponent is capped, or the float product overflows."""
    base = min(agent.backoff_initial_s * 2.0 ** min(max(consecutive - 1, 0), 64), agent.backoff_max_s)
    return min(base * jitter, agent.backoff_max_s)


def after_failure(times: Sequence[float], consecutive: int, agent: AgentConfig, jitter: float = 1.0, *,
                  timeouts_in_a_row: int = 0) -> Decision:
    """After a failure: `times` are the failures in the window (this one included), `consecutive` the failures
    since the last stable run or operator action, `timeouts_in_a_row` the readiness timeouts since a run last
    became ready (or an operator acted). Retry after a backoff, or give up once the window holds
    `crash_loop_failures` of them or READINESS_TIMEOUTS_IN_A_ROW timeouts came in a row, however far apart."""
    if len(times) >= agent.crash_loop_failures:
        return Decision(Next.GIVE_UP, failures_in_window=len(times))
    if timeouts_in_a_row >= READINESS_TIMEOUTS_IN_A_ROW:
        return Decision(Next.GIVE_UP, failures_in_window=len(times), readiness_timeouts=True)
    return Decision(Next.RETRY, backoff_s(consecutive, agent, jitter), failures_in_window=len(times))


def restart_on_verdict(hung: bool, agent: AgentConfig, action_running: bool, has_profile: bool) -> bool:
    """A hung server is restarted only with `restart_on_hang`, never over an operator's action in progress
    (a 20-minute load is not restarted on a guess), and only when the agent knows what to start again."""
    return hung and agent.restart_on_hang and not action_running and has_profile
