"""`GET /v1/events` while the history cannot be written: the stored events plus those the writer still holds.

During a write outage (a full disk, a read-only remount) the store writer keeps events in memory until writes
resume (store/writer.py: `pending_events`). Reading the database alone hid exactly the events that explain the
outage, so the route answers both, merged in time order, the held ones marked `pending`.

No event is listed twice across the moment it is written: the held list is taken first, then the database is
read; an event written in between is in both, and the held copy is dropped because a stored row carries the same
identity (time, run, kind, severity, message, details: an event has no id before it is stored). Two distinct
events identical in all of these, in the same millisecond, would read as one until written: harmless.

While the database cannot be read at all (the agent started on a full disk: the writer runs unopened and retries,
store/writer.py `_start_unopened`) the held events are the only account of the outage: the route answers them
with `history_error` saying why the stored ones are missing (`EventsAnswer`), never a 503 that hides them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from lynxtop.contract.events import Event, identity


@dataclass(frozen=True)
class EventsAnswer:
    """`GET /v1/events`'s answer: the events, and why the stored ones are missing while the history cannot be
    read (None when it can). `history_error` is always sent (null when readable), as the status's `*_error`."""

    events: list[Event]
    history_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"events": [e.to_json() for e in self.events], "history_error": self.history_error}


def held_only(held: list[Event], since_ms: int | None, limit: int, why: str) -> EventsAnswer:
    """The answer while the database cannot be opened: the held events alone, cut as the route cuts, and why."""
    return EventsAnswer(with_pending([], held, since_ms, limit), why)


def with_pending(stored: list[Event], held: list[Event], since_ms: int | None, limit: int) -> list[Event]:
    """`stored` (the reader's answer for since_ms/limit, oldest first) merged with the `held` events not in it.

    The route's semantics kept: with `since_ms`, the first `limit` from there; without, the newest `limit`.
    Each side holds all of its events up to its own cut, so cutting the merged list gives the union's answer.
    At one time a stored event comes before a held one (held ones are recorded later, as they will be stored).
    """
    if not held:
        return stored
    seen = Counter(identity(e) for e in stored)
    extra: list[Event] = []
    for ev in held:
        if since_ms is not None and (ev.ts_ms is None or ev.ts_ms < since_ms):
            continue
        key = identity(ev)
        if seen[key]:
            seen[key] -= 1  # written between the two reads: listed once, from the database
            continue
        extra.append(ev)
    if not extra:
        return stored
    merged = sorted([*stored, *extra], key=lambda e: e.ts_ms or 0)  # stable: stored first at one time
    return merged[:limit] if since_ms is not None else merged[-limit:]
