"""The troubles of one scraped server, told as events once per episode: outages, counter resets, bad values and
parts refused over a cap.

Owns the outage state (`in_outage`, `outage_started`/`outage_ended` of the last call, since when) and one
`Recurring` per kind of trouble. Invariants: an outage ends only once the page has been readable for `settle_s`
(a page flapping 500, 200, 500 is one outage and one recovery, with the count of failed scrapes); a trouble
repeating within QUIET_S is the same episode, told when it opens and counted in one closing event.
"""

from __future__ import annotations

from typing import Any

from lynxtop.agent.coalesce import Recurring
from lynxtop.contract.events import EventKind

SETTLE_S = 10.0  # an outage ends once the page has been readable this long: a flapping page is one episode
QUIET_S = 60.0  # a counter reset, bad values or a refused part: repeats within this are the same episode


class ScrapeEpisodes:
    """What the scraper's last call gave to tell, and the counts its events carry (`resets`, `bad_values`)."""

    def __init__(self, url: str, settle_s: float = SETTLE_S):
        self.url = url
        self.settle_s = settle_s
        self.last_error: str | None = None
        self.in_outage = False
        self.outage_started = False
        self.outage_ended = False
        self.outage_since: float | None = None
        self._readable_since: float | None = None  # first readable page of an outage not over yet
        self._outage_failures = 0  # failed scrapes of the open outage episode
        self._outage_flaps = 0  # times the page came back and failed again within that episode
        self._reset_ep = Recurring(QUIET_S)
        self._reset_opened = False  # the last page opened a reset episode: its event is due
        self._bad_ep = Recurring(QUIET_S)
        self._refused_ep: dict[str, Recurring] = {}  # per refused part
        self._notes: list[dict[str, Any]] = []  # events due besides the outage and reset ones
        self.resets = 0  # pages on which counters went down (server restarts behind the same URL), once per page
        self.reset_series: tuple[str, ...] = ()  # what went down on the last page read (empty: no reset)
        self.bad_values = 0  # values of read pages that were no reading, since this scraper started

    def failed(self, now: float, error: str) -> None:
        """A tick whose page could not be read: an outage opens, or the open one goes on (a flap if it was back)."""
        self.last_error = error
        self.outage_started = not self.in_outage
        self.outage_ended = False
        if not self.in_outage:
            self.in_outage = True
            self.outage_since = now
            self._outage_failures = self._outage_flaps = 0
        elif self._readable_since is not None:  # back for a while, failing again: the same episode
            self._outage_flaps += 1
        self._readable_since = None
        self._outage_failures += 1
        self._close_episodes(now)
        self._reset_opened = False
        self.reset_series = ()

    def readable(self, now: float, refused: list[str]) -> None:
        """A tick whose page was read; `refused`: the parts of it left out over a cap."""
        self.outage_started = self.outage_ended = False
        if self.in_outage:
            if self._readable_since is None:
                self._readable_since = now
            if now - self._readable_since >= self.settle_s:  # readable long enough: the episode is over
                self.in_outage = False
                self.outage_ended = True
        self.last_error = None
        self._close_episodes(now)
        for what in refused:
            ep = self._refused_ep.setdefault(what.split(" has ")[0], Recurring(QUIET_S))
            if ep.hit(now):
                self._notes.append({"kind": EventKind.SCRAPE_OVER_LIMIT, "severity": "warning",
                                    "message": f"vLLM page at {self.url}: {what} (docs/sampling.md, Caps)",
                                    "details": {"url": self.url, "refused": what}})

    def not_served(self, message: str, details: dict[str, Any]) -> None:
        """A family lynxtop reads is not on this run's page (agent/metrics/served.py tells each once a run)."""
        self._notes.append({"kind": EventKind.SCRAPE_NOT_SERVED, "severity": "warning", "message": message,
                            "details": details})

    def went_down(self, series: list[str], now: float) -> None:
        """The counters that went down on the page just read. One restart shows on every series at once: count
        the page, not the series."""
        self.reset_series = tuple(series)
        self._reset_opened = False
        if series:
            self.resets += 1
            self._reset_opened = self._reset_ep.hit(now)

    def count_bad(self, samples: int, example: str, columns: list[str], engines: int, now: float) -> None:
        """Bad values of this page (samples, row columns, per-engine loads): counted, and told once per episode."""
        n = samples + len(columns) + engines
        if not n:
            return
        self.bad_values += n
        if self._bad_ep.hit(now, n):
            what = [f"sample {example}"] if samples else []
            what += [f"column {c}" for c in columns[:3]] + ([f"{engines} per-engine values"] if engines else [])
            self._notes.append(self._bad_event(f"{n} values were no reading ({', '.join(what)})",
                                               {"values": n, "example": example or None, "columns": columns}))

    def _close_episodes(self, now: float) -> None:
        """The closing event of each repeated trouble whose episode just ended (nothing for a single one)."""
        done = self._reset_ep.close(now)
        if done is not None:
            self._notes.append({"kind": EventKind.SCRAPE_COUNTER_RESET, "severity": "warning",
                                "message": f"vLLM counters went down on {done.times} pages in {done.span_s:g} s at "
                                           f"{self.url}: a proxy alternating between backends, or a server "
                                           "restarting over and over; one event for the episode",
                                "details": {"url": self.url, "pages": done.times, "resets": self.resets,
                                            "span_s": done.span_s}})
        done = self._bad_ep.close(now)
        if done is not None:
            self._notes.append(self._bad_event(f"{done.items} values on {done.times} pages in {done.span_s:g} s "
                                               "were no reading", {"pages": done.times, "values": done.items,
                                                                    "span_s": done.span_s}))
        for ep in self._refused_ep.values():
            ep.close(now)  # a refusal is told once per episode; its repeats need no second event

    def _bad_event(self, what: str, details: dict[str, Any]) -> dict[str, Any]:
        return {"kind": EventKind.SCRAPE_BAD_VALUE, "severity": "warning",
                "message": f"vLLM page at {self.url}: {what} (not finite, or outside their column's range); "
                           f"stored as no reading, {self.bad_values} in all",
                "details": {"url": self.url, "bad_values": self.bad_values, **details}}

    def events(self, now: float) -> list[dict[str, Any]]:
        """What the last call gave to record: outage or recovery, counter reset, bad values, refused parts, and
        the closing count of an episode that repeated; each trouble once per episode."""
        out = [ev for ev in (self.outage_event(now), self.reset_event()) if ev is not None]
        out += self._notes
        self._notes = []
        return out

    def outage_event(self, now: float | None = None) -> dict[str, Any] | None:
        """An event dict (kind, severity, message, details) when the last call began or ended an outage."""
        if self.outage_started:
            return {"kind": EventKind.SCRAPE_OUTAGE, "severity": "warning",
                    "message": f"vLLM metrics unreadable: {self.last_error}",
                    "details": {"url": self.url, "error": self.last_error}}
        if self.outage_ended:
            end = self._readable_since if self._readable_since is not None else now
            lasted = None if end is None or self.outage_since is None else round(end - self.outage_since, 1)
            msg = "vLLM metrics readable again" + (f" after {lasted:g} s" if lasted is not None else "")
            if self._outage_flaps:
                msg += (f"; the page flapped: {self._outage_failures} failed scrapes, back and failing again "
                        f"{self._outage_flaps} times")
            return {"kind": EventKind.SCRAPE_RECOVERED, "severity": "info", "message": msg,
                    "details": {"url": self.url, "outage_s": lasted, "failed_scrapes": self._outage_failures,
                                "flaps": self._outage_flaps}}
        return None

    def reset_event(self) -> dict[str, Any] | None:
        """An event dict when the last page showed a counter reset and opened an episode: one per page, however
        many series went down (a restart resets every series at once), and none for the repeats of an episode
        (a proxy alternating between backends): those are counted in the episode's closing event."""
        if not self.reset_series or not self._reset_opened:
            return None
        n = len(self.reset_series)
        return {"kind": EventKind.SCRAPE_COUNTER_RESET, "severity": "warning",
                "message": f"vLLM counters went down at {self.url} ({n} series): the server restarted behind the "
                           "agent or a proxy switched backends; the window keeps the increases from before",
                "details": {"url": self.url, "series": list(self.reset_series), "resets": self.resets}}
