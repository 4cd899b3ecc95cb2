"""vLLM pages whose latency histograms the test fills, read through the agent's real scrape path.

The page is the simulator's (sim/metrics.py: vLLM's own bucket bounds, e.g. 0.3 s as the lowest bound of the queue
and e2e histograms); the row is what `MetricsScraper` makes of a page read before and one read after the requests,
and the status is that row and the SLA tracker's answer over it, as the agent serves them.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import generate_latest

from lynxtop.agent.metrics.scrape import MetricsScraper
from lynxtop.agent.metrics.sla import SlaTracker
from lynxtop.contract.config import SlaConfig
from lynxtop.sim.metrics import VllmMetrics
from support.status import status_json

# every figure inside its histogram's lowest bucket (TTFT < 1 ms, ITL/TPOT < 10 ms, the request times < 0.3 s)
IDLE_FAST = {"ttft_s": 0.0005, "itl_s": 0.004, "tpot_s": 0.004, "e2e_s": 0.1, "queue_s": 0.0, "prefill_s": 0.02,
             "decode_s": 0.05}
# the same server queueing: every request waits 0.5-0.8 s (the queue histogram's third bucket) and TTFT with it
QUEUEING = {**IDLE_FAST, "ttft_s": 0.7, "e2e_s": 0.9, "queue_s": 0.65, "itl_s": 0.03, "tpot_s": 0.03}


class LatencyPage:
    """One simulated vLLM 0.32 engine: `finish` requests with the given times, `text` its /metrics page."""

    def __init__(self) -> None:
        self.metrics = VllmMetrics(model_name="m", version=(0, 32), max_model_len=4096, spec_decode=False,
                                   cache_info={"block_size": "16"})

    def finish(self, n: int, times: dict[str, float]) -> None:
        for _ in range(n):
            self.metrics.on_step({"running": 1, "waiting": 0, "kv": 0.1, "gen": 8,
                                  "first": [(1, times["ttft_s"])], "itl": [times["itl_s"]] * 3,
                                  "fin": [{"reason": "length", "e2e_s": times["e2e_s"], "queue_s": times["queue_s"],
                                           "inference_s": times["e2e_s"], "prefill_s": times["prefill_s"],
                                           "decode_s": times["decode_s"], "prompt_tokens": 100,
                                           "generation_tokens": 8, "max_tokens": 8, "tpot_s": times["tpot_s"]}]})

    def text(self) -> str:
        return generate_latest(self.metrics.registry).decode()


def scraped_row(times: dict[str, float], n: int = 40) -> dict[str, Any]:
    """The serving row of a page read, then `n` requests finished with `times`, then the page read again."""
    page, scraper = LatencyPage(), MetricsScraper("http://127.0.0.1:8000", window_s=60)
    scraper.parse_page(page.text(), now=0.0)
    page.finish(n, times)
    row = scraper.parse_page(page.text(), now=1.0)
    assert row["scrape_ok"] == 1
    return row


def served_status(row: dict[str, Any], sla: SlaConfig | None = None) -> dict[str, Any]:
    """The status JSON an agent serves for that row: its serving metrics and the SLA judged over it."""
    tracker = SlaTracker(sla or SlaConfig(ttft_p99_ms=2000, tpot_p99_ms=150, window_s=60))
    tracker.update(row, 1000)
    return status_json(metrics=row, sla=tracker.state().to_json())
