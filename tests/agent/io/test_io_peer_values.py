"""What a vLLM server sends is input (issue 25.1, 25.2, 25.5): values, sizes and repeats the scraper must bound.

Pages built with VllmPage (prometheus_client's own text) and then bent the way a broken or hostile server bends
them: +Inf and NaN gauges, 1e300 counts, 100k engines, 60k buckets, labels that change every scrape, a 20 MB
/version body, a page that flaps between 500 and 200 and a count that keeps going down. Every bad value becomes
NULL and is counted, every cap refuses with one event per episode, and nothing non-finite reaches JSON or CSV.
"""

from __future__ import annotations

import json
import math
import sqlite3

import aiohttp
import pytest
from agent_io_helpers import FakeController, VllmPage
from aiohttp import web
from support.web_app import serving

from lynxtop.agent.api.routes import ApiServer
from lynxtop.agent.metrics import continuity
from lynxtop.agent.metrics import page as page_mod
from lynxtop.agent.metrics.scrape import MetricsScraper
from lynxtop.agent.serving.health import MAX_BODY_BYTES, HttpClient
from lynxtop.contract.records import RunInfo
from lynxtop.store.export import build_query, write_csv
from lynxtop.store.reader import StoreReader
from lynxtop.store.writer import StoreWriter


def _strict(text: str) -> object:
    """json.loads as a strict (RFC 8259) parser reads it: NaN, Infinity and -Infinity are refused."""
    def refuse(token: str) -> object:
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def _page(**set_lines: str) -> str:
    """A two-engine page with some gauge lines of engine 0 replaced: name -> value as written."""
    page = VllmPage(engines=2)
    page.gen.labels(*page.lab(0)).inc(10)
    text = page.text()
    out = []
    for line in text.splitlines():
        name = line.split("{")[0]
        if name in set_lines and 'engine="0"' in line:
            line = f"{line.rpartition(' ')[0]} {set_lines[name]}"
        out.append(line)
    return "\n".join(out) + "\n"


def _kinds(events: list[dict]) -> list[str]:
    return [str(e["kind"]) for e in events]


def _told(s: MetricsScraper, now: float) -> list[dict]:
    """The scraper's events but scrape.not_served: these pages carry only a few families on purpose (each family a
    page lacks is named once a run since session 23: tests/agent/test_s23_vllm_drift.py)."""
    return [e for e in s.events(now) if str(e["kind"]) != "scrape.not_served"]


@pytest.mark.parametrize(("name", "value", "column"), [
    ("vllm:num_requests_waiting", "+Inf", "requests_waiting"),
    ("vllm:num_requests_waiting", "NaN", "requests_waiting"),
    ("vllm:num_requests_running", "1e300", "requests_running"),
    ("vllm:num_requests_running", "-Inf", "requests_running"),
    ("vllm:num_requests_running", "-3", "requests_running"),
    ("vllm:kv_cache_usage_perc", "+Inf", "kv_cache_usage_pct"),
    ("vllm:kv_cache_usage_perc", "7.5", "kv_cache_usage_pct"),
])
def test_a_bad_value_is_null_counted_and_told_once_per_episode(name, value, column):
    s = MetricsScraper("http://x:1/metrics")
    rows = [s.parse_page(_page(**{name: value}), now=float(t)) for t in range(5)]
    for row in rows:  # the page is read: only the bad column is no reading
        assert row["scrape_ok"] == 1 and row[column] is None, row
        assert all(v is None or math.isfinite(v) for v in row.values())
        assert all(isinstance(row[c], int) for c in ("requests_finished", "generation_tokens") if row[c] is not None)
    assert s.bad_values >= 5
    events = [ev for t in range(5) for ev in _told(s, float(t))]
    assert _kinds(events) == ["scrape.bad_value"], events  # one event for the episode, not one a page
    assert "no reading" in events[0]["message"] and events[0]["details"]["bad_values"] >= 1
    assert all(e["kv_cache_usage_pct"] is None or 0 <= e["kv_cache_usage_pct"] <= 100 for e in s.engines)
    assert all(e["running"] is None or isinstance(e["running"], int) for e in s.engines)
    _strict(json.dumps(s.engines))  # the status' per-engine loads serialise strictly
    s.parse_page(_page(), now=100.0)  # a good page after the quiet period: the episode closes with its count
    closing = _told(s, 100.0)
    assert _kinds(closing) == ["scrape.bad_value"] and closing[0]["details"]["pages"] == 5, closing


