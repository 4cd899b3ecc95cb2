"""The one path of an event: created once, written once (the store), published once (API subscribers), logged
once, in that order, by `EventSink.put`.

Every part of the agent that reports something (the supervisor, the tick's samplers, Ray roles, the node itself)
holds this sink and nothing else: no part writes events to the store or logs them on its own, so an event is never
stored twice, never missing from the log, and a subscriber sees exactly what the history holds. A store that
refuses an event does not stop the others: the event is still published and logged, the failure reported.

The store's own events (store.*: a file moved aside, writes failing or resumed, the database or its WAL swapped)
come here too: store/ may not import the agent, so the node hands the writer `on_event` and the writer gives
each one to this sink, which writes it back through `record`. Those arrive on the writer's thread, so a
subscriber must not assume the event loop's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from lynxtop.contract.events import Event, EventKind, Severity, log_level

log = logging.getLogger("lynxtop.agent.events")



class EventWriter(Protocol):
    """The store writer's event call (`lynxtop.store.writer.StoreWriter.record`): queues, never blocks."""

    def record(self, event: Event) -> None: ...


Subscriber = Callable[[Event], None]


class EventSink:
    """Owns the event path: the writer, the subscribers and the log line. The only caller of `writer.record`
    in the agent."""

    def __init__(self, writer: EventWriter, logger: logging.Logger | None = None,
                 on_write_error: Callable[[Event, Exception], None] | None = None):
        self._writer = writer
        self._log = logger or log
        self._on_write_error = on_write_error or _log_write_error
        self._subscribers: list[Subscriber] = []

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Call `fn(event)` for every event from now on; returns the unsubscribe call."""
        self._subscribers.append(fn)
        return lambda: self._subscribers.remove(fn) if fn in self._subscribers else None

    def emit(self, kind: EventKind, severity: Severity, message: str, details: dict[str, Any] | None = None,
             run_id: int | None = None, ts_ms: int | None = None) -> Event:
        """Create the event and send it down the path (`put`); returns it."""
        ev = Event(kind, severity, message, details=details, run_id=run_id, ts_ms=ts_ms)
        self.put(ev)
        return ev

    def put(self, ev: Event) -> None:
        """Write, publish, log: an event a sampler already made (samplers return `Event`s, pure)."""
        try:
            self._writer.record(ev)
        except Exception as exc:  # noqa: BLE001 - the history store failing must not stop supervision or sampling
            self._on_write_error(ev, exc)
        for fn in list(self._subscribers):
            try:
                fn(ev)
            except Exception:  # noqa: BLE001 - one broken subscriber must not keep the event from the rest
                self._log.exception("event subscriber %r failed on %s", fn, ev.kind)
        self._log.log(log_level(ev.severity), "%s: %s", ev.kind, ev.message)

    def __call__(self, ev: Event) -> None:
        """The sink as the `record(Event)` callable the Ray roles take."""
        self.put(ev)


def _log_write_error(ev: Event, exc: Exception) -> None:
    log.error("could not record event %s: %s (%s: %s)", ev.kind, ev.message, type(exc).__name__, exc)
