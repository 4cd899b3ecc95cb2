"""The event loop's CPU per /health probe: the aiohttp GET (`HttpClient.get`) against the kept-alive probe
(`HttpClient.status`), on an aiohttp server in another process answering as vLLM does (200, no body).

The client's thread CPU (time.thread_time) over `--probes` probes back to back, per probe in microseconds;
`--rounds` rounds alternate the two ways, medians reported. Last line: one JSON object.
Usage: python benchmarks/health_probe.py [--probes 300] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time

import _support  # noqa: F401 - tests/ on sys.path
from support.ports import free_port

from lynxtop.agent.serving.health import HttpClient

SERVER = """
import sys
from aiohttp import web
app = web.Application()
app.router.add_get("/health", lambda request: web.Response(status=200))
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


async def measure(url: str, probes: int, rounds: int) -> dict:
    http = HttpClient()
    ways = {"aiohttp_get": lambda: http.get(url), "kept_status": lambda: http.status(url)}
    per: dict[str, list[float]] = {k: [] for k in ways}
    try:
        for _ in range(rounds):
            for name, probe in ways.items():
                assert (await probe()) in (200, (200, None)), name
                c0 = time.thread_time()
                for _ in range(probes):
                    await probe()
                per[name].append((time.thread_time() - c0) / probes * 1e6)
    finally:
        await http.close()
    return {k: {"rounds": [round(x, 1) for x in v], "us_per_probe_median": round(statistics.median(v), 1)}
            for k, v in per.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--probes", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)])
    try:
        url = f"http://127.0.0.1:{port}/health"

        async def ready() -> None:
            http = HttpClient()
            try:
                for _ in range(200):
                    if await http.status(url, 1.0) == 200:
                        return
                    await asyncio.sleep(0.05)
                raise SystemExit("the server did not answer")
            finally:
                await http.close()

        asyncio.run(ready())
        out = asyncio.run(measure(url, a.probes, a.rounds))
    finally:
        server.terminate()
        server.wait(timeout=10)
    print(json.dumps({"bench": "health_probe", "probes": a.probes, **out}))


if __name__ == "__main__":
    main()
