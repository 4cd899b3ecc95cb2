"""`import _support` first in a benchmark: it adds the repository's tests/ to sys.path.

The benchmarks then use the tests' helpers (`support.ports.free_port`, `support.agent_config`): one builder of
the agent's TOML and one free_port for tests and benchmarks alike. Appended, not prepended, so nothing under
tests/ can shadow an installed module.
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
if str(TESTS) not in sys.path:
    sys.path.append(str(TESTS))
