"""Read-only access to the history database for the dashboard, one short-lived reader per question.

Readers are opened inside worker threads and closed at once: SQLite connections belong to one thread, and a
read transaction left open would starve the agent's WAL checkpoints.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lynxtop.tui.foreign import DisplayReader


class HistoryUnavailable(Exception):
    """The database cannot be read; the message names the path and the reason, for a banner."""


class HistorySource:
    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path else None

    @contextmanager
    def reader(self) -> Iterator[Any]:
        if self.path is None:
            raise HistoryUnavailable("no history database configured")
        try:
            from lynxtop.store.reader import StoreReader
        except ImportError as exc:
            raise HistoryUnavailable(f"history reader not available in this build ({exc})") from exc
        if not self.path.exists():
            raise HistoryUnavailable(f"{self.path}: no such database (has the agent run here?)")
        try:
            reader = StoreReader(self.path)
        except Exception as exc:  # the reader's own message names the path and the fault
            raise HistoryUnavailable(str(exc) or f"{self.path}: cannot open ({type(exc).__name__})") from exc
        try:
            yield DisplayReader(reader)  # its text reads escaped for the screen
        finally:
            reader.close()
