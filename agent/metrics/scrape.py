"""Reads vLLM's Prometheus page once per tick and turns it into one `serving` row (contract/columns.py).

vLLM's page changes between versions (0.10 prints old and new names, later versions drop the old ones) and
carries one series per data-parallel engine, so everything is matched by exact sample name, summed over
labels (max for the KV-cache gauge), and percentiles come from bucket differences over a sliding window
(agent/metrics/histogram.py). The scraper keeps state between calls; the caller owns the clock (`now`, monotonic s).

`MetricsScraper` only wires the jobs, each in its own module: the GET with its limits (fetch.py), the parse of
the families used (families.py, page.py, promtext.py), per-series reset correction and counter windows
(continuity.py), the sliding windows and the columns they give (windows.py, histogram.py), the row handed to the
writer (row.py) and the events told once per episode (episodes.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from lynxtop.agent.metrics.continuity import ResetCorrections
from lynxtop.agent.metrics.episodes import SETTLE_S, ScrapeEpisodes
from lynxtop.agent.metrics.fetch import PageFetcher
from lynxtop.agent.metrics.histogram import HistogramSnapshot
from lynxtop.agent.metrics.layout import PageLayout
from lynxtop.agent.metrics.page import PageError, ParsedPage, parse_text
from lynxtop.agent.metrics.row import checked, empty_row, engine_loads
from lynxtop.agent.metrics.served import NotServed
from lynxtop.agent.metrics.windows import ServingWindows

INLINE_PARSE_CHARS = 1024 * 1024  # larger pages are parsed in a worker thread


class MetricsScraper:
    """Scrapes one vLLM server. After each call: `outage_started`/`outage_ended` (one event per outage episode),
    `reset_series` (the counters that went down on this page), `generation_tokens_total` and `requests_running`
    (for hang detection), `last_error`; `events(now)` gives what to record, each trouble once per episode.

    An outage ends once the page has been readable for `settle_s`: a page that flaps (500, 200, 500) is one
    outage and one recovery, with the count of failed scrapes, not an event per scrape."""

    def __init__(self, url: str, window_s: float = 60.0, timeout_s: float = 2.0, settle_s: float = SETTLE_S):
        self._fetch = PageFetcher(url, timeout_s)
        self._layout = PageLayout()  # the last page's layout: a page laid out alike is read by position
        self.window_s = window_s
        self.scrape_errors = 0
        self._episodes = ScrapeEpisodes(self._fetch.url, settle_s)
        self._windows = ServingWindows(window_s)
        self._corrections = ResetCorrections()
        self.generation_tokens_total: float | None = None
        self.requests_running: int | None = None
        self.engines: list[dict[str, Any]] = []  # per data-parallel engine: running, waiting, KV % of the last page
        # the last page read and its sums corrected for resets: what agent/metrics/lifetime.py adds up over runs
        self.totals: tuple[ParsedPage, dict[str, float], dict[str, HistogramSnapshot]] | None = None
        self._not_served = NotServed(self._fetch.url)
        self._version_asked = False  # GET /version is read once a run, and only to name a missing family's version
        # the last row read from a page and its latency windows' observation counts (ServingWindows.counts): the
        # status shows the counts only beside that row's percentiles (agent/status_view.py with_window_counts)
        self.counted: tuple[dict[str, Any], dict[str, int]] | None = None

    def reset(self) -> None:
        """Forget history (a new run): the next scrape only sets baselines."""
        self._windows.clear()
        self._corrections = ResetCorrections()
        self._episodes.reset_series = ()
        self.generation_tokens_total = None
        self.requests_running = None
        self._not_served = NotServed(self._fetch.url)  # a new run may be another vLLM version
        self._version_asked = False
        self.counted = None

    # ------------------------------------------------------------------------------------------ what it shows

    @property
    def url(self) -> str:
        """The page read: the server's /metrics."""
        return self._fetch.url

    @property
    def base_url(self) -> str:
        """The server (GET /version is read there)."""
        return self._fetch.base_url

    @property
    def vllm_version(self) -> str | None:
        """The version of the vLLM serving the page, where known (GET /version, or told by the caller)."""
        return self._not_served.version

    @vllm_version.setter
    def vllm_version(self, version: str | None) -> None:
        self._not_served.version = version

    @property
    def not_served(self) -> dict[str, str]:
        """The quantities lynxtop reads that the last clean page lacked (not served by this vLLM version), each
        with the message naming the families looked for, the version and the columns left empty."""
        return dict(self._not_served.missing)

    @property
    def last_error(self) -> str | None:
        """Why the last page was not read; None if it was."""
        return self._episodes.last_error

    @property
    def in_outage(self) -> bool:
        return self._episodes.in_outage

    @property
    def outage_started(self) -> bool:
        return self._episodes.outage_started

    @property
    def outage_ended(self) -> bool:
        return self._episodes.outage_ended

    @property
    def outage_since(self) -> float | None:
        return self._episodes.outage_since

    @property
    def resets(self) -> int:
        """Pages on which counters went down."""
        return self._episodes.resets

    @property
    def reset_series(self) -> tuple[str, ...]:
        """What went down on the last page."""
        return self._episodes.reset_series

    @property
    def bad_values(self) -> int:
        """Values of read pages that were no reading."""
        return self._episodes.bad_values

    def events(self, now: float) -> list[dict[str, Any]]:
        """What the last call gave to record: outage or recovery, counter reset, bad values, refused parts, and
        the closing count of an episode that repeated; each trouble once per episode."""
        return self._episodes.events(now)

    def outage_event(self, now: float | None = None) -> dict[str, Any] | None:
        """An event dict (kind, severity, message, details) when the last call began or ended an outage."""
        return self._episodes.outage_event(now)

    def reset_event(self) -> dict[str, Any] | None:
        """An event dict when the last page showed a counter reset and opened an episode (episodes.py)."""
        return self._episodes.reset_event()

    # ------------------------------------------------------------------------------------------ I/O

    async def scrape(self, session: aiohttp.ClientSession, now: float) -> dict[str, Any]:
        """GET /metrics and return the tick's serving row (run_id left None for the caller)."""
        body = await self._fetch.get(session)
        if isinstance(body, str):
            return self.failed(now, body)
        text = body.decode("utf-8", errors="replace")
        try:
            if len(text) <= INLINE_PARSE_CHARS:
                page = self._layout.parse(text)  # ~1-2 ms at DP=8: less than a thread's hand-over and back
            else:
                # a huge page must not hold the event loop; nor is its layout kept (one thread reads it)
                page = await asyncio.to_thread(parse_text, text)
        except PageError as exc:
            return self.failed(now, f"malformed page at {self.url}: {exc}")
        row = self._accept(page, now)
        if self._not_served.pending and self.vllm_version is None and not self._version_asked:
            self._version_asked = True  # the version names what is missing: asked once, never every scrape
            try:  # naming the version never costs the page its row (no session: the page read without one)
                self.vllm_version = await self.fetch_version(session) if session is not None else None
            except Exception:  # noqa: BLE001 - an unforeseen failure of an optional read: the version stays unknown
                self.vllm_version = None
        self._tell_not_served()
        return row

    def close(self) -> None:
        """Drop the page's kept connection (the scraper replaced by a new run's, or the agent stopping)."""
        self._fetch.close()

    async def fetch_version(self, session: aiohttp.ClientSession) -> str | None:
        """vLLM's version from GET /version, or None when it cannot be read (or is not one: agent/serving/health.py)."""
        return await self._fetch.version(session)

    # ------------------------------------------------------------------------------------------ rows

    def failed(self, now: float, error: str) -> dict[str, Any]:
        """The row of a tick whose page could not be read: NULL metrics, the error counted."""
        self.scrape_errors += 1
        self._episodes.failed(now, error)
        self.requests_running = None
        self.engines = []
        row = empty_row()
        row["scrape_ok"] = 0
        row["scrape_errors"] = self.scrape_errors
        return row

    def parse_page(self, text: str, now: float) -> dict[str, Any]:
        """Turn one page into the tick's row; a malformed page gives a failed row (see `failed`)."""
        try:
            page = self._layout.parse(text)
        except PageError as exc:
            return self.failed(now, f"malformed page at {self.url}: {exc}")
        row = self._accept(page, now)
        self._tell_not_served()
        return row

    def _tell_not_served(self) -> None:
        """Each family first found missing in this run, once (agent/metrics/served.py): a `scrape.not_served`
        event among the scraper's `events` (the sampling path records it; the sink's one journal line)."""
        for key, msg in self._not_served.messages():
            self._episodes.not_served(msg, self._not_served.details(key))

    def _accept(self, page: ParsedPage, now: float) -> dict[str, Any]:
        self._episodes.readable(now, page.refused)
        row = empty_row()
        row["scrape_ok"] = 1
        row["scrape_errors"] = self.scrape_errors
        counters, hists, went_down = self._corrections.corrected(page)
        counters, hists = self._windows.add(page.stale, counters, hists, now, went_down)
        self.totals = (page, counters, hists)
        self._not_served.check(page)
        self._windows.counter_columns(row)
        row["requests_running"] = page.gauges.get("running")
        row["requests_waiting"] = page.gauges.get("waiting")
        kv = page.gauges.get("kv_usage")
        row["kv_cache_usage_pct"] = None if kv is None else 100.0 * kv
        self.engines, bad_engines = engine_loads(page.engines)
        self._episodes.went_down(went_down, now)
        self._windows.latency_columns(row)
        self.counted = (row, self._windows.counts)
        bad_columns = checked(row)
        self._episodes.count_bad(page.bad_values, page.bad_example, bad_columns, bad_engines, now)
        self.generation_tokens_total = page.counters.get("generation_tokens")
        self.requests_running = row["requests_running"]
        return row

