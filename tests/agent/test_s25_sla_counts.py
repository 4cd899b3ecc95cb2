"""The SLA's 20-request guard holds where vLLM's page has no finished-request counter, and the status says which
count it judged.

Session 24's guard (no breach opens on a p99 over fewer than 20 requests) counted the window's finished requests
from the rows' `requests_finished`; a page without vLLM's request counter (an older vLLM, a page missing that
family) left that count unknown, and the guard let a p99 of one slow request open a breach. Now the TTFT histogram's
window count (the requests the TTFT p99 came from) stands in, said as such in the status
(`sla.window_requests_source`: "finished" or "ttft"); with neither known a p99 past its limit is not judged and the
state says the count is unknown. Where the two counts differ (requests in flight: a first token, not finished yet),
`lynxtop status` names which count each line shows.

Real parts: pages of the simulator's vLLM metrics served over real HTTP, read by the sampling path's ScrapeSource
(the agent's scraper) and its SLA stage (SlaSource), the tracker reading the scrape source's window counts as the
agent wires it (agent/node.py); the status JSON round trip; `lynxtop status` over a real unix socket.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from support.latency_pages import QUEUEING, LatencyPage
from support.status import status_json
from support.status_socket import status_text
from support.web_app import metrics_app, serving

from lynxtop.agent.metrics.sla import COUNT_UNKNOWN, SlaTracker, counts_of
from lynxtop.agent.sampling import ScrapeSource, ScrapeTarget, SlaSource, Tick
from lynxtop.agent.serving.health import HttpClient
from lynxtop.contract.config import SlaConfig
from lynxtop.contract.status import SlaState, SlaStatus

pytestmark = pytest.mark.timeout(120)

SLOW = {**QUEUEING, "ttft_s": 5.0}  # TTFT 5 s: past a 2 s limit
COUNTER = "vllm:request_success"  # the _total counter and its _created samples


def _without_counter(text: str) -> str:
    """The page without vLLM's finished-request counter family (an older vLLM, a page missing it)."""
    return "".join(ln + "\n" for ln in text.splitlines() if COUNTER not in ln)


def _run(steps: list[tuple[int, dict[str, float] | None]], *, counter: bool, wired: bool,
         in_flight: int = 0) -> list[tuple[SlaStatus, list[str], dict[str, Any]]]:
    """A page read at t=1000 s, then for each step `n` requests finished with `times` and the page read again, a
    second apart; the SLA judged by the agent's SLA stage over the tick's row. `in_flight`: requests given a
    first token (TTFT observed) on every step that do not finish. Returns per step the SLA's state, its events'
    kinds, and the row."""
    sla = SlaTracker(SlaConfig(ttft_p99_ms=2000, tpot_p99_ms=150, window_s=60))
    stage = SlaSource(sla)

    async def go() -> list[tuple[SlaStatus, list[str], dict[str, Any]]]:
        lp, page, http = LatencyPage(), [""], HttpClient()
        out = []
        try:
            async with serving(metrics_app(page)) as url:
                src = ScrapeSource(http, lambda: ScrapeTarget(url + "/metrics", 1, "run-1"), window_s=60,
                                   timeout_s=5.0, hang_timeout_s=600.0, on_new_run=sla.reset,
                                   on_verdict=lambda v: None)
                if wired:
                    sla.counts = counts_of(src)  # as agent/node.py wires it
                for i, (n, times) in enumerate([(0, None), *steps]):
                    if n and times is not None:
                        lp.finish(n, times)
                    for _ in range(in_flight if i else 0):
                        lp.metrics.on_step({"running": 1, "waiting": 0, "kv": 0.1, "gen": 1,
                                            "first": [(1, QUEUEING["ttft_s"])], "itl": [], "fin": []})
                    text = lp.text()
                    page[0] = text if counter else _without_counter(text)
                    t = 1000.0 + i
                    tick = Tick(ts_ms=int(t * 1000), t0=t, deadline=time.monotonic() + 20, root=None, run_id=1)
                    rows, _ = await src.sample(tick)
                    tick.rows.update(rows)
                    _, events = stage.sample_now(tick)
                    if i:
                        out.append((sla.state(), [e.kind for e in events], rows["serving_row"]))
                src.close()
        finally:
            await http.close()
        return out

    return asyncio.run(go())


def test_without_the_request_counter_one_slow_request_opens_no_breach_and_enough_do():
    """The bug: a page without vLLM's finished-request counter, one request with TTFT 5 s against 2 s: the SLA
    opened a breach on it. Now the TTFT histogram's count (1) stands in: unknown, "1 (ttft)"; 30 more: a breach
    judged over 31, said as the TTFT count."""
    (one, one_ev, row), (many, many_ev, _) = _run([(1, SLOW), (30, SLOW)], counter=False, wired=True)
    assert row["requests_finished"] is None and row["ttft_p99_ms"] > 2000  # no counter: no finished count
    assert one_ev == [] and one.state == SlaState.UNKNOWN, (one, one_ev)
    assert one.window_requests == 1 and one.window_requests_source == "ttft"
    assert "fewer than 20" in one.reason, one.reason
    assert many_ev == ["sla.breach"] and many.state == SlaState.BREACH
    assert many.window_requests == 31 and many.window_requests_source == "ttft" and many.reason == ""
    back = SlaStatus.from_json(one.to_json())
    assert back.window_requests_source == "ttft" and back.reason == one.reason


