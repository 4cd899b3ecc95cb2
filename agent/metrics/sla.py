"""SLA state from the serving rows: p99 TTFT and p99 TPOT over the scraper's window against `[sla]` thresholds.

A breach and its end are one event each (not one per tick), carrying the worst value seen, so the event log
answers "how bad did it get and for how long" without a query over the samples.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from lynxtop.contract.columns import lowest_bucket_column
from lynxtop.contract.config import SlaConfig
from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.contract.format import fmt_ms
from lynxtop.contract.quantile import judged as judgeable
from lynxtop.contract.status import FEW_OBSERVATIONS, SLA_COUNT_UNKNOWN, SlaState, SlaStatus

# A p99 over fewer finished requests than this is one slow request, not a tail: a breach needs at least this many
# in the window (e.g. the first requests after READY, which pay for warm-up, opened a breach seconds after start).
MIN_REQUESTS = FEW_OBSERVATIONS  # 20: the dashboard and `lynxtop status` flag a p99 over fewer with its count
# which count `window_requests` is (SlaStatus.window_requests_source): the window's finished requests (vLLM's
# request counter, the rows' `requests_finished`), or, on a page without that counter, the TTFT histogram's window
# count (requests given a first token in the window: the count the TTFT p99 came from; requests in flight too)
FINISHED, FIRST_TOKENS = "finished", "ttft"
# why the state is unknown (SlaStatus.reason) where a p99 past its limit is not judged for its count
FEW = f"fewer than {MIN_REQUESTS} requests in the window: a p99 over them is a few requests, not a tail"
COUNT_UNKNOWN = SLA_COUNT_UNKNOWN
# why a breach ends without a judgement (`sla.unknown`)
NO_DATA = "no latency data in the window (idle, unreachable or stopped)"
UNJUDGED = ("p99 in the histogram's lowest bucket, whose bound is above the threshold: the histogram cannot tell "
            "which side of the threshold it is")


class SlaTracker:
    """Feed it every serving row; it answers the status object's "sla" and emits breach/recovery events.

    TPOT is vLLM's per-request time per output token; vLLM < 0.11 has no such histogram, and there the
    inter-token latency (the same quantity per step) stands in, named in the state as `tpot_source`.
    A window without latency data (idle server, unreadable page, serving stopped) is "unknown" and ends an open
    breach as `sla.unknown` ("no longer judged"), never `sla.recovered`, which only data within the limits tells;
    with one exception: an unreadable page (a failed scrape, e.g. vLLM restarting behind the agent) holds an open breach
    for up to one window after the last latency reading, because the scraper's window still holds those
    observations and shows them again when the page comes back; closing on the first failed scrape split one
    breach into breach / "no latency data" / breach.

    A p99 in its histogram's lowest bucket is only known to be at most that bucket's bound (contract/quantile.py):
    against a threshold at or above the bound it is within (never a breach); against a threshold below the bound
    the histogram cannot tell, and that p99 is not judged, as if absent: the other one decides, and with neither
    the state is unknown (an open breach ends as `sla.unknown`, not as recovered). The interpolated 9.9 ms of a
    TPOT of 4 ms against a 5 ms limit opened a breach of a server within its limit.

    No breach opens on a p99 over fewer than MIN_REQUESTS requests, counted as the window's finished requests; on
    a page without vLLM's finished-request counter the TTFT histogram's window count stands in (`counts`: the
    scrape source's counts of the row, wired by agent/node.py), and with neither known a p99 past its limit is not
    judged ("unknown", the reason saying so): without the stand-in the guard let one slow request open a breach.
    """

    def __init__(self, cfg: SlaConfig, counts: Callable[[Mapping[str, Any]], Mapping[str, int] | None] | None = None):
        self.cfg = cfg
        # the window counts of a serving row (ServingWindows.counts, as `counts_of` reads them); None: none read
        self.counts = counts
        self._state = "unknown"
        self._since_ms: int | None = None
        self._ttft: float | None = None
        self._tpot: float | None = None
        self._lowest: dict[str, float | None] = {}  # each p99's lowest bucket bound, "ttft" and "tpot"
        self._tpot_source = "tpot"
        self._breached: list[str] = []
        self._worst: dict[str, float] = {}
        self._breach_started_ms: int | None = None
        self._last_data_ms: int | None = None  # the last row with a latency figure
        self._finished: deque[tuple[int, int]] = deque()  # (ts_ms, requests finished in that tick) in the window
        self._finished_sum = 0  # their sum, kept as rows come and go: not a walk over the window each row
        self._judged: tuple[int | None, str | None] = (None, None)  # the last row's count and which count it is
        self._why = ""  # why the state is unknown (SlaStatus.reason); "" otherwise

    def reset(self) -> None:
        """A new run: drop the state without an event (the run change is its own event)."""
        self._state, self._since_ms, self._ttft, self._tpot = "unknown", None, None, None
        self._lowest = {}
        self._breached, self._worst, self._breach_started_ms = [], {}, None
        self._last_data_ms = None
        self._finished.clear()
        self._finished_sum = 0
        self._judged, self._why = (None, None), ""

    def requests_in_window(self) -> int | None:
        """Finished requests the window's rows counted; None when no row said (a page without the counter)."""
        return self._finished_sum if self._finished else None

    def _window_count(self, row: Mapping[str, Any]) -> tuple[int | None, str | None]:
        """The requests the window's p99s come from and which count that is: the finished requests where the rows
        say them, else the TTFT histogram's window count of this row; (None, None) where neither is known."""
        finished = self.requests_in_window()
        if finished is not None:
            return finished, FINISHED
        counts = self.counts(row) if self.counts is not None else None
        n = counts.get("ttft") if counts is not None else None
        if type(n) is int and n >= 0:
            return n, FIRST_TOKENS
        return None, None

    def _count(self, row: dict[str, Any], ts_ms: int) -> None:
        n = row.get("requests_finished")
        if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
            self._finished.append((ts_ms, n))
            self._finished_sum += n  # ints: exact, whatever the order
        while self._finished and self._finished[0][0] <= ts_ms - self.cfg.window_s * 1000:
            self._finished_sum -= self._finished.popleft()[1]

    def update(self, serving_row: dict[str, Any] | None, ts_ms: int) -> list[Event]:
        row = serving_row or {}
        self._count(row, ts_ms)
        self._judged = self._window_count(row)
        ttft = row.get("ttft_p99_ms")
        tpot = row.get("tpot_p99_ms")
        self._tpot_source = "tpot"
        if tpot is None and row.get("itl_p99_ms") is not None:
            tpot, self._tpot_source = row.get("itl_p99_ms"), "itl"
        self._ttft, self._tpot = ttft, tpot
        self._lowest = {"ttft": row.get(lowest_bucket_column("ttft")),
                        "tpot": row.get(lowest_bucket_column(self._tpot_source))}
        if ttft is None and tpot is None:
            if self._state == "breach" and row.get("scrape_ok") == 0 and self._last_data_ms is not None \
                    and ts_ms - self._last_data_ms < self.cfg.window_s * 1000:
                return []  # unreadable for now, but the window still holds the breach's observations
            return self._to_unknown(ts_ms)
        self._last_data_ms = ts_ms
        # what the histograms can judge: a p99 known only as below a bound over its threshold is left out
        ttft = judgeable(ttft, self._lowest["ttft"], self.cfg.ttft_p99_ms)
        tpot = judgeable(tpot, self._lowest["tpot"], self.cfg.tpot_p99_ms)
        if ttft is None and tpot is None:
            return self._to_unknown(ts_ms, UNJUDGED)

        breached = []
        if ttft is not None and ttft > self.cfg.ttft_p99_ms:
            breached.append("ttft")
        if tpot is not None and tpot > self.cfg.tpot_p99_ms:
            breached.append("tpot")
        events: list[Event] = []
        seen = self._judged[0]
        if breached and self._state != "breach" and (seen is None or seen < MIN_REQUESTS):
            # too few requests for a tail, or a count unknown: neither a breach nor "ok" over a p99 past its
            # limit, until enough are counted
            if self._state != "unknown":
                self._state, self._since_ms = "unknown", ts_ms
            self._why = COUNT_UNKNOWN if seen is None else FEW
            return events
        self._why = ""
        if breached:
            if self._state != "breach":
                self._state, self._since_ms, self._breach_started_ms = "breach", ts_ms, ts_ms
                self._worst = {}
                self._note_worst(ttft, tpot)
                self._breached = breached
                events.append(self._event(EventKind.SLA_BREACH, Severity.WARNING, ts_ms, self._describe(breached)))
            else:
                self._note_worst(ttft, tpot)
                self._breached = sorted(set(self._breached) | set(breached))
        elif self._state == "breach":
            events.append(self._recovery(ts_ms, "back within thresholds"))
            self._state, self._since_ms = "ok", ts_ms
        elif self._state != "ok":
            self._state, self._since_ms = "ok", ts_ms
        return events

    def state(self) -> SlaStatus:
        breach = self._state == "breach"
        return SlaStatus(
            state=SlaState(self._state), since_ms=self._since_ms, ttft_p99_ms=self._ttft, tpot_p99_ms=self._tpot,
            ttft_threshold_ms=self.cfg.ttft_p99_ms, tpot_threshold_ms=self.cfg.tpot_p99_ms,
            window_s=self.cfg.window_s, tpot_source=self._tpot_source,
            breached=tuple(self._breached) if breach else (),
            worst_ttft_p99_ms=self._worst.get("ttft") if breach else None,
            worst_tpot_p99_ms=self._worst.get("tpot") if breach else None,
            ttft_lowest_bucket_ms=self._lowest.get("ttft"), tpot_lowest_bucket_ms=self._lowest.get("tpot"),
            window_requests=self._judged[0], window_requests_source=self._judged[1],
            reason=self._why if self._state == "unknown" else "",
        )

    # ------------------------------------------------------------------------------------------ helpers

    def _to_unknown(self, ts_ms: int, why: str = NO_DATA) -> list[Event]:
        events = []
        if self._state == "breach":
            events.append(self._recovery(ts_ms, why, judged=False))
        if self._state != "unknown":
            self._state, self._since_ms = "unknown", ts_ms
        self._why = why
        return events

    def _note_worst(self, ttft: float | None, tpot: float | None) -> None:
        for key, v in (("ttft", ttft), ("tpot", tpot)):
            if v is not None and v > self._worst.get(key, float("-inf")):
                self._worst[key] = v

    def _describe(self, which: list[str]) -> str:
        parts = []
        for key in which:
            value = self._worst.get(key)
            if value is None:
                continue
            limit = self.cfg.ttft_p99_ms if key == "ttft" else self.cfg.tpot_p99_ms
            label = "TTFT" if key == "ttft" else ("TPOT" if self._tpot_source == "tpot" else "ITL (as TPOT)")
            parts.append(f"p99 {label} {fmt_ms(value, decimals=0)} > {fmt_ms(limit, decimals=0)}")
        return ", ".join(parts)

    def _recovery(self, ts_ms: int, why: str, judged: bool = True) -> Event:
        """The end of a breach: `sla.recovered` when the data shows latency back within the limits (`judged`);
        `sla.unknown` when there is no data to judge by (idle, unreachable, serving stopped): read at 3 a.m.,
        "recovered" there would say the latency came back, which nothing showed."""
        lasted = (ts_ms - self._breach_started_ms) / 1000 if self._breach_started_ms is not None else None
        worst = self._describe(self._breached)
        if judged:
            kind, head = EventKind.SLA_RECOVERED, f"SLA breach ended ({why})"
        else:
            kind, head = EventKind.SLA_UNKNOWN, f"SLA breach no longer judged: {why}"
        msg = f"{head} after {lasted:.0f} s; worst: {worst}" if lasted is not None else f"{head}; worst: {worst}"
        ev = self._event(kind, Severity.INFO, ts_ms, msg, duration_s=lasted, reason=why)
        self._breached = []
        return ev

    def _event(self, kind: EventKind, severity: Severity, ts_ms: int, text: str, **extra: Any) -> Event:
        """One event (the run id is the caller's to add: agent/sampling.py)."""
        message = f"SLA breach: {text}" if kind == EventKind.SLA_BREACH else text
        details = {
            "breached": list(self._breached),
            "worst_ttft_p99_ms": self._worst.get("ttft"),
            "worst_tpot_p99_ms": self._worst.get("tpot"),
            "ttft_p99_ms": self._ttft,
            "tpot_p99_ms": self._tpot,
            "ttft_threshold_ms": self.cfg.ttft_p99_ms,
            "tpot_threshold_ms": self.cfg.tpot_p99_ms,
            "window_s": self.cfg.window_s,
            "tpot_source": self._tpot_source,
            **extra,
        }
        return Event(kind, severity, message, details=details, ts_ms=ts_ms)


def counts_of(source: Any) -> Callable[[Mapping[str, Any]], Mapping[str, int] | None]:
    """The window counts of a serving row as the scrape source's scraper computed them for that very row
    (`MetricsScraper.counted`, as agent/status_view.py reads them): None for any other row (a failed page's, an
    older one), so a count never stands beside another page's percentiles. For `SlaTracker.counts`."""
    def counts(row: Mapping[str, Any]) -> Mapping[str, int] | None:
        counted = getattr(getattr(source, "scraper", None), "counted", None)
        return counted[1] if counted is not None and counted[0] is row else None
    return counts
