"""A family the vLLM page lacks is an event, not only a log line: one `scrape.not_served` (warning) per quantity and
run, through the sampling path that records the other scrape events (ScrapeSource), naming the vLLM version the run
already knows (no GET /version for it), told again for a new run; a page with every family tells nothing.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from aiohttp import web
from prometheus_client import generate_latest
from support.web_app import serving

from lynxtop.agent.sampling import ScrapeSource, ScrapeTarget, Tick
from lynxtop.agent.serving.health import HttpClient
from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.sim.metrics import VllmMetrics


def engine(version: tuple[int, int]) -> VllmMetrics:
    return VllmMetrics(model_name="m", version=version, max_model_len=4096, spec_decode=False,
                       cache_info={"block_size": "16"})


def finish(m: VllmMetrics, n: int) -> None:
    """`n` requests of 8 tokens (three decode steps each)."""
    for _ in range(n):
        m.on_step({"running": 1, "waiting": 0, "kv": 0.25, "gen": 8, "pq": 100, "ph": 50, "first": [(1, 0.05)],
                   "itl": [0.03] * 3,
                   "fin": [{"reason": "length", "e2e_s": 0.9, "queue_s": 0.1, "inference_s": 0.8, "prefill_s": 0.1,
                            "decode_s": 0.7, "prompt_tokens": 100, "generation_tokens": 8, "max_tokens": 8,
                            "tpot_s": 0.03}]})


def _app(page: list[str], hits: dict[str, int], version: str) -> web.Application:
    async def metrics(_req: web.Request) -> web.Response:
        return web.Response(text=page[0], content_type="text/plain")

    async def ver(_req: web.Request) -> web.Response:
        hits["version"] += 1
        return web.json_response({"version": version})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/version", ver)
    return app


async def _ticks(src: ScrapeSource, m: VllmMetrics, page: list[str], t: float, n: int,
                 edit: Any = None) -> tuple[float, list[Event]]:
    """`n` scrapes through the sampling path; the events they gave."""
    out: list[Event] = []
    for _ in range(n):
        finish(m, 2)
        page[0] = edit(generate_latest(m.registry).decode()) if edit else generate_latest(m.registry).decode()
        rows, events = await src.sample(Tick(ts_ms=int(t * 1000), t0=t, deadline=time.monotonic() + 20, root=None,
                                             run_id=1))
        assert rows["serving_row"]["scrape_ok"] == 1
        out += events
        t += 1.0
    return t, out


def _not_served(events: list[Event]) -> list[Event]:
    return [e for e in events if e.kind == EventKind.SCRAPE_NOT_SERVED]


def test_a_missing_family_is_one_event_per_quantity_and_run_with_the_runs_version():
    """vLLM 0.10 (no per-request TPOT histogram), the prefix-cache families stripped too: one event per missing
    quantity, warning, with the run's known version (the /version endpoint is not asked), not one per scrape; the
    next run is told again; a 0.32 page (every family) tells nothing."""

    async def go() -> tuple[list[Event], list[Event], list[Event], int]:
        old, new = engine((0, 10)), engine((0, 32))
        page = [""]
        hits = {"version": 0}
        strip = re.compile(r"^vllm:(gpu_)?prefix_cache_(hits|queries)_total.*\n", re.M)
        http = HttpClient()
        try:
            async with serving(_app(page, hits, "9.9.9-not-the-runs")) as url:
                targets = [ScrapeTarget(url + "/metrics", 1, "run-1", vllm_version="0.10.2")]
                src = ScrapeSource(http, lambda: targets[0], window_s=60, timeout_s=5.0, hang_timeout_s=600.0,
                                   on_new_run=lambda: None, on_verdict=lambda v: None)
                t, first = await _ticks(src, old, page, 1000.0, 4, edit=lambda s: strip.sub("", s))
                targets[0] = ScrapeTarget(url + "/metrics", 2, "run-2", vllm_version="0.10.2")
                t, second = await _ticks(src, old, page, t, 3)
                targets[0] = ScrapeTarget(url + "/metrics", 3, "run-3", vllm_version="0.32.0")
                _, third = await _ticks(src, new, page, t, 3)
                src.close()
        finally:
            await http.close()
        return _not_served(first), _not_served(second), _not_served(third), hits["version"]

    first, second, third, version_gets = asyncio.run(go())
    assert sorted(e.details["quantity"] for e in first) == ["prefix_hits", "prefix_queries", "tpot"]
    for e in first:
        assert e.severity == Severity.WARNING and e.run_id == 1
        assert e.details["vllm_version"] == "0.10.2" and "0.10.2" in e.message
        assert e.details["url"].endswith("/metrics") and e.details["families"] and e.details["columns"]
    tpot = next(e for e in first if e.details["quantity"] == "tpot")
    assert "vllm:request_time_per_output_token_seconds" in tpot.message and "tpot_p99_ms" in tpot.message
    assert [e.details["quantity"] for e in second] == ["tpot"] and second[0].run_id == 2  # a new run: told again
    assert third == []
    assert version_gets == 0  # the run knew its version: /version not read to name it
