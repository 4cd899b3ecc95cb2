"""View 3: latency percentiles over time against the SLA limits, breaches marked."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from lynxtop.contract.format import fmt_ms
from lynxtop.contract.quantile import judged as judgeable
from lynxtop.contract.quantile import lowest_bucket_column
from lynxtop.tui.glyphs import ascii_text
from lynxtop.tui.screens import VIEWS_CSS
from lynxtop.tui.screens.base import LiveScreen
from lynxtop.tui.widgets.node_header import sla_badge, sla_limit
from lynxtop.tui.widgets.serving_panel import NOT_SERVED
from lynxtop.tui.widgets.text_panel import update_static
from lynxtop.tui.widgets.time_chart import TimeChart

WINDOW_MS = 15 * 60 * 1000
# (series, stat, whether the chart draws the SLA's limit for the series)
CHARTS = (
    ("ttft", "p99", True),
    ("tpot", "p99", True),
    ("ttft", "p50", False),
    ("itl", "p99", False),
    ("e2e", "p99", False),
    ("queue", "p99", False),
    ("tpot", "p50", False),
    ("itl", "p50", False),
)


def breach_episodes(points: Sequence[tuple[int, float | None]], threshold: float, start_ms: int, end_ms: int,
                    scrape_ok: dict[int, float | None], window_ms: int) -> int:
    """Breach episodes within [start, end] as agent/metrics/sla.py opens them: a run of readings above the
    threshold is one, however long; a reading without latency data (an idle window) ends it, except a failed
    scrape (scrape_ok 0) less than one SLA window after the last reading, which holds it (the scraper's window
    still holds the breach's observations); so does a stretch without readings longer than the window."""
    episodes, above, last_ms = 0, False, None
    for ts, v in points:
        if not start_ms <= ts <= end_ms:
            continue
        if last_ms is not None and ts - last_ms >= window_ms:
            above = False  # nothing read for a whole window: what follows is a new breach
        if v is None:
            if scrape_ok.get(ts) != 0 or last_ms is None or ts - last_ms >= window_ms:
                above = False
            continue
        last_ms = ts
        if v > threshold and not above:
            episodes += 1
        above = v > threshold
    return episodes


def not_served_note(version: str | None, ascii_only: bool) -> str:
    """A chart's note for a series this vLLM does not serve: `n/s: not served by vLLM 0.10.2`, so its empty chart
    does not read as "no traffic". The version is vLLM's (GET /version): shown as plain text (the chart's title is
    a Text, never markup), each character that is no printable one (or no ASCII one in ASCII mode) as `?`, so a
    foreign string can neither break the title's line nor the ASCII drawing."""
    shown = "".join(c if c.isprintable() and (c.isascii() or not ascii_only) else "?" for c in version or "")
    return f"{NOT_SERVED}: not served by vLLM {shown or '(version unknown)'}"


class LatencyScreen(LiveScreen):
    CSS_PATH = VIEWS_CSS
    VIEW_TITLE = "Latency"

    def compose_body(self) -> ComposeResult:
        yield Static(id="sla-line")
        with VerticalScroll(id="latency-charts"):
            for series, stat, _ in CHARTS:
                yield TimeChart(f"{series.upper()} {stat}", fmt_ms, agg="max", ascii_only=self.lynx.ascii_only,
                                id=f"chart-{series}-{stat}", classes="latency-chart")

    def draw(self, now_ms: int) -> None:
        state = self.lynx.state
        sla = state.sla
        line = Text("SLA: ")
        line.append_text(sla_badge(sla))
        window = f"{sla.window_s:g} s windows" if sla.window_s is not None else "the SLA window"
        # Shorter words below 100 columns: the whole rule must fit 80 (the badge takes up to ~30).
        wide = self.size.width >= 100
        over = f"over {window}" if wide else f"per {window.replace(' windows', '')}"
        line.append(f"   TTFT p99 ≤ {fmt_ms(sla.ttft_threshold_ms)}, TPOT p99 ≤ "
                    f"{fmt_ms(sla.tpot_threshold_ms)} {over};"
                    + (" ▲ marks a breach; last 15 min" if wide else " ▲ breach"), style="dim")
        # only when changed: an idle node's same line is not sent again
        update_static(self.query_one("#sla-line", Static), ascii_text(line, self.lynx.ascii_only))
        ref = state.ts_ms
        end = int(ref or now_ms)
        scrape_ok = dict(state.serving_series("scrape_ok"))
        window_ms = int((sla.window_s or 60) * 1000)
        missing = state.serving.not_served  # empty unless it serves (agent/status_view.py with_not_served)
        note = not_served_note(state.serving.not_served_version, self.lynx.ascii_only) if missing else ""
        for series, stat, limited in CHARTS:
            chart = self.query_one(f"#chart-{series}-{stat}", TimeChart)
            points = state.serving_series(f"{series}_{stat}_ms")
            # each reading's lowest-bucket bound (same rows): at or below it a percentile reads `<bound`
            bounds = [b for _, b in state.serving_series(lowest_bucket_column(series))]
            lowest = next((b for b in reversed(bounds) if b is not None), None)
            limit = sla_limit(sla, series) if limited else None
            n = 0
            if limit is not None:  # counted as the agent does: a p99 it cannot judge is no reading of the limit
                judged = [(ts, judgeable(v, b, limit)) for (ts, v), b in zip(points, bounds, strict=True)]
                n = breach_episodes(judged, limit, end - WINDOW_MS, end, scrape_ok, window_ms)
            # a series this vLLM has no histogram for says so in its title: its empty chart is not "no traffic"
            chart.set_data(points, end - WINDOW_MS, end, threshold=limit, utc=self.lynx.utc, episodes=n, lowest=lowest,
                           note=note if series in missing else "")
