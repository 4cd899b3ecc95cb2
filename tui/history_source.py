"""Read-only access to the history database for the dashboard, one short-lived reader per question.

Readers are opened inside worker threads and closed at once: SQLite connections belong to one thread, and a
read transaction left open would starve the agent's WAL checkpoints.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lynxtop.contract.terminal import terminal_safe
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


@dataclass(frozen=True)
class BoardChange:
    """Another board behind GPU index `gpu` from `at_ms` (a replacement, or the indices shifted after a board fell
    off the bus): the index's readings before and after are two boards'. `new` None: no board recorded there
    since (its board moved away or is gone). `absent_since_ms`: no board was recorded there from then until `at_ms`
    (a gap: the old board gone while no agent ran, from its last sample); `new` == `old` with it: the same board
    back after the gap, its readings before and after are one board's with none between."""

    gpu: int
    old: str
    new: str | None
    at_ms: int
    absent_since_ms: int | None = None

    @property
    def back(self) -> bool:
        """The same board back at its index after a gap (no other board's readings)."""
        return self.new == self.old and self.absent_since_ms is not None


def short_uuid(uuid: str) -> str:
    """`GPU-ab12cd34…`: the UUID's first group, enough to tell a node's boards apart on one line."""
    uuid = terminal_safe(uuid)  # NVML's text, from the database: never a control character on the screen
    head, _, rest = uuid.partition("-")
    first = rest.split("-", 1)[0] if rest else ""
    return f"{head}-{first}…" if first and len(uuid) > len(head) + 1 + len(first) else uuid


def board_changes(segments: list[dict[str, Any]], start_ms: int, end_ms: int) -> list[BoardChange]:
    """The board changes at any index within (start_ms, end_ms], from `StoreReader.gpu_identities()`'s segments
    ({gpu, uuid, since_ms, until_ms} by index then start). A segment's start inside the window after another
    board's segment at that index is a change; a segment that ends inside the window with no board after it is
    one too (new None). A gap between two segments (the first ends before the next starts: its board was gone
    from its last sample) is told at the next start with the gap's start (`absent_since_ms`), the same board's
    return too; a gap that starts inside the window and ends after it is the board gone (new None). The first
    board ever recorded at an index is no change. Another node's segments carry the same ends: no other field."""
    by_gpu: dict[int, list[dict[str, Any]]] = {}
    for s in segments:
        if isinstance(s.get("gpu"), int) and isinstance(s.get("uuid"), str):
            by_gpu.setdefault(s["gpu"], []).append(s)
    out: list[BoardChange] = []
    for gpu, segs in by_gpu.items():
        segs = sorted(segs, key=lambda s: s["since_ms"] if isinstance(s.get("since_ms"), int) else -1)
        for a, b in zip(segs, segs[1:], strict=False):
            at, until = b.get("since_ms"), a.get("until_ms")
            gap = until if isinstance(at, int) and isinstance(until, int) and until < at else None
            if isinstance(at, int) and start_ms < at <= end_ms and (gap is not None or a["uuid"] != b["uuid"]):
                out.append(BoardChange(gpu, a["uuid"], b["uuid"], at, gap))
            elif gap is not None and start_ms < gap <= end_ms:
                out.append(BoardChange(gpu, a["uuid"], None, gap))
        last, until = segs[-1], segs[-1].get("until_ms")
        if isinstance(until, int) and start_ms < until <= end_ms:
            out.append(BoardChange(gpu, last["uuid"], None, until))
    return sorted(out, key=lambda c: (c.at_ms, c.gpu))