def test_with_neither_count_known_a_p99_past_its_limit_is_not_judged():
    """No request counter on the page and no window counts to read (a tracker the scrape source's counts are not
    wired to): how many requests the p99 came from is unknown, and the status says so instead of a breach; a p99
    within its limit is still "ok" (every request seen was within it)."""
    (slow, ev, _), = _run([(40, SLOW)], counter=False, wired=False)
    assert ev == [] and slow.state == SlaState.UNKNOWN, (slow, ev)
    assert slow.window_requests is None and slow.window_requests_source is None
    assert slow.reason == COUNT_UNKNOWN and "unknown" in slow.reason
    (fast, ev, _), = _run([(40, QUEUEING)], counter=False, wired=False)
    assert ev == [] and fast.state == SlaState.OK and fast.reason == ""


def test_the_finished_count_is_judged_where_the_page_has_it():
    """With the counter the finished requests are the count, as in session 24: 10 finished of 40 given a first
    token (30 in flight) is too few for a breach, said as finished requests."""
    (st, ev, row), = _run([(10, SLOW)], counter=True, wired=True, in_flight=30)
    assert row["requests_finished"] == 10
    assert ev == [] and st.state == SlaState.UNKNOWN and st.window_requests == 10
    assert st.window_requests_source == "finished"


def _line(out: str, head: str) -> str:
    return next((ln for ln in out.splitlines() if ln.startswith(head)), "")


def _printed(sock_dir: Path, capsys: Any, name: str, status: dict[str, Any]) -> str:
    """`lynxtop status` for `status`, on a socket of its own (status_text leaves its socket file behind)."""
    (sock_dir / name).mkdir()
    return status_text(sock_dir / name, capsys, status)


def test_status_names_which_count_each_line_shows(sock_dir, capsys):
    """`lynxtop status`: the SLA line names the count it judged (finished requests, or requests with a first
    token where the page has no finished-request counter, or unknown), and the latency line says which count is
    which where TTFT's (first tokens) and the finished requests' differ (requests in flight)."""
    (st, _, row), = _run([(10, SLOW)], counter=True, wired=True, in_flight=30)
    counts = {"ttft": 40, "itl": 30, "tpot": 10, "e2e": 10, "queue": 10, "prefill": 10, "decode": 10}
    out = _printed(sock_dir, capsys, "a", status_json(metrics=row, sla=st.to_json(), window_counts=counts,
                                                      window_s=60.0))
    latency, sla = _line(out, "latency  "), _line(out, "SLA ")
    assert "(40 req in 60 s)" in latency and "(10 req: too few for a p99)" in latency, out
    assert latency.endswith("(TTFT counts requests given a first token, TPOT and E2E finished requests)"), latency
    assert sla.endswith("(10 finished requests judged: no breach on fewer than 20)"), sla

    (st, _, row), = _run([(25, SLOW)], counter=False, wired=True)
    out = _printed(sock_dir, capsys, "b", status_json(metrics=row, sla=st.to_json()))
    assert _line(out, "SLA ").endswith("(25 requests given a first token judged: the page has no finished-request "
                                       "counter)"), out

    (st, _, row), = _run([(25, SLOW)], counter=False, wired=False)
    out = _printed(sock_dir, capsys, "c", status_json(metrics=row, sla=st.to_json()))
    assert _line(out, "SLA ").endswith("(request count unknown: no breach judged)"), out


def test_the_dashboard_tooltip_names_the_count_the_sla_judged():
    """The Serving panel's `n=` tooltip said "finished request(s)" whatever the SLA counted: on a page without the
    finished-request counter it judged requests given a first token."""
    from lynxtop.contract.status import ServingStatus, SlaStatus
    from lynxtop.tui.widgets.serving_panel import few_text

    serving = ServingStatus(window_counts={"ttft": 3}, window_s=60.0)
    ttft = few_text(["TTFT n=3"], serving, SlaStatus(window_requests=3, window_requests_source="ttft"))
    assert "the SLA judged 3 request(s) given a first token" in ttft and "judged 3 finished" not in ttft
    done = few_text(["TTFT n=3"], serving, SlaStatus(window_requests=3, window_requests_source="finished"))
    assert "the SLA judged 3 finished request(s)" in done
    older = few_text(["TTFT n=3"], serving, SlaStatus(window_requests=3))  # an older agent: finished requests
    assert "the SLA judged 3 finished request(s)" in older
