"""Shared test set-up: every test gets its own temporary state, nothing touches /etc, /run or /var/lib."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.ports import short_dir


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path):
    for var in ("LYNXTOP_CONFIG", "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "STATE_DIRECTORY",
                "RUNTIME_DIRECTORY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg-run"))


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A directory with a short path for AF_UNIX sockets (107 bytes at most; pytest's tmp_path can be longer)."""
    with short_dir() as d:
        yield d
