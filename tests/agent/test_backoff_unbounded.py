"""The consecutive-failure count grows without bound while failures come slower than the crash-loop window can catch
(default: 5 in 1800 s, backoff capped at 300 s): the backoff stays capped and never overflows (after ~1,025
failures in a row, about 9 days of a run failing 8 minutes after each start, it raised OverflowError and the
lifecycle task died with no retry and no event)."""

from __future__ import annotations

import random
from pathlib import Path

from lynxtop.agent.serving.backoff import FailureWindow
from lynxtop.contract.config import AgentConfig


def test_a_week_of_slow_failures_keeps_backing_off():
    cfg = AgentConfig(database=Path("/tmp/x.db"), socket=Path("/tmp/x.sock"))  # the defaults
    w = FailureWindow(cfg, random.Random(1))
    now = 0.0
    for i in range(1100):  # a run that fails ~8 min after each start: 7.6 days, never 5 in 30 min
        delay = w.fail(now)
        assert delay is not None, f"crash loop at failure {i + 1}"
        assert delay <= cfg.backoff_max_s
        now += delay + 500.0
