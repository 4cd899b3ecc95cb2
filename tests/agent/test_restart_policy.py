"""The restart policy is pure (issue 27.1): decisions from the failure history, the verdict and the config,
tested without a process or a clock."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

from lynxtop.agent.serving import policy
from lynxtop.agent.serving.backoff import FailureWindow
from lynxtop.agent.serving.policy import Next
from lynxtop.contract.config import AgentConfig

AGENT = AgentConfig(Path("/unused/lynxtop.db"), Path("/unused/agent.sock"), backoff_initial_s=5.0,
                    backoff_max_s=60.0, crash_loop_failures=3, crash_loop_window_s=100.0, restart_on_hang=True)


def test_failures_back_off_doubling_up_to_the_cap_then_give_up_as_a_crash_loop():
    assert policy.after_failure([0.0], 1, AGENT) == policy.Decision(Next.RETRY, 5.0, 1)
    assert policy.after_failure([0.0, 10.0], 2, AGENT) == policy.Decision(Next.RETRY, 10.0, 2)
    assert policy.after_failure([0.0, 10.0, 20.0], 3, AGENT) == policy.Decision(Next.GIVE_UP, 0.0, 3)
    assert policy.backoff_s(10, AGENT) == 60.0  # 5 * 2**9 capped
    assert policy.backoff_s(1, AGENT, jitter=1.2) == 6.0


def test_failures_outside_the_window_do_not_count_towards_a_crash_loop():
    times = policy.in_window([0.0, 50.0, 150.0], now=150.0, window_s=100.0)
    assert times == [50.0, 150.0]
    assert policy.after_failure(times, 3, AGENT).next is Next.RETRY  # the third in a row, but two in the window


def test_a_hang_restarts_only_with_restart_on_hang_no_action_running_and_a_known_profile():
    assert policy.restart_on_verdict(True, AGENT, action_running=False, has_profile=True)
    assert not policy.restart_on_verdict(False, AGENT, action_running=False, has_profile=True)  # unhealthy only
    assert not policy.restart_on_verdict(True, AGENT, action_running=True, has_profile=True)
    assert not policy.restart_on_verdict(True, AGENT, action_running=False, has_profile=False)
    off = dataclasses.replace(AGENT, restart_on_hang=False)
    assert not policy.restart_on_verdict(True, off, action_running=False, has_profile=True)


def test_the_failure_window_keeps_the_history_the_policy_decides_on():
    w = FailureWindow(AGENT, random.Random(1))
    first = w.fail(now=0.0)
    assert first is not None and 4.0 <= first <= 6.0
    assert w.fail(now=200.0) is not None  # the first fell out of the window
    assert len(w) == 1 and w.consecutive == 2
    assert w.fail(now=210.0) is not None and w.fail(now=220.0) is None  # three in 100 s: crash loop
    w.reset()
    assert not w and len(w) == 0
