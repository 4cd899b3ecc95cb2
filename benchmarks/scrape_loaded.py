"""CPU of one scrape of the simulated DP8 page under scale.py's streamed load, over pages captured 1 s apart.

scrape_api.py's sequence moves every counter by a random amount; a loaded server's page moves ~60 % of its values
a second and writes them in few strings (0.0, small bucket counts), which is what the agent reads at 1 Hz. So the
pages are captured from the simulator itself, then read in-process.

- `--capture DIR [--pages 30]`: run scale.py's agent (8 simulated GPUs, the simulated DP8+EP vLLM) under 32
  streams and save its /metrics page once a second into DIR (page000.txt, ...; ~310 KB each: not committed).
- `--pages-dir DIR [--rounds 10]`: each round a fresh `MetricsScraper` reads the first page (unmeasured), then
  every later one in order; medians of the CPU of one `parse_page` (parse and bookkeeping) and of its
  `PageLayout.parse` alone.
- `--metrics-from TREE`: read `lynxtop.agent.metrics` from another checkout (the old code of an A/B).

Run the arms one after another, alternating; the machine is shared and noisy. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import urllib.request
from pathlib import Path


def capture(out: Path, pages: int) -> None:
    """Save the loaded simulator's page once a second (the load runs from 4 s before the first to the last)."""
    import _support  # noqa: F401 - tests/ on sys.path, as scale.py needs
    from scale import _traffic, running_agent

    out.mkdir(parents=True, exist_ok=True)
    with running_agent(1.0, 1.0) as (_agent, _tmp, _sock, url):
        async def run() -> None:
            load = asyncio.create_task(_traffic(url, pages + 6, 32))
            await asyncio.sleep(4.0)
            for i in range(pages):
                body = await asyncio.to_thread(
                    lambda: urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=5).read())
                (out / f"page{i:03d}.txt").write_bytes(body)
                await asyncio.sleep(1.0)
            await load

        asyncio.run(run())


def measure(texts: list[str], rounds: int) -> dict[str, float | int]:
    """Median CPU ms of one scrape and of its parse over the sequence, `rounds` times from a fresh scraper."""
    from lynxtop.agent.metrics.layout import PageLayout
    from lynxtop.agent.metrics.scrape import MetricsScraper

    whole: list[float] = []
    parse: list[float] = []
    for _ in range(rounds):
        scraper, layout = MetricsScraper("http://bench:1"), PageLayout()
        scraper.parse_page(texts[0], 0.0)
        layout.parse(texts[0])
        for i, text in enumerate(texts[1:], start=1):
            t = time.process_time()
            row = scraper.parse_page(text, float(i))
            whole.append(time.process_time() - t)
            assert row["scrape_ok"] == 1, scraper.last_error
            t = time.process_time()
            layout.parse(text)
            parse.append(time.process_time() - t)
    return {"dp8_loaded_scrape_cpu_ms_median": round(statistics.median(whole) * 1000, 3),
            "dp8_loaded_parse_cpu_ms_median": round(statistics.median(parse) * 1000, 3),
            "pages": len(texts) - 1, "rounds": rounds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capture", type=Path, help="save the loaded simulator's pages into this folder")
    ap.add_argument("--pages", type=int, default=30)
    ap.add_argument("--pages-dir", type=Path, help="read the pages captured in this folder")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--metrics-from", type=Path, help="a checkout whose agent/metrics is read instead")
    args = ap.parse_args()
    if args.capture:
        capture(args.capture, args.pages)
        return
    if args.pages_dir is None:
        ap.error("--capture or --pages-dir")
    if args.metrics_from:  # before any of its modules is imported
        import lynxtop.agent.metrics as metrics

        metrics.__path__[:] = [str(args.metrics_from / "agent" / "metrics")]
    texts = [p.read_text() for p in sorted(args.pages_dir.glob("page*.txt"))]
    out = measure(texts, args.rounds)
    out["metrics_from"] = str(args.metrics_from or "this tree")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
