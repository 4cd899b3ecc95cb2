"""The dashboard shows a percentile in its histogram's lowest bucket as the bound it is (`<300 ms`), not the figure
interpolation makes up (`p50 150 ms, p99 297 ms` of queueing with nothing queued); a real figure stays a figure.

The status is the one the agent serves for a page read through its real scrape path (support/latency_pages.py).
"""

from __future__ import annotations

import re

from support.latency_pages import IDLE_FAST, QUEUEING, scraped_row, served_status
from support.tui import make_app, screen_text, text_of, wait_for
from support.tui_keys import open_screen

from lynxtop.contract.config import SlaConfig
from lynxtop.tui.screens.latency import LatencyScreen
from lynxtop.tui.widgets.node_header import NodeHeader
from lynxtop.tui.widgets.serving_panel import ServingPanel
from lynxtop.tui.widgets.time_chart import TimeChart


def _line(text: str, label: str) -> str:
    """The line that names `label`, its runs of spaces made one."""
    return " ".join(next((ln for ln in text.splitlines() if re.search(rf"\b{label}\b", ln)), "").split())


async def test_nothing_queued_reads_as_below_the_lowest_bucket_in_the_serving_panel_and_latency_view(agent):
    agent.status = served_status(scraped_row(IDLE_FAST))
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        panel = app.screen.query_one(ServingPanel)
        await wait_for(pilot, lambda: " ms" in _line(text_of(panel), "QUEUE"))
        text = text_of(panel)
        queue = _line(text, "QUEUE")
        assert "p50 <300 ms" in queue and "p99 <300 ms" in queue, text
        assert "150" not in queue and "297" not in queue, queue
        assert "p50 <1.0 ms" in _line(text, "TTFT") and "p99 <10.0 ms" in _line(text, "TPOT"), text
        assert "p99 <300 ms" in _line(text, "E2E"), text
        await open_screen(pilot, app, "3", LatencyScreen)
        chart = app.screen.query_one("#chart-queue-p99", TimeChart)
        await wait_for(pilot, lambda: "now <300 ms" in text_of(chart))
        assert "297" not in _line(screen_text(app), "QUEUE p99"), screen_text(app)
        assert "now <10.0 ms" in text_of(app.screen.query_one("#chart-tpot-p99", TimeChart))


async def test_real_queueing_still_shows_the_interpolated_figures(agent):
    agent.status = served_status(scraped_row(QUEUEING))
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        panel = app.screen.query_one(ServingPanel)
        await wait_for(pilot, lambda: " ms" in _line(text_of(panel), "QUEUE"))
        queue = _line(text_of(panel), "QUEUE")
        assert "p50 650 ms p99 797 ms" in queue, queue
        assert "<" not in queue, queue
        await open_screen(pilot, app, "3", LatencyScreen)
        chart = app.screen.query_one("#chart-queue-p99", TimeChart)
        await wait_for(pilot, lambda: "now 797 ms" in text_of(chart))


async def test_a_limit_below_the_lowest_bound_is_not_marked_breached(agent):
    """TPOT p99 <10 ms against a 5 ms limit: the histogram cannot tell, so no ✗, no breach in the header."""
    agent.status = served_status(scraped_row(IDLE_FAST), SlaConfig(ttft_p99_ms=2000, tpot_p99_ms=5.0, window_s=60))
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        panel = app.screen.query_one(ServingPanel)
        await wait_for(pilot, lambda: " ms" in _line(text_of(panel), "TPOT"))
        tpot = _line(text_of(panel), "TPOT")
        assert "<10.0 ms" in tpot and "✗" not in tpot, tpot
        assert "SLA ✓ ok" in text_of(app.screen.query_one(NodeHeader))
        await open_screen(pilot, app, "3", LatencyScreen)
        chart = app.screen.query_one("#chart-tpot-p99", TimeChart)
        await wait_for(pilot, lambda: "now <10.0 ms" in text_of(chart))
        assert "limit 5.0 ms" in text_of(chart) and "▲" not in text_of(chart), text_of(chart)
