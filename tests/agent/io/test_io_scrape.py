"""The /metrics scraper against pages from a real prometheus_client registry with vLLM's names, and over HTTP."""

from __future__ import annotations

import asyncio
import math

import aiohttp
import pytest
from agent_io_helpers import VllmPage
from aiohttp import web
from prom_reference import Series, increase
from support.web_app import serving

from lynxtop.agent.metrics import continuity, episodes, fetch
from lynxtop.agent.metrics import scrape as scrape_mod
from lynxtop.agent.metrics.histogram import bucket_quantile
from lynxtop.agent.metrics.scrape import MetricsScraper, parse_text
from lynxtop.contract.columns import SERVING_METRICS, names


def test_row_has_every_serving_column_and_first_scrape_sets_baselines():
    page = VllmPage()
    s = MetricsScraper("http://127.0.0.1:8000")
    row = s.parse_page(page.text(), now=0.0)
    assert set(row) == set(names(SERVING_METRICS))
    assert row["scrape_ok"] == 1 and row["scrape_errors"] == 0
    assert row["run_id"] is None  # the caller fills it
    # no previous scrape: no rates and no window, never a fake 0
    assert row["requests_per_s"] is None and row["generation_tokens"] is None and row["ttft_p99_ms"] is None
    assert row["requests_running"] == 0  # a gauge is a reading even on the first scrape


def test_sums_over_engines_max_for_kv_and_rates_per_tick():
    page = VllmPage(engines=2)
    s = MetricsScraper("http://x:1/metrics")
    page.gen.labels(*page.lab(0)).inc(1000)
    s.parse_page(page.text(), now=10.0)
    page.gen.labels(*page.lab(0)).inc(300)
    page.gen.labels(*page.lab(1)).inc(100)
    page.prompt.labels(*page.lab(1)).inc(2000)
    page.success.labels(*page.lab(0), "stop").inc(3)
    page.success.labels(*page.lab(1), "length").inc(1)
    page.preempt.labels(*page.lab(1)).inc(2)
    page.running.labels(*page.lab(0)).set(5)
    page.running.labels(*page.lab(1)).set(7)
    page.waiting.labels(*page.lab(1)).set(4)
    page.waiting_by_reason.labels(*page.lab(1), "capacity").set(99)  # prefix of num_requests_waiting: not summed
    page.kv["new"].labels(*page.lab(0)).set(0.25)
    page.kv["new"].labels(*page.lab(1)).set(0.60)
    row = s.parse_page(page.text(), now=12.0)
    assert row["generation_tokens"] == 400 and row["generation_tokens_per_s"] == pytest.approx(200.0)
    assert row["prompt_tokens"] == 2000 and row["prompt_tokens_per_s"] == pytest.approx(1000.0)
    assert row["requests_finished"] == 4 and row["requests_per_s"] == pytest.approx(2.0)
    assert row["preemptions"] == 2
    assert row["requests_running"] == 12 and row["requests_waiting"] == 4
    assert row["kv_cache_usage_pct"] == pytest.approx(60.0)
    assert s.generation_tokens_total == 1400 and s.requests_running == 12


def test_percentiles_and_mean_over_window_match_bucket_quantile_of_the_delta():
    page = VllmPage(engines=2)
    s = MetricsScraper("http://x:1", window_s=60)
    for _ in range(50):
        page.ttft.labels(*page.lab(0)).observe(3.0)  # before the first scrape: outside every window
    before = parse_text(page.text()).histograms["ttft"]
    s.parse_page(page.text(), now=0.0)
    values = [0.03] * 80 + [0.3] * 15 + [1.5] * 5
    for i, v in enumerate(values):
        page.ttft.labels(*page.lab(i % 2)).observe(v)
        page.tpot.labels(*page.lab(i % 2)).observe(v / 10)
    row = s.parse_page(page.text(), now=1.0)
    delta = parse_text(page.text()).histograms["ttft"].minus(before)
    for stat, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        assert row[f"ttft_{stat}_ms"] == pytest.approx(1000 * bucket_quantile(q, delta.buckets))
    assert 20 < row["ttft_p50_ms"] <= 40   # in the bucket that holds 0.03 s
    assert 1000 < row["ttft_p99_ms"] <= 2500
    assert row["ttft_mean_ms"] == pytest.approx(1000 * sum(values) / len(values))
    assert row["tpot_mean_ms"] == pytest.approx(100 * sum(values) / len(values))
    assert row["e2e_p99_ms"] is None  # no observations in the window: NULL, never 0


