"""The Latency view says which of its charts this vLLM does not serve: the TPOT charts of a vLLM 0.10 (no per-request
TPOT histogram) carry `n/s: not served by vLLM 0.10.2` in their titles, not an empty chart that reads as "no
traffic"; the served series (TTFT, ITL) do not; a status without the field (an older agent, a vLLM serving it) shows
no note. The version is vLLM's: shown as text (never markup), one line, and ASCII in ASCII mode.

The row and the missing quantities are those the agent's real scraper reads from a vLLM 0.10 page as the simulator
writes it, served to the dashboard by the fake agent over its status socket.
"""

from __future__ import annotations

from prometheus_client import generate_latest
from support.status import status_json
from support.tui import make_app, screen_text, text_of, wait_for
from support.tui_keys import open_screen

from lynxtop.agent.metrics.scrape import MetricsScraper
from lynxtop.sim.metrics import VllmMetrics
from lynxtop.tui.screens.latency import CHARTS, LatencyScreen
from lynxtop.tui.widgets.time_chart import TimeChart


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


def _title(app, series: str, stat: str) -> str:
    """The chart's first line (its title), runs of spaces made one."""
    chart = app.screen.query_one(f"#chart-{series}-{stat}", TimeChart)
    return " ".join(text_of(chart).splitlines()[0].split())


async def test_each_chart_of_a_quantity_not_served_says_n_s_with_the_version(agent):
    row, missing = _scraped_0_10()
    assert missing == ["tpot"], missing
    agent.status = status_json(metrics=row, not_served=missing, not_served_version="0.10.2")
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        await open_screen(pilot, app, "3", LatencyScreen)
        await wait_for(pilot, lambda: "n/s" in _title(app, "tpot", "p99"))
        for series, stat, _ in CHARTS:
            title = _title(app, series, stat)
            if series == "tpot":
                assert "n/s: not served by vLLM 0.10.2" in title, title
            else:
                assert "n/s" not in title and "not served" not in title, title
        assert "limit 150 ms" in _title(app, "tpot", "p99")  # the rest of the title as before
        # a vLLM that serves it (or an agent without the field): the note goes
        agent.status = status_json(metrics=row)
        await wait_for(pilot, lambda: "n/s" not in _title(app, "tpot", "p99"))
        assert "not served" not in screen_text(app)


async def test_the_version_is_text_one_line_and_ascii_in_ascii_mode(agent):
    """A version as vLLM's /version may say it: markup-looking brackets shown as they are, a newline and a
    non-ASCII character never break the title's line nor the ASCII drawing; an unknown version says so."""
    row, _ = _scraped_0_10()
    agent.status = status_json(metrics=row, not_served=["tpot"], not_served_version="[bold]0.10\n.2-ü")
    app = make_app(agent.socket_path, ascii_only=True)
    async with app.run_test(size=(80, 40)) as pilot:
        await open_screen(pilot, app, "3", LatencyScreen)
        await wait_for(pilot, lambda: "n/s" in _title(app, "tpot", "p99"))
        title = _title(app, "tpot", "p99")
        # the newline comes escaped or as `?` (the status's foreign text is made safe on the way), the rest as is
        assert "n/s: not served by vLLM [bold]0.10" in title and title.endswith(".2-?"), title
        shown = screen_text(app)
        assert shown.isascii(), [ln for ln in shown.splitlines() if not ln.isascii()]
        assert sum(".2-?" in ln for ln in shown.splitlines()) == 2, shown  # TPOT p99 and p50, each on its line
        agent.status = status_json(metrics=row, not_served=["tpot"], not_served_version=None)
        await wait_for(pilot, lambda: "vLLM (version unknown)" in _title(app, "tpot", "p50"))
