"""`lynxtop status` shows a p99 in its histogram's lowest bucket as the bound it is (`<10 ms`), never the
interpolated figure (`9.9 ms`); a p99 in a higher bucket stays a figure.

The status is the one the agent serves for a page read through its real scrape path (support/latency_pages.py),
answered on a real unix socket and read by the real command.
"""

from __future__ import annotations

from support.latency_pages import IDLE_FAST, QUEUEING, scraped_row, served_status
from support.status_socket import status_text


def _sla_line(out: str) -> str:
    return next(ln for ln in out.splitlines() if ln.startswith("SLA "))


def test_status_shows_p99s_in_the_lowest_bucket_as_bounds(sock_dir, capsys):
    line = _sla_line(status_text(sock_dir, capsys, served_status(scraped_row(IDLE_FAST))))
    assert "p99 TTFT <1 ms (<= 2.00 s)" in line and "p99 TPOT <10 ms (<= 150 ms)" in line, line
    assert "SLA      OK" in line


def test_status_shows_p99s_above_the_lowest_bucket_as_figures(sock_dir, capsys):
    line = _sla_line(status_text(sock_dir, capsys, served_status(scraped_row(QUEUEING))))
    assert "p99 TTFT 748 ms (<= 2.00 s)" in line and "p99 TPOT 50 ms (<= 150 ms)" in line, line