def test_prefix_cache_and_spec_decode_ratios_over_window():
    page = VllmPage()
    s = MetricsScraper("http://x:1", window_s=60)
    s.parse_page(page.text(), now=0.0)
    page.pq["new"].labels(*page.lab(0)).inc(1000)
    page.ph["new"].labels(*page.lab(1)).inc(250)
    page.drafts.labels(*page.lab(0)).inc(400)
    page.accepted.labels(*page.lab(0)).inc(300)
    row = s.parse_page(page.text(), now=1.0)
    assert row["prefix_cache_hit_pct"] == pytest.approx(25.0)
    assert row["spec_decode_acceptance_pct"] == pytest.approx(75.0)


def test_old_names_and_new_names_preferred_when_both_printed():
    old = VllmPage(names="old")
    s = MetricsScraper("http://x:1")
    s.parse_page(old.text(), now=0.0)
    old.kv["old"].labels(*old.lab(0)).set(0.5)
    old.pq["old"].labels(*old.lab(0)).inc(100)
    old.ph["old"].labels(*old.lab(0)).inc(40)
    old.itl.labels(*old.lab(0)).observe(0.03)  # time_per_output_token_seconds = ITL before 0.11
    row = s.parse_page(old.text(), now=1.0)
    assert row["kv_cache_usage_pct"] == pytest.approx(50.0)
    assert row["prefix_cache_hit_pct"] == pytest.approx(40.0)
    assert 25 < row["itl_p50_ms"] <= 50
    assert row["tpot_p50_ms"] is None  # no per-request TPOT histogram in old versions

    both = VllmPage(names="both")  # vLLM 0.10: the same quantities under both names
    s = MetricsScraper("http://x:1")
    s.parse_page(both.text(), now=0.0)
    both.kv["new"].labels(*both.lab(0)).set(0.7)
    both.kv["old"].labels(*both.lab(0)).set(0.1)
    both.pq["new"].labels(*both.lab(0)).inc(100)
    both.ph["new"].labels(*both.lab(0)).inc(90)
    both.pq["old"].labels(*both.lab(0)).inc(100)
    both.ph["old"].labels(*both.lab(0)).inc(10)
    row = s.parse_page(both.text(), now=1.0)
    assert row["kv_cache_usage_pct"] == pytest.approx(70.0)
    assert row["prefix_cache_hit_pct"] == pytest.approx(90.0)


def test_counter_going_down_is_a_restart_not_a_negative_rate():
    page = VllmPage()
    s = MetricsScraper("http://x:1")
    page.gen.labels(*page.lab(0)).inc(10_000)
    for _ in range(20):
        page.ttft.labels(*page.lab(0)).observe(0.5)
    s.parse_page(page.text(), now=0.0)
    fresh = VllmPage()  # the server restarted: every counter from zero
    fresh.gen.labels(*fresh.lab(0)).inc(50)
    fresh.ttft.labels(*fresh.lab(0)).observe(0.01)
    row = s.parse_page(fresh.text(), now=1.0)
    assert s.resets == 1  # one restart, however many series went down (was counted per series)
    assert row["generation_tokens"] == 50 and row["generation_tokens_per_s"] == pytest.approx(50.0)
    assert row["ttft_p50_ms"] is not None and 5 < row["ttft_p50_ms"] <= 10
    for col, v in row.items():
        assert not (isinstance(v, (int, float)) and v < 0), col


def assert_window_matches_reference(s: MetricsScraper, ref: Series, row: dict, t: int) -> None:
    """The 60 s window figures against Prometheus' own functions over the same pages (`t` names the tick)."""
    gen_window = s._windows.counters["generation_tokens"].window_delta()
    assert gen_window == ref.increase("vllm:generation_tokens_total", t - 60, t), t
    hits = ref.increase("vllm:prefix_cache_hits_total", t - 60, t)
    queries = ref.increase("vllm:prefix_cache_queries_total", t - 60, t)
    assert row["prefix_cache_hit_pct"] == pytest.approx(100 * hits / queries), t
    p99 = ref.histogram_quantile(0.99, "vllm:time_to_first_token_seconds", t - 60, t)
    assert row["ttft_p99_ms"] == pytest.approx(1000 * p99), t


