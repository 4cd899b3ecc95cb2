"""Troubles that can repeat every scrape, reported once per episode with a count (issue 25.5).

A server that flaps (500, 200, 500, ...) or a proxy alternating between two backends would otherwise write one
event per scrape: 37 outage events in 18 s buried everything else in the event log. An episode opens at the
first occurrence (reported at once: the operator hears of it without delay), later ones are only counted, and
it ends once `quiet_s` pass without one; then one closing report gives the count, unless it happened only once.
The caller owns the clock (`now`: monotonic seconds, as the scraper's).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Closed:
    """An episode that ended with repeats: how often it happened, how many items in all, over how long."""

    times: int
    items: int
    span_s: float


class Recurring:
    """One kind of trouble: `hit` says whether to report it now, `close` whether an episode just ended."""

    def __init__(self, quiet_s: float):
        self.quiet_s = quiet_s
        self.times = 0  # occurrences in the open episode (0: none open)
        self.items = 0  # what they counted together (bad values, series, ...)
        self.total = 0  # items since this object started, across episodes
        self._first = 0.0
        self._last = 0.0

    @property
    def open(self) -> bool:
        return self.times > 0

    def hit(self, now: float, items: int = 1) -> bool:
        """Record one occurrence; True when it opens an episode (report it), False while one is open."""
        opened = self.times == 0
        if opened:
            self._first = now
            self.items = 0
        self.times += 1
        self.items += items
        self.total += items
        self._last = now
        return opened

    def close(self, now: float) -> Closed | None:
        """The episode's count when it ended (`quiet_s` without an occurrence) after more than one occurrence."""
        if self.times == 0 or now - self._last < self.quiet_s:
            return None
        times, items, span = self.times, self.items, self._last - self._first
        self.times = self.items = 0
        return Closed(times, items, round(span, 1)) if times > 1 else None
