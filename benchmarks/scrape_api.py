"""Cost of the agent's I/O edges per tick and per operator command.

- parsing a vLLM /metrics page (1 and 8 data-parallel engines, every histogram vLLM prints plus process/http
  noise) with the scraper's line prefilter, against prometheus_client's parser on the whole page;
- the CPU of one scrape of the simulator's DP8 page (`MetricsScraper.parse_page` over successive pages, counters
  growing: the page's layout read by position, the reset correction, windows and row), and of its parse alone;
  the same for an idle server (the page unchanged: no family part read again);
- one GET /v1/status round trip over the unix socket (what the dashboard and `lynxtop status` pay);
- `lynxtop status` as a fresh process (what an operator waits for).

Timings are medians; the machine is shared and noisy. The last line is one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import _support  # noqa: F401 - tests/ on sys.path
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.vllm_pages import sim_page

from lynxtop.agent.api.routes import ApiServer
from lynxtop.agent.metrics.layout import PageLayout
from lynxtop.agent.metrics.page import relevant_lines
from lynxtop.agent.metrics.scrape import MetricsScraper
from lynxtop.contract.client import AgentClient
from lynxtop.contract.records import ProfileList
from lynxtop.contract.status import GPU_METRIC_NAMES, HOST_METRIC_NAMES, SERVING_METRIC_NAMES, Status

LAT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560]
TOK = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000]
HISTS = {  # name -> buckets: what vLLM 0.11+ prints per engine
    "time_to_first_token_seconds": LAT, "inter_token_latency_seconds": LAT[:19],
    "request_time_per_output_token_seconds": LAT[:19], "e2e_request_latency_seconds": LAT,
    "request_queue_time_seconds": LAT, "request_inference_time_seconds": LAT, "request_prefill_time_seconds": LAT,
    "request_decode_time_seconds": LAT, "request_prompt_tokens": TOK, "request_generation_tokens": TOK,
    "iteration_tokens_total": TOK, "request_max_num_generation_tokens": TOK, "request_params_n": [1, 2, 5, 10, 20],
    "request_params_max_tokens": TOK,
}


def vllm_page(engines: int) -> str:
    r = CollectorRegistry()
    lab = ["model_name", "engine"]
    hists = {n: Histogram("vllm:" + n, n, lab, buckets=b, registry=r) for n, b in HISTS.items()}
    counters = [Counter("vllm:" + n, n, lab, registry=r) for n in (
        "prompt_tokens", "generation_tokens", "num_preemptions", "prefix_cache_queries", "prefix_cache_hits",
        "prompt_tokens_cached", "spec_decode_num_drafts", "spec_decode_num_draft_tokens",
        "spec_decode_num_accepted_tokens")]
    gauges = [Gauge("vllm:" + n, n, lab, registry=r) for n in (
        "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")]
    ok = Counter("vllm:request_success", "ok", [*lab, "finished_reason"], registry=r)
    http = Histogram("http_request_duration_seconds", "http", ["handler", "method"], registry=r)
    for e in range(engines):
        labels = ("deepseek-ai/DeepSeek-V4.1", str(e))
        for h in hists.values():
            for i in range(50):
                h.labels(*labels).observe(0.01 * i)
        for c in counters:
            c.labels(*labels).inc(1000)
        for g in gauges:
            g.labels(*labels).set(0.5)
        for reason in ("stop", "length", "abort"):
            ok.labels(*labels, reason).inc(10)
    for handler in ("/v1/completions", "/v1/chat/completions", "/metrics", "/health", "/v1/models"):
        http.labels(handler, "POST").observe(0.1)
    return generate_latest(r).decode()


_COUNTER = re.compile(r"^(vllm:\S+?(?:_total|_bucket|_sum|_count)(?:\{[^}]*\})?) (\S+)$", re.MULTILINE)


def sim_scrape_cpu_ms(engines: int = 8, pages: int = 60) -> tuple[float, float]:
    """(median CPU ms of one `parse_page`, of its `PageLayout.parse` alone) over `pages` successive pages of the
    simulator's families, every counter growing between pages (as benchmarks/scale.py's scrape_ms_dp8)."""
    rng = random.Random(engines)
    texts = [sim_page(engines, seed=engines)]
    for _ in range(pages):
        texts.append(_COUNTER.sub(lambda m: f"{m.group(1)} {float(m.group(2)) + rng.randint(0, 20)}", texts[-1]))
    scraper, layout = MetricsScraper("http://bench:1"), PageLayout()
    scraper.parse_page(texts[0], 0.0)
    layout.parse(texts[0])
    whole, parse = [], []
    for i, text in enumerate(texts[1:], start=1):
        t = time.process_time()
        row = scraper.parse_page(text, float(i))
        whole.append(time.process_time() - t)
        assert row["scrape_ok"] == 1, scraper.last_error
        t = time.process_time()
        layout.parse(text)
        parse.append(time.process_time() - t)
    return statistics.median(whole) * 1000, statistics.median(parse) * 1000


def sim_idle_scrape_cpu_ms(engines: int = 8, pages: int = 60) -> float:
    """Median CPU ms of one `parse_page` of an idle server: the simulator's DP8 page read again unchanged (every
    family's part as last read: not split, read or added up again, agent/metrics/layout.py)."""
    text = sim_page(engines, seed=engines)
    scraper = MetricsScraper("http://bench:1")
    scraper.parse_page(text, 0.0)
    times = []
    for i in range(1, pages + 1):
        t = time.process_time()
        row = scraper.parse_page(text, float(i))
        times.append(time.process_time() - t)
        assert row["scrape_ok"] == 1, scraper.last_error
    return statistics.median(times) * 1000


