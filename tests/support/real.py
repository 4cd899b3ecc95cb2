"""Real stages (a real Prometheus/promtool, a real vLLM): skipped where they cannot run, failed where CI requires them.

A skip is the right answer on a laptop without Prometheus, and the wrong one in CI: a stage that silently skips
there proves nothing while the docs say it ran. `.ci/run` sets LYNXTOP_REQUIRE_REAL=1, which turns every
"cannot run here" of a real stage into a failure that says what is missing and how to get it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import NoReturn, TypeVar

import pytest

REQUIRE_REAL = "LYNXTOP_REQUIRE_REAL"
PROMETHEUS_HINT = "apt-get install -y -q prometheus (Debian; brings promtool)"

F = TypeVar("F", bound=Callable[..., object])


def required() -> bool:
    """True where a real stage must run (CI): LYNXTOP_REQUIRE_REAL=1."""
    return os.environ.get(REQUIRE_REAL, "").strip() == "1"


def unavailable(why: str) -> NoReturn:
    """A real stage cannot run here: skip saying why, or fail saying why where it is required."""
    if required():
        pytest.fail(f"{why}; {REQUIRE_REAL}=1 makes a real stage that cannot run a failure, not a skip",
                    pytrace=False)
    pytest.skip(why)


def missing_tools(*tools: str) -> list[str]:
    return [t for t in tools if shutil.which(t) is None]


def needs_tools(*tools: str, hint: str = PROMETHEUS_HINT) -> Callable[[F], F]:
    """Decorate a test that runs the given programs: unchanged where they are on PATH; otherwise skipped (saying
    which are missing), or, under LYNXTOP_REQUIRE_REAL=1, replaced by a test that fails before any fixture runs
    (a fixture would only fail later, and less clearly)."""

    def decorate(fn: F) -> F:
        missing = missing_tools(*tools)
        if not missing:
            return fn
        why = f"{', '.join(missing)} not installed ({hint})"
        if not required():
            return pytest.mark.skip(reason=why)(fn)

        def fails() -> None:  # no arguments: no fixture (agent, Prometheus) is started for a test that fails
            unavailable(why)

        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(fails, attr, getattr(fn, attr))
        return fails  # type: ignore[return-value]

    return decorate
