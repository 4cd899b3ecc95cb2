"""The scraper asks vLLM for the samples it reads only (`name[]`, as prometheus_client's exposition selects them),
and reads the whole page where the server cannot select: the figures are the same to the last digit either way.

The server here is prometheus_client's own aiohttp handler over the simulator's vLLM 0.32 families, so the
selection is the library's, not an imitation of it.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.aiohttp import make_aiohttp_handler
from support.web_app import serving

from lynxtop.agent.scrape import SELECTION, MetricsScraper
from lynxtop.agent.sim.metrics import VllmMetrics

SELECTION_NAMES = [kv.split("=", 1)[1].replace("%3A", ":") for kv in SELECTION.split("&")]


def _traffic(m: VllmMetrics, rng: random.Random, engines: int) -> None:
    for e in range(engines):
        for _ in range(rng.randint(0, 4)):
            m.on_step({"running": rng.randint(0, 16), "waiting": rng.randint(0, 9), "kv": rng.random(),
                       "it": rng.randint(1, 512), "prompt": rng.randint(0, 4000), "gen": rng.randint(0, 64),
                       "pq": 100, "ph": rng.randint(0, 100), "sd": 3, "sdt": 9, "sa": rng.randint(0, 9),
                       "first": [(1, rng.uniform(0.01, 3.0))], "itl": [rng.uniform(0.005, 0.3) for _ in range(5)],
                       "fin": [{"reason": "length", "e2e_s": rng.uniform(1, 60), "queue_s": rng.random(),
                                "inference_s": 2.0, "prefill_s": 0.3, "decode_s": 1.7, "prompt_tokens": 900,
                                "generation_tokens": 77, "max_tokens": 128, "tpot_s": rng.uniform(0.01, 0.2)}]}, e)


def _metrics(engines: int) -> VllmMetrics:
    return VllmMetrics(model_name="deepseek-ai/DeepSeek-V4.1", version=(0, 32), max_model_len=32768,
                       spec_decode=True, cache_info={"block_size": "16"}, engines=engines)


class _Unnamed:
    """A collector that names nothing (no describe), as prometheus_client's MultiProcessCollector: vLLM's
    registry with several API servers, where a `name[]` selection renders an empty page."""

    def __init__(self, source: CollectorRegistry):
        self.source = source

    def collect(self):
        return self.source.collect()


def _app(registry: Any, seen: list[dict[str, Any]], refuse_queries: bool = False) -> web.Application:
    handler = make_aiohttp_handler(registry)

    async def metrics(request: web.Request) -> web.StreamResponse:
        if refuse_queries and request.query_string:
            seen.append({"query": True, "bytes": 0})
            return web.Response(status=414, text="URI too long")
        resp = await handler(request)
        seen.append({"query": "name%5B%5D=" in request.query_string or "name[]=" in request.query_string,
                     "bytes": len(resp.body or b"")})
        return resp

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


async def test_selected_page_gives_the_whole_pages_figures_to_the_last_digit():
    m, rng, seen = _metrics(8), random.Random(15), []
    async with serving(_app(m.registry, seen)) as url, aiohttp.ClientSession() as session:
        selected = MetricsScraper(url)
        whole = MetricsScraper(url)  # the reference: the whole page as the registry writes it
        for tick in range(8):
            _traffic(m, rng, 8)
            row = await selected.scrape(session, now=float(tick))
            ref = whole.parse_page(generate_latest(m.registry).decode(), now=float(tick))
            assert row["scrape_ok"] == 1, selected.last_error
            assert row == ref
            assert selected.engines == whole.engines and len(selected.engines) == 8
        assert tick == 7 and ref["ttft_p99_ms"] is not None and ref["generation_tokens_per_s"] is not None
    assert selected.filtered and [s["query"] for s in seen] == [True] * 8
    whole_bytes = len(generate_latest(m.registry))
    assert max(s["bytes"] for s in seen) < whole_bytes / 2  # the server renders and sends less than half


async def test_a_server_that_cannot_select_is_read_whole_from_then_on(caplog):
    m, rng, seen = _metrics(2), random.Random(3), []
    unnamed = CollectorRegistry()  # as vLLM builds it for its multiprocess directory
    unnamed.register(_Unnamed(m.registry))
    assert generate_latest(unnamed.restricted_registry(SELECTION_NAMES)) == b""  # what vLLM would answer
    async with serving(_app(unnamed, seen)) as url, aiohttp.ClientSession() as session:
        s = MetricsScraper(url)
        ref = MetricsScraper(url)
        with caplog.at_level(logging.INFO, logger="lynxtop.scrape"):
            for tick in range(3):
                _traffic(m, rng, 2)
                row = await s.scrape(session, now=float(tick))
                assert row["scrape_ok"] == 1, s.last_error
                assert row == ref.parse_page(generate_latest(unnamed).decode(), now=float(tick))
    assert not s.filtered
    assert [x["query"] for x in seen] == [True, False, False, False]  # one selection tried, then whole pages
    assert len([r for r in caplog.records if "name[]" in r.getMessage()]) == 1


async def test_a_proxy_refusing_the_selection_falls_back_and_an_outage_keeps_trying_it():
    m, seen = _metrics(1), []
    state = {"down": False}
    refusing = _app(m.registry, seen, refuse_queries=True)
    async with serving(refusing) as url, aiohttp.ClientSession() as session:
        s = MetricsScraper(url)
        row = await s.scrape(session, now=0.0)
        assert row["scrape_ok"] == 1 and not s.filtered
        assert [x["query"] for x in seen] == [True, False]

    seen.clear()

    async def down_or_select(request: web.Request) -> web.StreamResponse:
        seen.append({"query": bool(request.query_string), "bytes": 0})
        if state["down"]:
            return web.Response(status=500, text="engine dead")
        return await make_aiohttp_handler(m.registry)(request)

    app = web.Application()
    app.router.add_get("/metrics", down_or_select)
    async with serving(app) as url, aiohttp.ClientSession() as session:
        s = MetricsScraper(url)
        state["down"] = True
        row = await s.scrape(session, now=0.0)
        assert row["scrape_ok"] == 0 and "HTTP 500" in s.last_error
        assert s.filtered  # the whole page failed too: nothing learnt about selecting
        state["down"] = False
        row = await s.scrape(session, now=1.0)
        assert row["scrape_ok"] == 1 and s.filtered
    assert [x["query"] for x in seen] == [True, False, True]


def test_the_selection_names_every_sample_the_parser_reads():
    from lynxtop.agent.scrape import _WANTED_SAMPLES

    assert sorted(SELECTION_NAMES) == sorted(_WANTED_SAMPLES)
    assert all(n.startswith("vllm:") for n in SELECTION_NAMES)


@pytest.mark.parametrize("engines", [1, 8])
def test_the_registry_selection_has_every_read_line_in_its_familys_order(engines):
    """prometheus_client's selection has every line the parser reads, each sample name's lines in page order
    (the families themselves come in the order of a set: sums never add across families)."""
    m = _metrics(engines)
    _traffic(m, random.Random(engines), engines)

    def by_name(text: str) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for line in text.splitlines():
            name = line.split("{")[0].split(" ")[0]
            if not line.startswith("#") and name in SELECTION_NAMES:
                out.setdefault(name, []).append(line)
        return out

    whole = by_name(generate_latest(m.registry).decode())
    sel_text = generate_latest(m.registry.restricted_registry(SELECTION_NAMES)).decode()
    assert by_name(sel_text) == whole and len(whole) >= 20
    assert all(x.startswith("#") or x.split("{")[0].split(" ")[0] in SELECTION_NAMES for x in sel_text.splitlines())