def median_ms(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


class _Ctl:
    """The smallest controller with a realistic status object size (8 GPUs, every column)."""

    def status(self) -> Status:
        return Status.from_json({"ts_ms": 0, "agent": {"simulated": True}, "serving": {"state": "ready"},
                                 "gpus": [{k: 1 for k in GPU_METRIC_NAMES} | {"index": i} for i in range(8)],
                                 "host": dict.fromkeys(HOST_METRIC_NAMES, 1),
                                 "serving_metrics": dict.fromkeys(SERVING_METRIC_NAMES, 1)})

    def profiles(self) -> ProfileList:
        return ProfileList()


def api_rtt_ms(n: int) -> tuple[float, float]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    with tempfile.TemporaryDirectory(prefix="lxb", dir="/tmp") as d:
        path = Path(d) / "agent.sock"
        server = ApiServer(_Ctl(), path, log=lambda m: None)
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
        try:
            client = AgentClient(str(path))
            rtt = median_ms(lambda: client.request("GET", "/v1/status"), n)
            cli = []
            for _ in range(5):
                t = time.perf_counter()
                subprocess.run([sys.executable, "-m", "lynxtop", "status", "--socket", str(path)],
                               capture_output=True, timeout=60, check=True)
                cli.append(time.perf_counter() - t)
        finally:
            asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
    return rtt, statistics.median(cli)


def main() -> None:
    out: dict[str, float | int] = {}
    for engines in (1, 8):
        text = vllm_page(engines)
        scraper = MetricsScraper("http://127.0.0.1:8000")
        clock = iter(range(10**6))
        ours = median_ms(lambda: scraper.parse_page(text, float(next(clock))), 15)  # noqa: B023
        full = median_ms(lambda: list(text_string_to_metric_families(text)), 5)  # noqa: B023
        out[f"dp{engines}_page_lines"] = len(text.splitlines())
        out[f"dp{engines}_parsed_lines"] = len(relevant_lines(text)[0].splitlines())
        out[f"dp{engines}_scrape_parse_ms_median"] = round(ours, 2)
        out[f"dp{engines}_full_parser_ms_median"] = round(full, 2)
        out[f"dp{engines}_prefilter_speedup"] = round(full / ours, 2)
        print(f"DP={engines}: {out[f'dp{engines}_page_lines']} lines, parse {ours:.1f} ms (whole page with "
              f"prometheus_client: {full:.1f} ms)")
    whole, parse = sim_scrape_cpu_ms()
    out["dp8_sim_scrape_cpu_ms_median"] = round(whole, 3)
    out["dp8_sim_parse_cpu_ms_median"] = round(parse, 3)
    print(f"DP=8 simulator page: one scrape's parse and bookkeeping {whole:.2f} ms of CPU, the parse {parse:.2f} ms")
    out["dp8_sim_idle_scrape_cpu_ms_median"] = round(sim_idle_scrape_cpu_ms(), 3)
    print(f"DP=8 simulator page, idle server (page unchanged): {out['dp8_sim_idle_scrape_cpu_ms_median']:.2f} ms")
    rtt, cli = api_rtt_ms(200)
    out["api_status_rtt_ms_median"] = round(rtt, 3)
    out["cli_status_s_median"] = round(cli, 3)
    print(f"GET /v1/status round trip {rtt:.2f} ms; `lynxtop status` process {cli:.2f} s")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
