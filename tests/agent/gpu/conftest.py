"""GPU sampling tests run on the fake NVML with a manual clock: seconds pass only when a test says so."""

from __future__ import annotations

import pytest
from gpu_fakes import Events, ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def events() -> Events:
    return Events()
