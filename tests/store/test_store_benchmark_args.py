"""benchmarks/store.py refuses a run too short to measure compaction, before writing anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("hours", ["1", "nan", "-3"])
def test_too_few_hours_is_refused_with_a_message_not_a_traceback(hours):
    p = subprocess.run([sys.executable, "benchmarks/store.py", "--hours", hours], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2
    assert "Traceback" not in p.stderr
    assert f"--hours {float(hours):g}: at least 2" in p.stderr
