"""A real agent tick against a stand-in vLLM that serves pathological pages (issue 25.1, 25.5).

Before: one `+Inf` or `1e300` on the page failed every tick (OverflowError, or a whole tick SQLite refused), so GPU
and host rows stopped too; a page flapping between 500 and 200 wrote an outage and a recovery event per scrape.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp import web
from support.node import close_node, open_node, run_clock
from support.vllm_pages import sim_page
from support.web_app import serving

from lynxtop.agent.node import Node
from lynxtop.agent.sampling import ScrapeTarget

pytestmark = pytest.mark.timeout(90)


def _bent(page: str, values: dict[str, str]) -> str:
    """`page` with engine 0's sample of each named gauge set to a value as written."""
    out = []
    for line in page.splitlines():
        name = line.split("{")[0]
        if name in values and 'engine="0"' in line:
            line = f"{line.rpartition(' ')[0]} {values[name]}"
        out.append(line)
    return "\n".join(out) + "\n"


class Peer:
    """/metrics answers `pages` in turn (a str is a 200 page, an int an HTTP status)."""

    def __init__(self, pages: list[str | int]):
        self.pages = pages
        self.hits = 0

    async def metrics(self, request: web.Request) -> web.Response:
        answer = self.pages[self.hits % len(self.pages)]
        self.hits += 1
        if isinstance(answer, int):
            return web.Response(status=answer, text="internal error")
        return web.Response(text=answer)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        return app


def _node(tmp_path, h, url: str, scrape_interval_s: float) -> Node:
    node = open_node(h.write_config(tmp_path, f'sample_interval_s = 0.1\nscrape_interval_s = {scrape_interval_s}\n'
                                              'fake_nvml = "h200x8"'))
    assert node.scrape_source is not None
    node.scrape_source.target = lambda: ScrapeTarget(url, None, "run-1")
    return node


def _rows(h, node: Node, sql: str) -> list[dict]:
    node.writer.flush()
    return h.db_rows(node.writer.path, sql)


async def test_infinite_and_huge_values_cost_no_gpu_or_host_row(tmp_path, h):
    page = _bent(sim_page(8, seed=5), {"vllm:num_requests_waiting": "+Inf", "vllm:num_requests_running": "1e300",
                                       "vllm:kv_cache_usage_perc": "NaN"})
    peer = Peer([page])
    async with serving(peer.app()) as url:
        node = _node(tmp_path, h, url, 0.2)
        try:
            await run_clock(node, 2.5)
            t = node.ticker
            assert peer.hits >= 5 and t.failed_ticks == 0, (peer.hits, t.failed_ticks, t.last_tick_error)
            ticks = _rows(h, node, "SELECT count(*) AS n FROM host_samples")[0]["n"]
            assert ticks >= 15 and ticks == node.ticker.ticks
            assert _rows(h, node, "SELECT count(DISTINCT ts_ms) AS n FROM gpu_samples")[0]["n"] >= 15
            serving_rows = _rows(h, node, "SELECT * FROM serving_samples")
            assert len(serving_rows) >= 5 and all(r["scrape_ok"] == 1 for r in serving_rows)
            assert all(r["requests_running"] is None and r["requests_waiting"] is None for r in serving_rows)
            assert all(r["kv_cache_usage_pct"] is None for r in serving_rows)  # engine 0's NaN: no max
            assert serving_rows[-1]["generation_tokens"] is not None  # the rest of the page is read
            events = _rows(h, node, "SELECT kind, message FROM events WHERE kind LIKE 'scrape.%'")
            assert [e["kind"] for e in events] == ["scrape.bad_value"], events
            st = node.status()
            assert st.agent.store.dropped == 0
            body = json.dumps(st.to_json(), allow_nan=False)  # strict JSON: no Infinity or NaN token
            assert "1e+300" not in body
        finally:
            close_node(node)


async def test_a_flapping_page_writes_one_outage_event_not_one_per_scrape(tmp_path, h):
    peer = Peer([500, sim_page(8, seed=5)])
    async with serving(peer.app()) as url:
        node = _node(tmp_path, h, url, 0.1)
        try:
            await run_clock(node, 3.0)
            assert peer.hits >= 12, peer.hits
            failed = _rows(h, node, "SELECT count(*) AS n FROM serving_samples WHERE scrape_ok = 0")[0]["n"]
            assert failed >= 6  # every failed scrape is still in the history
            events = _rows(h, node, "SELECT kind, message FROM events WHERE kind LIKE 'scrape.%'")
            assert [e["kind"] for e in events] == ["scrape.outage"], events
            assert node.ticker.failed_ticks == 0
        finally:
            close_node(node)


@pytest.mark.timeout(600)
def test_memory_under_a_pathological_peer_stays_within_twice_the_normal_rss():
    """benchmarks/peer_memory.py: each peer in its own process, peak RSS against a normal DP=8 page's (issue 25.2)."""
    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "peer_memory.py"
    out = subprocess.run([sys.executable, str(bench), "--scrapes", "25"], capture_output=True, text=True,
                         timeout=580, check=True)
    lines = [json.loads(x) for x in out.stdout.strip().splitlines()]
    per = {r["mode"]: r for r in lines[:-1]}
    summary = lines[-1]
    print(summary)  # the report: pytest -s shows it
    assert set(per) == {"normal", "engines", "buckets", "churn", "inf", "version"}
    assert per["normal"]["ok_scrapes"] == 25 and per["inf"]["ok_scrapes"] == 25  # read, bad values left out
    assert per["engines"]["ok_scrapes"] == 0 and "over the cap" in per["engines"]["last_error"]
    assert per["buckets"]["events"] == ["scrape.over_limit"] and per["version"]["events"] == ["scrape.over_limit"]
    assert per["inf"]["events"] == ["scrape.bad_value"]
    assert summary["worst_ratio"] <= 2.0, summary
