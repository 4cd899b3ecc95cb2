"""`GET /v1/events` while the history cannot be written: the stored events plus those the writer still holds.

During a write outage (a full disk, a read-only remount) the store writer keeps events in memory until writes
resume (store/writer.py: `pending_events`). Reading the database alone hid exactly the events that explain the
outage, so the route answers both, merged in time order, the held ones marked `pending`.

No event is listed twice across the moment it is written: the held list is taken first, then the database is
read; an event written in between is in both, and the held copy is dropped because a stored row carries the same
identity (time, run, kind, severity, message, details: an event has no id before it is stored). Two distinct
events identical in all of these, in the same millisecond, would read as one until written: harmless.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Hashable

from lynxtop.contract.events import Event


def _identity(ev: Event) -> Hashable:
    """What a held event and its stored row share (the writer builds one from the other's row)."""
    details = json.dumps(ev.details, sort_keys=True, default=str) if ev.details is not None else None
    return (ev.ts_ms, ev.run_id, str(ev.kind), str(ev.severity), ev.message, details)


def with_pending(stored: list[Event], held: list[Event], since_ms: int | None, limit: int) -> list[Event]:
    """`stored` (the reader's answer for since_ms/limit, oldest first) merged with the `held` events not in it.

    The route's semantics kept: with `since_ms`, the first `limit` from there; without, the newest `limit`.
    Each side holds all of its events up to its own cut, so cutting the merged list gives the union's answer.
    At one time a stored event comes before a held one (held ones are recorded later, as they will be stored).
    """
    if not held:
        return stored
    seen = Counter(_identity(e) for e in stored)
    extra: list[Event] = []
    for ev in held:
        if since_ms is not None and (ev.ts_ms is None or ev.ts_ms < since_ms):
            continue
        key = _identity(ev)
        if seen[key]:
            seen[key] -= 1  # written between the two reads: listed once, from the database
            continue
        extra.append(ev)
    if not extra:
        return stored
    merged = sorted([*stored, *extra], key=lambda e: e.ts_ms or 0)  # stable: stored first at one time
    return merged[:limit] if since_ms is not None else merged[-limit:]
