#!/usr/bin/env python3
"""Memory under a pathological vLLM peer (issue 25.2): peak RSS of the agent's scrape path, against a normal page.

Each mode runs in a fresh process (its peak RSS is its own) that reads one page `--scrapes` times through a real
HTTP server in another process, the way the agent does (MetricsScraper.scrape, then the lifetime totals the
exporter reads), and for `version` asks GET /version through the agent's HttpClient:
  normal      the simulator's DP=8 page
  engines     100,000 engine label values (5 MB: under the page-size cap, over the engine cap)
  buckets     one histogram with 60,000 buckets (5 MB, over the bucket cap)
  churn       the DP=8 page with a label that changes every scrape (every series new each time)
  inf         the DP=8 page with +Inf, NaN and 1e300 values
  version     a 20 MB /version body
Before the caps: engines took the agent to 290 MiB, churn to ~960 MiB, buckets grew the window to ~925 MiB.

Last line of output: one JSON object {normal_peak_mib, worst_mode, worst_peak_mib, worst_ratio, peaks: {...}}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import _support  # noqa: F401 - puts tests/ on sys.path for `support`

MODES = ("normal", "engines", "buckets", "churn", "inf", "version")


def _page(mode: str, n: int) -> bytes:
    """The page a mode's server answers to its n-th scrape."""
    from support.vllm_pages import sim_page

    if mode == "engines":
        lines = ["# TYPE vllm:num_requests_running gauge"]
        lines += [f'vllm:num_requests_running{{engine="{e}",model_name="m"}} 1' for e in range(100_000)]
        return ("\n".join(lines) + "\n").encode()
    if mode == "buckets":
        lines = ["# TYPE vllm:e2e_request_latency_seconds histogram"]
        lines += [f'vllm:e2e_request_latency_seconds_bucket{{le="{i * 1e-5:.5f}"}} {n}' for i in range(1, 60_000)]
        lines += [f'vllm:e2e_request_latency_seconds_bucket{{le="+Inf"}} {n}',
                  f"vllm:e2e_request_latency_seconds_count {n}", f"vllm:e2e_request_latency_seconds_sum {n}"]
        return ("\n".join(lines) + "\n").encode()
    page = sim_page(8, seed=5)
    if mode == "churn":
        page = page.replace('engine="', f'scrape="{n:08d}-{"x" * 100}",engine="')
    elif mode == "inf":
        page = "\n".join(f"{ln.rpartition(' ')[0]} {('+Inf', 'NaN', '1e300')[i % 3]}"
                         if ln.startswith("vllm:") and 'engine="0"' in ln else ln
                         for i, ln in enumerate(page.splitlines())) + "\n"
    return page.encode()


def serve(mode: str) -> None:
    """The peer: prints its port, answers until stdin closes."""
    cache: dict[int, bytes] = {}
    count = [0]

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/version":
                body = json.dumps({"version": "0" * (20 << 20 if mode == "version" else 6)}).encode()
            else:
                n = count[0]
                count[0] += 1
                key = n if mode in ("churn", "buckets") else 0
                if key not in cache:
                    cache.clear()
                    cache[key] = _page(mode, n)
                body = cache[key]
            self.send_response(200)
            self.send_header("Content-Type", "application/json" if self.path == "/version" else "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    print(srv.server_address[1], flush=True)
    sys.stdin.read()
    srv.shutdown()


async def _scrape(url: str, scrapes: int) -> dict[str, object]:
    from lynxtop.agent.metrics.lifetime import ServingTotals
    from lynxtop.agent.metrics.scrape import MetricsScraper
    from lynxtop.agent.serving.health import HttpClient

    http = HttpClient()
    s = MetricsScraper(url, timeout_s=30)
    totals = ServingTotals()
    ok = 0
    events: list[str] = []
    try:
        for i in range(scrapes):
            row = await s.scrape(http.session(), now=float(i))
            totals.observe(s)
            ok += row["scrape_ok"]
            events += [str(e["kind"]) for e in s.events(float(i))]
            await http.get(url + "/version")
        events += [str(e["kind"]) for e in http.drain_events()]
    finally:
        await http.close()
    return {"ok_scrapes": ok, "events": sorted(set(events)), "last_error": s.last_error}


def measure(mode: str, scrapes: int) -> None:
    """One mode in this process: the peer in a child, then the scrapes; prints peak RSS."""
    peer = subprocess.Popen([sys.executable, __file__, "--serve", mode], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        port = int(peer.stdout.readline())  # type: ignore[union-attr]
        out = asyncio.run(_scrape(f"http://127.0.0.1:{port}", scrapes))
    finally:
        peer.stdin.close()  # type: ignore[union-attr]
        peer.wait(10)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"mode": mode, "peak_mib": round(peak, 1), **out}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scrapes", type=int, default=60)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve)
        return
    if args.one:
        measure(args.one, args.scrapes)
        return
    results = {}
    for mode in ["normal", *[m for m in args.modes.split(",") if m != "normal"]]:
        out = subprocess.run([sys.executable, __file__, "--one", mode, "--scrapes", str(args.scrapes)],
                             capture_output=True, text=True, check=True, timeout=600)
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        print(json.dumps(results[mode]), flush=True)
    normal = results["normal"]["peak_mib"]
    worst = max(results, key=lambda m: results[m]["peak_mib"])
    print(json.dumps({"normal_peak_mib": normal, "worst_mode": worst, "worst_peak_mib": results[worst]["peak_mib"],
                      "worst_ratio": round(results[worst]["peak_mib"] / normal, 2),
                      "peaks": {m: r["peak_mib"] for m, r in results.items()}}))


if __name__ == "__main__":
    main()
