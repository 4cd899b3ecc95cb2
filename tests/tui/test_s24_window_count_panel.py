"""The Serving panel says when a row's percentiles come from a handful of requests: `n=1` beside the p99 of a window
holding one request (fewer than contract/status.py FEW_OBSERVATIONS: 20), in cells taken from that row's sparkline,
never a wider row; its tooltip says what n is, the rule and how many requests the SLA judged. A window of many
requests, or a status without the counts (an older agent), shows the rows as before.

The row and the counts are those the agent's real scraper makes of a vLLM 0.32 page as the simulator writes it, read
before and after the requests; the SLA is the agent's tracker over that row; served to the dashboard by the fake
agent over a status socket.
"""

from __future__ import annotations

import re
from typing import Any

from rich.cells import cell_len
from support.latency_pages import QUEUEING, LatencyPage
from support.status import status_json
from support.tui import make_app, text_of, wait_for

from lynxtop.agent.metrics.scrape import MetricsScraper
from lynxtop.agent.metrics.sla import SlaTracker
from lynxtop.contract.config import SlaConfig
from lynxtop.tui.widgets.serving_panel import ServingPanel


def _served(n: int) -> dict[str, Any]:
    """The status JSON of a window holding `n` requests, with the counts the agent serves beside the row."""
    page, scraper = LatencyPage(), MetricsScraper("http://127.0.0.1:8000", window_s=60)
    scraper.parse_page(page.text(), now=0.0)
    page.finish(n, QUEUEING)
    row = scraper.parse_page(page.text(), now=1.0)
    assert row["scrape_ok"] == 1 and row["ttft_p99_ms"] is not None
    assert scraper.counted is not None and scraper.counted[0] is row
    tracker = SlaTracker(SlaConfig(ttft_p99_ms=2000, tpot_p99_ms=150, window_s=60))
    tracker.update(row, 1000)
    return status_json(metrics=row, sla=tracker.state().to_json(), window_counts=dict(scraper.counted[1]),
                       window_s=60.0)


def _line(text: str, label: str) -> str:
    return " ".join(next((ln for ln in text.splitlines() if re.search(rf"\b{label}\b", ln)), "").split())


async def test_a_window_of_one_request_shows_n_1_without_widening_the_panel(agent):
    agent.status = _served(1)
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        panel = app.screen.query_one(ServingPanel)
        await wait_for(pilot, lambda: "n=1" in _line(text_of(panel), "TTFT"))
        text = text_of(panel)
        for label in ("TTFT", "TPOT", "E2E"):
            assert re.search(r"p99 \S+ ms .*n=1\b", _line(text, label)), (label, text)
        assert "n=3" in _line(text, "ITL"), text  # ITL counts inter-token intervals: 3 of one request
        width = panel.size.width
        assert all(cell_len(ln) <= width for ln in text.splitlines()), text
        tip = str(panel.tooltip)
        assert "n = requests in the 60 s window" in tip and "shown below 20" in tip, tip
        assert "TTFT n=1" in tip and "(ITL: inter-token intervals)" in tip, tip
        assert "the SLA judged 1 finished request(s) (no breach opens on fewer than 20)" in tip, tip
        # 40 requests: enough; nothing marked, no tooltip
        agent.status = _served(40)
        await wait_for(pilot, lambda: "n=" not in text_of(panel))
        assert panel.tooltip is None


async def test_a_narrow_panel_keeps_its_width_with_the_count(agent):
    agent.status = _served(1)
    app = make_app(agent.socket_path)
    async with app.run_test(size=(80, 24)) as pilot:
        panel = app.screen.query_one(ServingPanel)
        await wait_for(pilot, lambda: "n=1" in _line(text_of(panel), "TTFT"))
        width = panel.size.width
        assert all(cell_len(ln) <= width for ln in text_of(panel).splitlines()), text_of(panel)


async def test_without_the_counts_the_panel_is_as_before(agent):
    """An older agent's status: no counts, no `n=` and no tooltip, even over one request."""
    st = _served(1)
    del st["serving"]["window_counts"], st["serving"]["window_s"]
    agent.status = st
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        panel = app.screen.query_one(ServingPanel)
        await wait_for(pilot, lambda: " ms" in _line(text_of(panel), "TTFT"))
        assert "n=" not in text_of(panel) and panel.tooltip is None


def test_the_tooltip_reads_without_a_window_length():
    """An agent that sent counts but no window length: the line still reads as English."""
    from lynxtop.contract.status import ServingStatus, SlaStatus
    from lynxtop.tui.widgets.serving_panel import few_text

    text = few_text(["TTFT n=1"], ServingStatus(window_counts={"ttft": 1}), SlaStatus())
    assert text.startswith("n = requests in the window a row's p50/p99 come from"), text
    text = few_text(["TTFT n=1"], ServingStatus(window_counts={"ttft": 1}, window_s=60.0), SlaStatus())
    assert text.startswith("n = requests in the 60 s window"), text
