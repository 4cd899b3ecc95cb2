"""`lynxtop status` prints how many requests the window's percentiles come from, beside them: a `latency` line
`TTFT p50 625 ms p99 748 ms (1 req in 60 s: too few for a p99)`, and the SLA line says how many finished requests it
judged. A status without the counts (an older agent) prints the percentiles without them.

The status is the one the agent serves for pages read through its real scrape path (support/latency_pages.py): the
row, the scraper's counts for that row and the SLA tracker over it, answered on a real unix socket and read by the
real command.
"""

from __future__ import annotations

from typing import Any

from support.latency_pages import QUEUEING, LatencyPage
from support.status import status_json
from support.status_socket import status_text

from lynxtop.agent.metrics.scrape import MetricsScraper
from lynxtop.agent.metrics.sla import SlaTracker
from lynxtop.contract.config import SlaConfig


def _served(n: int, counts: bool = True) -> dict[str, Any]:
    page, scraper = LatencyPage(), MetricsScraper("http://127.0.0.1:8000", window_s=60)
    scraper.parse_page(page.text(), now=0.0)
    page.finish(n, QUEUEING)
    row = scraper.parse_page(page.text(), now=1.0)
    assert scraper.counted is not None and scraper.counted[0] is row
    tracker = SlaTracker(SlaConfig(ttft_p99_ms=2000, tpot_p99_ms=150, window_s=60))
    tracker.update(row, 1000)
    extra = {"window_counts": dict(scraper.counted[1]), "window_s": 60.0} if counts else {}
    return status_json(metrics=row, sla=tracker.state().to_json(), **extra)


def _line(out: str, head: str) -> str:
    return next((ln for ln in out.splitlines() if ln.startswith(head)), "")


def test_one_request_in_the_window_is_said_beside_the_percentiles(sock_dir, capsys):
    out = status_text(sock_dir, capsys, _served(1))
    line = _line(out, "latency  ")
    assert "TTFT p50 625 ms p99 748 ms (1 req in 60 s: too few for a p99)" in line, out
    assert "TPOT p50 37.5 ms p99 49.8 ms (1 req: too few for a p99)" in line, line
    assert "E2E p50 900 ms p99 998 ms (1 req: too few for a p99)" in line, line
    sla = _line(out, "SLA ")
    assert sla.endswith("window 60 s (1 finished request judged: no breach on fewer than 20)"), sla


def test_many_requests_are_counted_without_a_warning(sock_dir, capsys):
    out = status_text(sock_dir, capsys, _served(40))
    line = _line(out, "latency  ")
    assert "TTFT p50 625 ms p99 748 ms (40 req in 60 s)" in line and "too few" not in line, out
    assert _line(out, "SLA ").endswith("window 60 s (40 finished requests judged)"), out


def test_an_older_agents_status_prints_the_percentiles_alone(sock_dir, capsys):
    st = _served(1, counts=False)
    del st["sla"]["window_requests"]
    out = status_text(sock_dir, capsys, st)
    line = _line(out, "latency  ")
    assert "TTFT p50 625 ms p99 748 ms  " in line and "req" not in line, out
    assert _line(out, "SLA ").endswith("window 60 s"), out
