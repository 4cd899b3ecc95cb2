"""The Serving panel says which of its figures this vLLM does not serve: `n/s` where the TPOT row's percentiles
(and a stat whose family is missing) would be blank, and a tooltip `not served by vLLM 0.10.2: TPOT`; a status
without the field (every snapshot's, an older agent's) shows the figures as before and no tooltip.

The row and the missing quantities are those the agent's real scraper reads from a vLLM 0.10 page as the simulator
writes it (no per-request TPOT histogram before 0.11), served to the dashboard over a status socket.
"""

from __future__ import annotations

import re

from prometheus_client import generate_latest
from support.status import status_json
from support.tui import make_app, text_of, wait_for

from lynxtop.agent.metrics.scrape import MetricsScraper
from lynxtop.sim.metrics import VllmMetrics
from lynxtop.tui.widgets.serving_panel import ServingPanel


def _scraped_0_10() -> tuple[dict, list[str]]:
    """A vLLM 0.10 page read twice around 20 finished requests: the serving row and the quantities not served."""
    m = VllmMetrics(model_name="m", version=(0, 10), max_model_len=4096, spec_decode=False,
                    cache_info={"block_size": "16"})
    s = MetricsScraper("http://127.0.0.1:8000", window_s=60)
    s.parse_page(generate_latest(m.registry).decode(), 0.0)
    for _ in range(20):
        m.on_step({"running": 1, "waiting": 0, "kv": 0.25, "gen": 8, "pq": 100, "ph": 50, "first": [(1, 0.05)],
                   "itl": [0.03] * 3,
                   "fin": [{"reason": "length", "e2e_s": 0.9, "queue_s": 0.1, "inference_s": 0.8, "prefill_s": 0.1,
                            "decode_s": 0.7, "prompt_tokens": 100, "generation_tokens": 8, "max_tokens": 8,
                            "tpot_s": 0.03}]})
    row = s.parse_page(generate_latest(m.registry).decode(), 1.0)
    assert row["scrape_ok"] == 1 and row["tpot_p99_ms"] is None and row["itl_p99_ms"] is not None
    return row, list(s.not_served)


def _line(text: str, label: str) -> str:
    return " ".join(next((ln for ln in text.splitlines() if re.search(rf"\b{label}\b", ln)), "").split())


async def test_a_quantity_not_served_reads_n_s_with_a_tooltip_naming_it(agent):
    row, missing = _scraped_0_10()
    assert missing == ["tpot"], missing  # 0.10 serves every other family lynxtop reads
    agent.status = status_json(metrics=row, not_served=missing, not_served_version="0.10.2")
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        panel = app.screen.query_one(ServingPanel)
        await wait_for(pilot, lambda: "n/s" in _line(text_of(panel), "TPOT"))
        text = text_of(panel)
        assert "p50 n/s p99 n/s" in _line(text, "TPOT"), text
        assert "n/s" not in _line(text, "ITL") and " ms" in _line(text, "ITL"), text  # served: its figures
        assert "n/s" not in _line(text, "KV"), text
        assert str(panel.tooltip).startswith("not served by vLLM 0.10.2: TPOT"), panel.tooltip
        shown = panel._shown
        await pilot.pause(0.6)  # polls of the same status: nothing drawn again
        assert panel._shown is shown
        # a run of a vLLM that serves it: the figures come back and the tooltip goes
        agent.status = status_json(metrics=row)
        await wait_for(pilot, lambda: "n/s" not in text_of(panel))
        assert panel.tooltip is None


async def test_a_missing_prefix_family_reads_n_s_in_the_stats_line(agent):
    row, _ = _scraped_0_10()
    row = {**row, "prefix_cache_hit_pct": None}
    agent.status = status_json(metrics=row, not_served=["prefix_hits", "tpot"], not_served_version=None)
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        panel = app.screen.query_one(ServingPanel)
        await wait_for(pilot, lambda: "prefix hit n/s" in text_of(panel))
        assert str(panel.tooltip).startswith("not served by vLLM (version unknown): prefix cache hits, TPOT")


async def test_without_the_field_the_panel_is_as_before(agent):
    row, _ = _scraped_0_10()
    agent.status = status_json(metrics=row)
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        panel = app.screen.query_one(ServingPanel)
        await wait_for(pilot, lambda: " ms" in _line(text_of(panel), "ITL"))
        assert "n/s" not in text_of(panel) and panel.tooltip is None
