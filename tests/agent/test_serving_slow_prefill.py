"""One long prefill is not a hang: the detector counts any sign that the engine moves, not only generated tokens.

vLLM v1 counts a request's prompt and generation tokens only once its prefill has produced the first token: a
prompt that takes minutes to prefill (chunked) shows 1 running and no counter moving, while its KV cache usage
grows chunk by chunk. Read through the agent's real scrape path (ScrapeSource: a served /metrics page, parsed by
the scraper, its counters and the tick's row handed to the HangDetector), on a clock the test moves.
"""

from __future__ import annotations

import time

import pytest
from aiohttp import web
from support.web_app import serving

from lynxtop.agent.sampling import ScrapeSource, ScrapeTarget, Tick
from lynxtop.agent.serving.health import HangDetector, Health, Verdict

pytestmark = pytest.mark.timeout(60)

HANG_S = 60.0


class Engine:
    """What one engine's /metrics page says now (the test changes it between ticks)."""

    def __init__(self) -> None:
        self.running, self.waiting, self.kv = 0, 0, 0.01
        self.prompt, self.gen, self.done = 5000.0, 700.0, 10.0

    def page(self) -> str:
        lab = 'engine="0",model_name="m"'
        return "".join([
            "# TYPE vllm:num_requests_running gauge\n", f"vllm:num_requests_running{{{lab}}} {self.running}\n",
            "# TYPE vllm:num_requests_waiting gauge\n", f"vllm:num_requests_waiting{{{lab}}} {self.waiting}\n",
            "# TYPE vllm:kv_cache_usage_perc gauge\n", f"vllm:kv_cache_usage_perc{{{lab}}} {self.kv}\n",
            "# TYPE vllm:prompt_tokens counter\n", f"vllm:prompt_tokens_total{{{lab}}} {self.prompt}\n",
            "# TYPE vllm:generation_tokens counter\n", f"vllm:generation_tokens_total{{{lab}}} {self.gen}\n",
            "# TYPE vllm:request_success counter\n",
            f'vllm:request_success_total{{{lab},finished_reason="stop"}} {self.done}\n',
        ])


class Http:
    def session(self):  # noqa: ANN202 - the scraper reads a plain http:// page over its own connection
        return None


async def _watch(engine: Engine, steps, every_s: float = 10.0) -> list[Verdict]:
    """Scrape the page once per `every_s` of test time; `steps(t)` changes the engine before each scrape."""
    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(text=engine.page(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    verdicts: list[Verdict] = []
    async with serving(app) as url:
        src = ScrapeSource(Http(), lambda: target, window_s=60, timeout_s=2.0, hang_timeout_s=HANG_S,
                           on_new_run=lambda: None, on_verdict=verdicts.append)
        target = ScrapeTarget(url + "/metrics", 1, "token")
        try:
            t = 1000.0
            for i in range(int(600 / every_s)):
                steps(i * every_s)
                real = time.monotonic()
                rows, _ = await src.sample(Tick(ts_ms=int(t * 1000), t0=t, deadline=real + 2.0, root=None, run_id=1))
                assert rows["serving_row"]["scrape_ok"] == 1, rows
                t += every_s
        finally:
            src.close()
    return verdicts


def _hung(verdicts: list[Verdict]) -> list[Verdict]:
    return [v for v in verdicts if v.health is Health.HUNG]


async def test_a_ten_minute_chunked_prefill_is_not_a_hang():
    """One request, a prompt of a million tokens: no counter moves for ten minutes, the KV cache fills."""
    engine = Engine()

    def prefill(t: float) -> None:
        engine.running = 1 if t > 0 else 0
        engine.kv = 0.01 + t / 1000  # one chunk's blocks after another

    verdicts = await _watch(engine, prefill)
    assert not _hung(verdicts), [v.reason for v in _hung(verdicts)]


async def test_requests_admitted_one_by_one_into_long_prefills_are_not_a_hang():
    """The scheduler moves requests from waiting to running (the counts change) while no token is counted."""
    engine = Engine()

    def admit(t: float) -> None:
        engine.running = 1 + int(t // 50)
        engine.waiting = 20 - int(t // 50)

    verdicts = await _watch(engine, admit)
    assert not _hung(verdicts), [v.reason for v in _hung(verdicts)]


async def test_nothing_moving_with_a_request_running_is_still_a_hang():
    engine = Engine()

    def stuck(t: float) -> None:
        engine.running, engine.kv = 1, 0.2  # from the first scrape on: nothing changes any more

    verdicts = await _watch(engine, stuck)
    hung = _hung(verdicts)
    assert len(hung) == 1 and hung[0].reason == f"hang: 1 requests running and no token generated for {HANG_S:.0f} s"


async def test_a_stall_after_a_prefill_that_moved_is_caught_one_timeout_later():
    engine = Engine()

    def prefill_then_stall(t: float) -> None:
        engine.running = 1
        engine.kv = 0.01 + min(t, 200) / 1000  # the KV cache grows until t=200, then nothing moves

    verdicts = await _watch(engine, prefill_then_stall)
    hung = _hung(verdicts)
    assert len(hung) == 1


def test_the_detector_alone_counts_prompt_tokens_and_finished_requests():
    d = HangDetector(10)
    row = {"prompt_tokens": 0, "generation_tokens": 0, "requests_finished": 0, "kv_cache_usage_pct": 5.0}
    assert d.observe(1, 100.0, 0, now=0, row=row).health is Health.PROGRESSING
    assert d.observe(1, 100.0, 0, now=9, row=row) is None
    assert d.observe(1, 100.0, 0, now=12, row={**row, "prompt_tokens": 8192}).health is Health.PROGRESSING
    assert d.observe(1, 100.0, 0, now=21, row=row) is None
    assert d.observe(1, 100.0, 0, now=24, row={**row, "requests_finished": 1}).health is Health.PROGRESSING
    assert d.observe(1, 100.0, 0, now=33, row=row) is None
    assert d.observe(1, 100.0, 0, now=34, row=row).health is Health.HUNG