def test_restarts_inside_the_window_give_prometheus_increases():
    """vLLM restarts twice behind the agent (t=45 and t=80, every series from zero, as pages from fresh real
    registries). Every figure is what Prometheus' counter-corrected increase() gives over the raw per-engine
    samples (computed here independently): per-tick tokens and token rate, the tokens over the window, the
    prefix-cache hit ratio over the window, and the TTFT p99. Before the fix the window started over at each
    restart (the hit ratio jumped from the blend to the post-restart 10 % at once, the p99 to the fast requests)."""
    s = MetricsScraper("http://x:1", window_s=60)
    ref = Series()
    page = VllmPage(engines=2)
    for t in range(0, 170, 5):
        if t in (45, 80):
            page = VllmPage(engines=2)  # vLLM restarted behind the agent: every counter from zero
        elif t > 0:
            for e in (0, 1):
                lab = page.lab(e)
                page.gen.labels(*lab).inc(1000 + 37 * t + 11 * e)
                queries = 500 + 3 * t
                page.pq["new"].labels(*lab).inc(queries)
                page.ph["new"].labels(*lab).inc(queries * 4 // 5 if t < 45 else queries // 10)
                for i in range(20):
                    page.ttft.labels(*lab).observe(17.5 if t < 45 and i < 4 else 0.05)
        text = page.text()
        ref.add_page(t, text)
        row = s.parse_page(text, now=float(t))
        if t == 0:
            continue
        step = ref.increase("vllm:generation_tokens_total", t - 5, t)
        assert row["generation_tokens"] == step, t
        assert row["generation_tokens_per_s"] == pytest.approx(step / 5), t
        assert_window_matches_reference(s, ref, row, t)
        assert row["ttft_p99_ms"] > 10_000 if t < 100 else row["ttft_p99_ms"] < 100, t  # slow until t=40 left
        for col, v in row.items():
            assert not (isinstance(v, (int, float)) and v < 0), (t, col)
    assert s.resets == 2


def test_one_engine_restarting_or_leaving_is_corrected_per_engine():
    """Prometheus corrects each series before summing: `sum(increase(...))` and `sum by (le) (rate(...))`. Data-
    parallel engine 1 restarts alone at t=45 (engine 0 keeps counting, the node total still drops) and leaves at
    t=80 (scale-down: its series vanish, their earlier increases stay in the window). Every figure matches the
    per-engine reference; summing first would have counted engine 0's whole history as one step's increase."""

    def engine(e: int) -> tuple[VllmPage, str]:
        return VllmPage(engines=1), f'engine="{e}"'

    s = MetricsScraper("http://x:1", window_s=60)
    ref = Series()
    (a, _), (b, b_label) = engine(0), engine(1)
    for t in range(0, 160, 5):
        if t == 45:
            b, b_label = engine(1)  # engine 1 restarted: its series from zero, engine 0 untouched
        if t > 0:
            for page, slow in ((a, False), (b, t < 45)):
                page.gen.labels(*page.lab(0)).inc(5000 if page is a else 1000)
                page.pq["new"].labels(*page.lab(0)).inc(1000)
                page.ph["new"].labels(*page.lab(0)).inc(900 if page is a else 100)
                for i in range(20):
                    page.ttft.labels(*page.lab(0)).observe(17.5 if slow and i < 6 else 0.05)
        text = a.text() + (b.text().replace('engine="0"', b_label) if t < 80 else "")
        ref.add_page(t, text)
        row = s.parse_page(text, now=float(t))
        if t == 0:
            continue
        assert row["generation_tokens"] == ref.increase("vllm:generation_tokens_total", t - 5, t), t
        assert_window_matches_reference(s, ref, row, t)
    assert s.resets == 1  # the restart; a series leaving is not a reset


def test_counter_window_alone_is_prometheus_increase():
    """The counter window on its own (one series, resets detected there): its increase over the window is
    Prometheus' counter-corrected increase of the raw samples in it, resets included."""
    values = [100, 250, 400, 30, 90, 95, 5, 7, 600, 620, 2, 40, 41, 41, 300]
    cw = continuity._CounterWindow(window_s=30)
    for i, v in enumerate(values):
        t = 5.0 * i
        assert cw.add(t, float(v)) is (i > 0 and v < values[i - 1])
        if i:
            first = max(0, i - 6)  # samples in [t - 30, t]
            assert cw.window_delta() == increase([float(x) for x in values[first:i + 1]]), i
            assert cw.last_delta == increase([float(values[i - 1]), float(v)])


def test_series_missing_from_one_page_continues_where_it_was():
    """Engine 1 is missing from one page (a proxy dropped it), comes back higher, then restarts: over the window
    the tokens are Prometheus' per-series increase (its range skips the gap: 20 -> 25 -> 3 counts 5 + 3), never
    the engine's whole count again because it was absent for a tick."""
    s = MetricsScraper("http://x:1", window_s=60)
    ref = Series()
    a = VllmPage(engines=1)
    b = VllmPage(engines=1)
    b_text: dict[int, str] = {}
    for t in range(0, 45, 5):
        if t == 30:
            b = VllmPage(engines=1)  # engine 1 restarted
        if t:
            a.gen.labels(*a.lab(0)).inc(100)
            b.gen.labels(*b.lab(0)).inc(7)
        b_text[t] = "" if t == 10 else b.text().replace('engine="0"', 'engine="1"')
        text = a.text() + b_text[t]
        ref.add_page(t, text)
        s.parse_page(text, now=float(t))
        if t:
            got = s._windows.counters["generation_tokens"].window_delta()
            assert got == ref.increase("vllm:generation_tokens_total", t - 60, t), t
    assert s.resets == 1


def test_a_restart_is_one_reset_and_one_event_per_page():
    """A restart shows on every series at once: one reset and one `scrape.counter_reset` event per page that
    shows it, naming what went down; no event on ordinary pages or failed scrapes."""
    page = VllmPage(engines=2)
    s = MetricsScraper("http://x:1/metrics")
    for t in (0.0, 1.0):
        for e in (0, 1):
            lab = page.lab(e)
            for c in (page.gen, page.prompt, page.preempt, page.drafts, page.accepted, page.pq["new"],
                      page.ph["new"]):
                c.labels(*lab).inc(100)
            page.success.labels(*lab, "stop").inc(3)
            for h in (page.ttft, page.itl, page.tpot, page.e2e, page.queue):
                h.labels(*lab).observe(0.2)
        s.parse_page(page.text(), now=t)
        assert s.reset_event() is None
    assert s.resets == 0
    fresh = VllmPage(engines=2)
    for e in (0, 1):
        fresh.tpot.labels(*fresh.lab(e))  # vLLM >= 0.11 prints it from the start, at zero
    fresh.gen.labels(*fresh.lab(0)).inc(5)
    s.parse_page(fresh.text(), now=2.0)
    assert s.resets == 1  # thirteen series went down: one restart
    ev = s.reset_event()
    assert ev is not None and ev["kind"] == "scrape.counter_reset" and ev["severity"] == "warning"
    assert ev["details"]["url"] == "http://x:1/metrics" and ev["details"]["resets"] == 1
    assert {"generation_tokens", "requests", "prefix_hits", "ttft", "tpot", "queue"} <= set(ev["details"]["series"])
    assert len(ev["details"]["series"]) == 13 and "13 series" in ev["message"]
    s.parse_page(fresh.text(), now=3.0)  # the same server again: no reset, no event
    assert s.reset_event() is None and s.resets == 1
    s.failed(4.0, "connection refused")
    assert s.reset_event() is None
    again = VllmPage(engines=2)  # restarted once more, a while later; only the token counter had moved
    for e in (0, 1):
        again.tpot.labels(*again.lab(e))
    s.parse_page(again.text(), now=5.0 + episodes.QUIET_S)  # sooner is the same episode: test_pathological_peer.py
    assert s.resets == 2
    ev = s.reset_event()
    assert ev is not None and ev["details"]["series"] == ["generation_tokens"]


def test_created_samples_are_ignored():
    page = VllmPage()
    text = page.text()
    assert "vllm:generation_tokens_created" in text
    parsed = parse_text(text)
    assert parsed.counters["generation_tokens"] == 0.0
    assert all(not k.endswith("created") for k in parsed.counters)


@pytest.mark.parametrize(("text", "why"), [
    ("<html><body>502 Bad Gateway</body></html>", "no vllm:* metrics"),
    ("vllm:num_requests_running 1 2 3 x\nvllm:generation_tokens_total{engine=0} 5\n", "not Prometheus text"),
    ("vllm:num_requests_running{engine=\"0\" 3\n", "not Prometheus text"),
    ("process_open_fds 3\n", "no vllm:* metrics"),
    ("", "no vllm:* metrics"),
    ('# TYPE vllm:time_to_first_token_seconds histogram\nvllm:time_to_first_token_seconds_bucket{le="abc"} 1\n',
     "not Prometheus text"),
    ('# TYPE vllm:time_to_first_token_seconds histogram\nvllm:time_to_first_token_seconds_bucket{le="1.0"} 1\n',
     "no +Inf bucket"),
])
def test_malformed_page_gives_null_row_and_one_outage(text, why):
    s = MetricsScraper("http://127.0.0.1:8000")
    good = s.parse_page(VllmPage().text(), now=0.0)
    assert good["scrape_ok"] == 1 and s.outage_event(0.0) is None
    row = s.parse_page(text, now=1.0)
    assert row["scrape_ok"] == 0 and row["scrape_errors"] == 1
    assert all(v is None for k, v in row.items() if k not in ("scrape_ok", "scrape_errors"))
    assert why in s.last_error and "http://127.0.0.1:8000/metrics" in s.last_error
    ev = s.outage_event(1.0)
    assert ev is not None and ev["kind"] == "scrape.outage" and why in ev["message"]
    s.parse_page(text, now=2.0)  # still down: no second event
    assert s.outage_event(2.0) is None and s.scrape_errors == 2
    back = s.parse_page(VllmPage().text(), now=5.0)
    assert back["scrape_ok"] == 1 and back["scrape_errors"] == 2  # cumulative since the agent started
    assert s.outage_event(5.0) is None  # readable again, not yet for SETTLE_S: a flapping page is one episode
    s.parse_page(VllmPage().text(), now=5.0 + episodes.SETTLE_S)
    ev = s.outage_event(5.0 + episodes.SETTLE_S)
    assert ev["kind"] == "scrape.recovered" and ev["details"]["outage_s"] == pytest.approx(4.0)


def test_lines_we_do_not_read_are_not_parsed():
    page = VllmPage()
    text = page.text() + "http_requests_total{handler=\"/v1/x\" broken line\nvllm:some_new_metric{{{ 1\n"
    row = MetricsScraper("http://x:1").parse_page(text, now=0.0)
    assert row["scrape_ok"] == 1  # garbage in series we never read does not cost the tick


def test_nan_values_are_missing_not_numbers():
    page = VllmPage()
    page.kv["new"].labels(*page.lab(0)).set(math.nan)
    page.kv["new"].labels(*page.lab(1)).set(math.nan)
    row = MetricsScraper("http://x:1").parse_page(page.text(), now=0.0)
    assert row["scrape_ok"] == 1 and row["kv_cache_usage_pct"] is None


# ---------------------------------------------------------------------------------------------- over HTTP


@pytest.fixture
async def vllm_http():
    """A real HTTP server with vLLM's /metrics and /version; `mode` switches it into failure modes."""
    page = VllmPage()
    state = {"mode": "ok"}

    async def metrics(request: web.Request) -> web.StreamResponse:
        if state["mode"] == "big":  # a page of a few MB, streamed in small chunks with pauses
            resp = web.StreamResponse()
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            filler = "".join(f'http_request_duration_seconds_bucket{{handler="/h{i}",le="1.0"}} {i}\n'
                             for i in range(50_000))
            data = (filler + page.text()).encode()
            for i in range(0, len(data), 8192):
                await resp.write(data[i:i + 8192])
                if i % (64 * 8192) == 0:
                    await asyncio.sleep(0.01)
            await resp.write_eof()
            return resp
        if state["mode"] == "500":
            return web.Response(status=500, text="engine dead")
        if state["mode"] == "slow":
            await asyncio.sleep(2)
        return web.Response(text=page.text(), content_type="text/plain")

    async def version(request: web.Request) -> web.Response:
        return web.json_response({"version": "0.31.0"})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/version", version)
    async with serving(app) as url:
        yield url, page, state


async def test_scrape_over_http_and_failures(vllm_http):
    url, page, state = vllm_http
    s = MetricsScraper(url, timeout_s=0.3, settle_s=0.0)  # an outage ends at the first page read
    async with aiohttp.ClientSession() as session:
        assert await s.fetch_version(session) == "0.31.0"
        row = await s.scrape(session, now=0.0)
        assert row["scrape_ok"] == 1
        page.gen.labels(*page.lab(0)).inc(42)
        row = await s.scrape(session, now=1.0)
        assert row["generation_tokens"] == 42
        state["mode"] = "500"
        row = await s.scrape(session, now=2.0)
        assert row["scrape_ok"] == 0 and "HTTP 500" in s.last_error and s.outage_started
        state["mode"] = "slow"
        row = await s.scrape(session, now=3.0)
        assert row["scrape_ok"] == 0 and "timed out" in s.last_error and not s.outage_started
        state["mode"] = "ok"
        row = await s.scrape(session, now=4.0)
        assert row["scrape_ok"] == 1 and s.outage_ended and row["scrape_errors"] == 2


async def test_large_page_read_to_the_end_and_oversized_page_refused(vllm_http, monkeypatch):
    url, page, state = vllm_http
    state["mode"] = "big"
    page.gen.labels(*page.lab(1)).inc(7)  # at the very end of the stream
    s = MetricsScraper(url, timeout_s=10)
    async with aiohttp.ClientSession() as session:
        row = await s.scrape(session, now=0.0)
        assert row["scrape_ok"] == 1, s.last_error
        assert s.generation_tokens_total == 7
        monkeypatch.setattr(fetch, "MAX_PAGE_BYTES", 1 << 20)
        row = await s.scrape(session, now=1.0)
        assert row["scrape_ok"] == 0 and "cut off: larger than 1048576 bytes" in s.last_error


async def test_scrape_unreachable_server():
    s = MetricsScraper("http://127.0.0.1:9", timeout_s=0.5)  # discard port: nothing listens
    async with aiohttp.ClientSession() as session:
        row = await s.scrape(session, now=0.0)
        assert row["scrape_ok"] == 0 and "cannot read http://127.0.0.1:9/metrics" in s.last_error
        assert await s.fetch_version(session) is None


async def test_a_small_page_is_parsed_on_the_loop_a_huge_one_in_a_worker_thread(vllm_http, monkeypatch):
    import threading

    url, page, state = vllm_http
    threads: list[int] = []
    real = scrape_mod.parse_text

    def recording(text: str):
        threads.append(threading.get_ident())
        return real(text)

    monkeypatch.setattr(scrape_mod, "parse_text", recording)
    by_layout = scrape_mod.PageLayout.parse  # a small page is read through the scraper's known layout

    def recording_layout(self, text: str):
        threads.append(threading.get_ident())
        return by_layout(self, text)

    monkeypatch.setattr(scrape_mod.PageLayout, "parse", recording_layout)
    s = MetricsScraper(url, timeout_s=10)
    async with aiohttp.ClientSession() as session:
        assert (await s.scrape(session, now=0.0))["scrape_ok"] == 1
        monkeypatch.setattr(scrape_mod, "INLINE_PARSE_CHARS", 100)  # every page is "huge" now
        assert (await s.scrape(session, now=1.0))["scrape_ok"] == 1
    loop_thread = threading.get_ident()
    assert threads[0] == loop_thread and threads[1] != loop_thread


async def test_a_page_shorter_than_announced_is_a_failed_scrape_not_a_crash():
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n"
                     b"vllm:num_requests_running{engine=\"0\"} 1.0\n")
        await writer.drain()
        writer.close()  # the server dies mid-page

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        s = MetricsScraper(f"http://127.0.0.1:{port}", timeout_s=5)
        async with aiohttp.ClientSession() as session:
            row = await s.scrape(session, now=0.0)
        assert row["scrape_ok"] == 0 and s.last_error.startswith(f"cannot read http://127.0.0.1:{port}/metrics")
        assert s.outage_started
    finally:
        server.close()
        await server.wait_closed()