def test_an_infinite_counter_does_not_poison_the_window_or_the_lifetime_totals():
    s = MetricsScraper("http://x:1/metrics")
    page = VllmPage(engines=2)
    for t in range(4):
        page.gen.labels(*page.lab(0)).inc(10)
        text = page.text()
        if t == 2:  # engine 0's token counter reads +Inf on one page
            text = "\n".join(f"{ln.rpartition(' ')[0]} +Inf" if ln.startswith("vllm:generation_tokens_total{")
                             and 'engine="0"' in ln else ln for ln in text.splitlines()) + "\n"
        row = s.parse_page(text, now=float(t))
        assert row["scrape_ok"] == 1
        assert all(v is None or math.isfinite(v) for v in row.values()), row
    assert row["generation_tokens"] is not None and row["generation_tokens_per_s"] is not None
    assert math.isfinite(s.generation_tokens_total) and s.bad_values == 1


def test_a_count_going_down_on_every_page_is_one_reset_event_per_episode():
    """A proxy alternating between two backends: before, one `scrape.counter_reset` per page (22 in 11 s)."""
    big, small = VllmPage(engines=1), VllmPage(engines=1)
    big.gen.labels(*big.lab(0)).inc(1000)
    small.gen.labels(*small.lab(0)).inc(10)
    s = MetricsScraper("http://x:1/metrics")
    events = []
    for t in range(22):
        s.parse_page((big if t % 2 == 0 else small).text(), now=t * 0.5)
        events += _told(s, t * 0.5)
    assert s.resets == 11
    assert _kinds(events) == ["scrape.counter_reset"], events
    s.parse_page(small.text(), now=100.0)  # quiet since 10.5 s: the episode ends with its count
    closing = _told(s, 100.0)
    assert _kinds(closing) == ["scrape.counter_reset"] and closing[0]["details"]["pages"] == 11
    assert "11 pages" in closing[0]["message"]


def test_a_flapping_page_is_one_outage_and_one_recovery_with_the_count():
    s = MetricsScraper("http://x:1/metrics", settle_s=5.0)
    good = VllmPage(engines=1).text()
    events = []
    for t in range(37):  # 500, 200, 500, ... for 18 s
        now = t * 0.5
        if t % 2:
            s.parse_page(good, now=now)
        else:
            s.failed(now, "HTTP 500 from http://x:1/metrics")
        events += _told(s, now)
    assert _kinds(events) == ["scrape.outage"], events
    for t in range(12):  # readable from 18.5 s on
        s.parse_page(good, now=18.5 + t * 0.5)
        events += _told(s, 18.5 + t * 0.5)
    assert _kinds(events) == ["scrape.outage", "scrape.recovered"], events
    rec = events[1]["details"]
    assert rec["failed_scrapes"] == 19 and rec["flaps"] == 18 and rec["outage_s"] == pytest.approx(18.5)
    assert "flapped" in events[1]["message"]


def _engines_page(n: int) -> str:
    lines = ["# TYPE vllm:num_requests_running gauge"]
    lines += [f'vllm:num_requests_running{{engine="{e}",model_name="m"}} 1' for e in range(n)]
    return "\n".join(lines) + "\n"


def test_more_engines_than_the_cap_is_a_refused_page_with_one_event():
    s = MetricsScraper("http://x:1/metrics")
    assert s.parse_page(_engines_page(8), now=0.0)["requests_running"] == 8
    events = []
    for t in range(1, 4):
        row = s.parse_page(_engines_page(page_mod.MAX_ENGINES + 1), now=float(t))
        events += _told(s, float(t))
        assert row["scrape_ok"] == 0 and s.engines == []
    assert f"over the cap of {page_mod.MAX_ENGINES}" in s.last_error and "engine label values" in s.last_error
    assert _kinds(events) == ["scrape.outage"] and "over the cap" in events[0]["message"]  # once an episode


