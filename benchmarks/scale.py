"""The agent at DeepSeek's deployment shape: 8 data-parallel engines with expert parallelism, 8 GPUs.

Measures, on this noisy shared machine, medians and whole-process CPU over wall time only:
- scrape_ms_dp1 / scrape_ms_dp8: median CPU time of one scrape's parse and bookkeeping (MetricsScraper.parse_page)
  of a vLLM 0.32 page from the simulator's families with 1 / 8 engines, counters moving between pages;
- agent_cpu_pct_1hz_8gpu_dp8, agent_rss_mb: the whole `lynxtop agent` process (8 simulated GPUs through the fake
  NVML, the simulated vLLM with --data-parallel-size 8 --enable-expert-parallel under a steady load of streamed
  requests) sampling and scraping at 1 Hz: CPU time over wall time in % of one core, and its RSS at the end;
- the same three with `_10hz_scrape_1hz`: GPUs and host at 10 Hz, /metrics at 1 Hz;
- status_get_cpu_ms_*: the agent's CPU per GET /v1/status (200 back to back after the measured window, less the
  agent's own rate meanwhile), what each poller (an idle dashboard: one a second) adds.
Each agent figure is the median of --runs fresh agents; `_spread` gives [min, max] of the runs, `_runs` all of them.

Targets (issue 29.3): scrape_ms_dp8 <= 10, agent CPU <= 0.5 % of a core at 1 Hz and <= 2 % at 10 Hz sampling,
RSS <= 120 MB. Last line: one JSON object.
Usage: python benchmarks/scale.py [--seconds 30] [--runs 3] [--quick]   (SCALE_PROFILE=FILE: under cProfile)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _support  # noqa: F401 - tests/ on sys.path
import psutil
from slowloris import stop_agent
from support.agent_config import sim_profile, write_agent_config
from support.vllm_pages import sim_page

from lynxtop.agent.metrics.scrape import MetricsScraper
from lynxtop.contract.client import AgentClient, AgentUnreachable
from lynxtop.sim.loadgen import LoadGenerator, Phase

_COUNTER = re.compile(r"^(vllm:\S+?(?:_total|_bucket|_sum|_count)(?:\{[^}]*\})?) (\S+)$", re.MULTILINE)


def _grown(text: str, rng: random.Random) -> str:
    return _COUNTER.sub(lambda m: f"{m.group(1)} {float(m.group(2)) + rng.randint(0, 20)}", text)


def scrape_ms(engines: int, pages: int) -> tuple[float, int]:
    """(median ms of parse_page over `pages` successive pages, lines per page)."""
    rng = random.Random(engines)
    texts = [sim_page(engines, seed=engines)]
    for _ in range(pages):
        texts.append(_grown(texts[-1], rng))
    s = MetricsScraper("http://bench:1")
    s.parse_page(texts[0], now=0.0)
    times = []
    for i, text in enumerate(texts[1:], start=1):
        t = time.process_time()
        row = s.parse_page(text, now=float(i))
        times.append(time.process_time() - t)
        assert row["scrape_ok"] == 1, s.last_error
    return round(statistics.median(times) * 1000, 2), len(texts[0].splitlines())


def _wait_ready(sock: str, agent: subprocess.Popen, log: Path, timeout: float = 90) -> dict[str, Any]:
    client = AgentClient(sock, timeout_s=5)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if agent.poll() is not None:
            break
        with contextlib.suppress(AgentUnreachable):
            st = client.status()
            if st.serving.state.value == "ready" and st.serving.url:
                return {"url": st.serving.url}
        time.sleep(0.2)
    raise SystemExit(f"the agent did not get to ready; its log:\n{log.read_text()[-3000:]}")


async def _traffic(url: str, seconds: float, streams: int) -> dict[str, Any]:
    phase = Phase("steady", 0, streams, (400, 900), (64, 160), 0.0)
    gen = LoadGenerator(url, pattern=(phase,), seed=1)
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(seconds, stop.set)
    stats = await gen.run(stop)
    return stats.summary(seconds)


@contextlib.contextmanager
def running_agent(sample_s: float, scrape_s: float, env_extra: dict[str, str] | None = None
                  ) -> Iterator[tuple[subprocess.Popen, Path, str, str]]:
    """A `lynxtop agent` on 8 simulated GPUs serving the simulated DP8+EP vLLM, ready: (process, tmp dir, socket,
    server url). Shared with benchmarks/soak.py so both measure the same agent."""
    tmp = Path(tempfile.mkdtemp(prefix="lynxtop-scale-"))
    sock = str(tmp / "agent.sock")
    prof = sim_profile("dp8ep", tp=1, data_parallel_size=8, enable_expert_parallel=True, readiness_timeout_s=90,
                       stop_grace_s=5, sim_args=("--sim-speed", "4"))
    cfg = write_agent_config(tmp / "config.toml", tmp / "state" / "lynxtop.db", sock, fake_nvml="sim",
                             sample_interval_s=sample_s, scrape_interval_s=scrape_s, default_profile="dp8ep",
                             autostart=True, profiles=prof)
    env = dict(os.environ, LYNXTOP_SIM_STATE_DIR=str(tmp / "sim-state"), **(env_extra or {}))
    env.pop("NOTIFY_SOCKET", None)
    log_path = tmp / "agent.log"
    with open(log_path, "wb") as log:
        cprof = ["-m", "cProfile", "-o", os.environ["SCALE_PROFILE"]] if os.environ.get("SCALE_PROFILE") else []
        agent = subprocess.Popen([sys.executable, *cprof, "-m", "lynxtop", "agent", "--config", str(cfg)],
                                 stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            yield agent, tmp, sock, _wait_ready(sock, agent, log_path)["url"]
        finally:
            stop_agent(agent, tmp / "sim-state")


def agent_cost(sample_s: float, scrape_s: float, seconds: float, streams: int) -> dict[str, Any]:
    """The whole agent process' CPU (% of one core), per thread too, and RSS while it samples 8 GPUs and scrapes a
    DP8 server; its status read at the end of the measured window, while the load still runs."""
    from agent_threads import thread_cpu_s, thread_names  # it imports this module: imported here, once loaded

    with running_agent(sample_s, scrape_s) as (agent, _tmp, sock, url):
        proc = psutil.Process(agent.pid)
        load: dict[str, Any] = {}
        seen: dict[str, Any] = {}

        async def measured() -> tuple[float, float]:
            await asyncio.sleep(2.0)  # the first scrapes and the load's ramp are not the steady state
            seen["status0"] = await asyncio.to_thread(AgentClient(sock, timeout_s=5).status)
            c0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
            seen["threads0"] = thread_cpu_s(agent.pid)
            await asyncio.sleep(seconds)
            cpu, wall = sum(proc.cpu_times()[:2]) - c0, time.monotonic() - t0
            seen["threads1"] = thread_cpu_s(agent.pid)
            # Read while the load runs, not after it: once it stops the simulated server is busy closing its
            # streams and its page times out for seconds, so the status showed no engines ("engines": 0). A scrape
            # that fails in the window shows no engines too (and costs no parse): `scrapes_failed` counts them.
            seen["status"] = await asyncio.to_thread(AgentClient(sock, timeout_s=5).status)
            seen["status_get_cpu_ms"] = await asyncio.to_thread(status_get_cpu_ms, proc, sock, cpu / wall)
            return cpu, wall

        async def both() -> tuple[float, float]:
            task = asyncio.create_task(measured())
            load.update(await _traffic(url, seconds + 3.0, streams))
            return await task

        cpu, wall = asyncio.run(both())
        names = thread_names(agent.pid)
        st = seen["status"]
        errors = [x.serving_metrics.metric("scrape_errors") for x in (seen["status0"], st)]
        return {"cpu_pct": round(100.0 * cpu / wall, 3), "rss_mb": round(proc.memory_info().rss / 2**20, 1),
                "threads_pct": _per_thread(seen["threads0"], seen["threads1"], names, agent.pid, wall),
                "status_get_cpu_ms": seen["status_get_cpu_ms"],
                "engines": len(st.engines), "gpus": len(st.gpus), "missed_ticks": st.agent.missed_ticks,
                "scrape_ok": st.serving_metrics.metric("scrape_ok"),
                "scrapes_failed": None if None in errors else errors[1] - errors[0],
                "requests_done": load.get("completed"), "tokens_per_s": round(load.get("output_throughput") or 0, 1)}


def status_get_cpu_ms(proc: psutil.Process, sock: str, base_rate: float, n: int = 200) -> float:
    """The agent's CPU per GET /v1/status (ms), as pollers such as idle dashboards pay it: `n` GETs back to back,
    less what the agent spent meanwhile at its measured rate without them (`base_rate`, CPU s per wall s)."""
    client = AgentClient(sock, timeout_s=5)
    c0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
    for _ in range(n):
        client.request("GET", "/v1/status")
    cpu, wall = sum(proc.cpu_times()[:2]) - c0, time.monotonic() - t0
    return round(1000.0 * max(cpu - base_rate * wall, 0.0) / n, 3)


def _per_thread(c0: dict[int, float], c1: dict[int, float], names: dict[int, str], pid: int, wall: float
                ) -> dict[str, float]:
    """% of one core per thread name over the window (executor threads summed: asyncio_*, the GPU and host
    sampling); the main thread (the event loop: ticks, scrape and parse, API) as `main`."""
    by: dict[str, float] = {}
    for tid, cpu in c1.items():
        name = "main" if tid == pid else re.sub(r"_\d+$", "_*", names.get(tid, "unnamed"))
        by[name] = by.get(name, 0.0) + cpu - c0.get(tid, 0.0)
    return {k: round(100.0 * v / wall, 3) for k, v in sorted(by.items(), key=lambda kv: -kv[1])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="measured seconds per agent run")
    ap.add_argument("--streams", type=int, default=32, help="concurrent streamed requests of the load")
    ap.add_argument("--runs", type=int, default=3, help="agents measured per rate (median and spread)")
    ap.add_argument("--quick", action="store_true", help="short runs (for tests); numbers are rougher")
    args = ap.parse_args()
    seconds, pages = (6.0, 15) if args.quick else (args.seconds, 60)
    out: dict[str, Any] = {"gpus": "8 simulated (fake NVML)", "server": "simulated vLLM 0.32, DP8 + EP, TP1"}
    for engines in (1, 8):
        ms, lines = scrape_ms(engines, pages)
        out[f"scrape_ms_dp{engines}"], out[f"page_lines_dp{engines}"] = ms, lines
    for suffix, sample_s, scrape_s in (("1hz_8gpu_dp8", 1.0, 1.0), ("10hz_scrape_1hz", 0.1, 1.0)):
        runs = [agent_cost(sample_s, scrape_s, seconds, args.streams) for _ in range(1 if args.quick else args.runs)]
        cpu = [r["cpu_pct"] for r in runs]
        rss_key = "agent_rss_mb" if suffix.startswith("1hz") else f"agent_rss_mb_{suffix}"
        out[f"agent_cpu_pct_{suffix}"] = round(statistics.median(cpu), 3)
        out[f"agent_cpu_pct_{suffix}_spread"] = [min(cpu), max(cpu)]
        out[f"agent_cpu_pct_{suffix}_runs"] = cpu
        out[rss_key] = max(r["rss_mb"] for r in runs)
        out[f"details_{suffix}"] = runs[-1]
        out[f"status_get_cpu_ms_{suffix}"] = statistics.median(r["status_get_cpu_ms"] for r in runs)
        out[f"main_thread_pct_{suffix}_runs"] = [r["threads_pct"].get("main") for r in runs]  # the event loop
    out["scrape_ms_dp8_10hz_scrape_1hz"] = out["scrape_ms_dp8"]  # the scrape itself does not change with the tick
    out["targets"] = {"scrape_ms_dp8": 10.0, "agent_cpu_pct_1hz_8gpu_dp8": 0.5, "agent_cpu_pct_10hz_scrape_1hz": 2.0,
                      "agent_rss_mb": 120.0}
    out["pass"] = all(out[k] <= v for k, v in out["targets"].items())
    out["quick"] = args.quick
    print(json.dumps(out), flush=True)
    return 0 if out["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