def test_a_page_of_100k_engines_is_refused_before_its_lines_are_split():
    """benchmarks/peer_memory.py's `engines` peer: the page is refused on its engine count before each of its
    100k lines is split into series and value (that split took the agent to 1.97x its normal peak RSS against
    the 2x bound; the parse's own peak was ~29 MiB, now ~12)."""
    import tracemalloc

    lines = ["# TYPE vllm:num_requests_running gauge"]
    lines += [f'vllm:num_requests_running{{engine="{e}",model_name="m"}} 1' for e in range(100_000)]
    text = "\n".join(lines) + "\n"
    tracemalloc.start()
    try:
        with pytest.raises(page_mod.PageError, match="engine label values, over the cap"):
            page_mod.parse_text(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20, f"{peak / 2**20:.1f} MiB"


def test_a_series_with_labels_longer_than_the_cap_refuses_the_page():
    long = "m" * (page_mod.MAX_LABELS_CHARS + 1)
    s = MetricsScraper("http://x:1/metrics")
    row = s.parse_page(f'vllm:num_requests_running{{model_name="{long}"}} 1\n', now=0.0)
    assert row["scrape_ok"] == 0 and f"over the cap of {page_mod.MAX_LABELS_CHARS}" in s.last_error
    assert all(len(k) <= page_mod.MAX_LABELS_CHARS + 200 for k in page_mod._KNOWN)  # never cached


def _bucket_page(buckets: int, count: int) -> str:
    les = [f"{(i + 1) * 0.001:.3f}" for i in range(buckets)] + ["+Inf"]
    lines = ["# TYPE vllm:e2e_request_latency_seconds histogram"]
    lines += [f'vllm:e2e_request_latency_seconds_bucket{{le="{le}"}} {count}' for le in les]
    lines += [f"vllm:e2e_request_latency_seconds_count {count}", f"vllm:e2e_request_latency_seconds_sum {count}",
              "# TYPE vllm:num_requests_running gauge", "vllm:num_requests_running 2"]
    return "\n".join(lines) + "\n"


def test_a_histogram_with_more_buckets_than_the_cap_is_left_out_with_one_event():
    s = MetricsScraper("http://x:1/metrics")
    events = []
    for t in range(5):
        row = s.parse_page(_bucket_page(page_mod.MAX_BUCKETS + 1, t), now=float(t))
        events += _told(s, float(t))
        assert row["scrape_ok"] == 1 and row["requests_running"] == 2 and row["e2e_p99_ms"] is None
    assert "e2e" not in s._windows.hists  # no window of 1000 buckets a scrape
    assert _kinds(events) == ["scrape.over_limit"], events
    assert f"over the cap of {page_mod.MAX_BUCKETS}" in events[0]["message"]
    s.parse_page(_bucket_page(20, 1), now=10.0)
    s.parse_page(_bucket_page(20, 3), now=11.0)
    assert s.parse_page(_bucket_page(20, 5), now=12.0)["e2e_p99_ms"] is not None  # within the cap: read


def test_labels_that_change_every_scrape_do_not_grow_the_scraper(monkeypatch):
    monkeypatch.setattr(continuity, "MAX_GONE", 50)
    s = MetricsScraper("http://x:1/metrics")
    for t in range(200):
        text = "".join(f'vllm:generation_tokens_total{{engine="{e}",id="{t}"}} {t}\n' for e in range(4))
        assert s.parse_page(text, now=float(t))["scrape_ok"] == 1
    corr = s._corrections.series[("counter", "generation_tokens")]
    assert len(corr._gone) <= 50


def _key_text_held(s: MetricsScraper) -> int:
    """Characters of series keys the scraper and the parse caches keep between pages."""
    from lynxtop.agent.metrics import promtext

    gone = sum(sum(map(len, c._gone)) for c in s._corrections.series.values())
    return gone + page_mod._known_chars[0] + promtext._valid_chars[0]


def test_a_dp8_page_whose_labels_change_every_scrape_keeps_a_few_mib_of_keys():
    """benchmarks/peer_memory.py's churn, without the RSS noise: every series of a DP=8 page new each scrape. The
    old caps (MAX_GONE 4096 a family over 29 families, 16 MiB per parse cache) let it keep 30+ MiB of key text,
    past 2x the normal RSS; now at most 8 MiB, while a normal page's keys are all kept."""
    from support.vllm_pages import sim_page

    base = sim_page(8, seed=5)
    s = MetricsScraper("http://x:1/metrics")
    most = 0
    for t in range(200):
        text = base.replace('engine="', f'scrape="{t:08d}-{"x" * 100}",engine="')
        assert s.parse_page(text, now=float(t))["scrape_ok"] == 1
        most = max(most, _key_text_held(s))
    assert most <= 8 << 20, most


def test_the_parse_caches_hold_the_keys_of_several_dp8_pages_at_once(monkeypatch):
    """The caps stay far above real pages: five DP=8 servers, each with a long model path, are all remembered."""
    from support.vllm_pages import sim_page

    from lynxtop.agent.metrics import promtext

    monkeypatch.setattr(page_mod, "_KNOWN", {})  # empty caches: what this test adds is all they hold
    monkeypatch.setattr(page_mod, "_known_chars", [0])
    monkeypatch.setattr(promtext, "_VALID", {})
    monkeypatch.setattr(promtext, "_valid_chars", [0])
    added = []
    for i in range(5):
        model = f"/models/org-{i}/" + "long-checkpoint-path/" * 7 + "DeepSeek-V4.1"
        text = sim_page(8, seed=5).replace("deepseek-ai/DeepSeek-V4.1", model)
        before = set(page_mod._KNOWN)
        assert MetricsScraper("http://x:1/metrics").parse_page(text, now=0.0)["scrape_ok"] == 1
        added.append(set(page_mod._KNOWN) - before)
    assert all(len(keys) > 1000 for keys in added)
    assert all(keys <= page_mod._KNOWN.keys() for keys in added)  # no cap was reached: nothing started over


@pytest.fixture
async def peer():
    state = {"version": b'{"version": "0.31.0"}', "health": b"{}"}

    async def version(request: web.Request) -> web.Response:
        return web.Response(body=state["version"], content_type="application/json")

    async def health(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()  # no Content-Length: the cap must hold while reading
        await resp.prepare(request)
        await resp.write(state["health"])
        return resp

    app = web.Application()
    app.router.add_get("/version", version)
    app.router.add_get("/health", health)
    async with serving(app) as url:
        yield url, state


async def test_version_and_health_bodies_over_the_cap_are_not_read(peer):
    url, state = peer
    http = HttpClient()
    try:
        assert await http.get(url + "/version") == (200, {"version": "0.31.0"})
        state["version"] = json.dumps({"version": "9" * (20 << 20)}).encode()  # 20 MB
        state["health"] = b'{"x": "' + b"y" * (MAX_BODY_BYTES + 10) + b'"}'
        for _ in range(3):
            assert await http.get(url + "/version") == (200, None)
            assert await http.get(url + "/health") == (200, None)
        events = http.drain_events()
        assert sorted(e["details"]["url"].rsplit("/", 1)[1] for e in events) == ["health", "version"], events
        assert all(e["kind"] == "scrape.over_limit" and str(MAX_BODY_BYTES) in e["message"] for e in events)
        assert http.drain_events() == []
        async with aiohttp.ClientSession() as session:
            assert await MetricsScraper(url).fetch_version(session) is None
            state["version"] = json.dumps({"version": "0.31.0\x1b[2J" + "x" * 200}).encode()  # small, not a version
            assert await MetricsScraper(url).fetch_version(session) is None
    finally:
        await http.close()


async def test_every_api_answer_is_strict_json(sock_dir):
    ctl = FakeController()
    ctl.runs = lambda limit: [RunInfo(7, pid_start_time=math.inf,  # type: ignore
                                      summary={"tokens_per_s": math.inf, "nested": [math.nan, 1.5]})]
    server = ApiServer(ctl, sock_dir / "agent.sock", group="users", log=lambda _: None)
    await server.start()
    try:
        connector = aiohttp.UnixConnector(path=str(sock_dir / "agent.sock"))
        async with aiohttp.ClientSession(connector=connector) as s, s.get("http://agent/v1/runs") as resp:
            assert resp.status == 200
            body = _strict(await resp.text())
    finally:
        await server.stop()
    assert body == {"runs": [RunInfo(7, summary={"tokens_per_s": None, "nested": [None, 1.5]}).to_json()]}


def test_csv_writes_an_empty_cell_for_an_infinite_value(tmp_path):
    db = tmp_path / "h.db"
    w = StoreWriter(str(db))
    w.close()
    with sqlite3.connect(db) as c:  # a value an older agent stored
        c.execute("INSERT INTO serving_samples (ts_ms, scrape_ok, kv_cache_usage_pct, ttft_p99_ms) "
                  "VALUES (1000, 1, ?, 12.5)", (math.inf,))
    reader = StoreReader(str(db))
    out = tmp_path / "s.csv"
    with out.open("w") as f:
        write_csv(reader, build_query("serving", "raw", 0, 10_000), f)
    head, line = out.read_text().splitlines()[:2]
    cells = dict(zip(head.split(","), line.split(","), strict=True))
    assert cells["kv_cache_usage_pct"] == "" and cells["ttft_p99_ms"] == "12.5", cells
    assert "Inf" not in line
