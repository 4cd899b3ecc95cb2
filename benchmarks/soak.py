"""Soak: the agent for >= 30 minutes at 10 Hz sampling on 8 simulated GPUs with a DP8 server under traffic.

scale.py's 30 s RSS is not the steady state (issue 29.1: RSS rose 67 -> 112 MB over 43 minutes), so this runs the
same agent (scale.running_agent) long and samples, every --every seconds: RSS split into anonymous, file-backed
and shared (/proc/<pid>/status), open fds, threads, CPU. It reports the RSS at the end, its slope over the last
10 minutes (least squares, MB/min; the last third on a --quick run), the fds' range, and the database's growth
per hour, whole and per table (dbstat bytes and rows, first sample to last, read through a read-only connection).

Targets: steady-state RSS <= 120 MB, slope <= 0.1 MB/min. Last line: one JSON object.
--tracemalloc FILE: the agent traces its allocations (benchmarks/memtrace/sitecustomize.py) and appends the
sites that grew most to FILE every minute: what grows, when the slope says something does (the trace itself
costs memory and CPU, so its RSS figures are not the soak's).
Usage: python benchmarks/soak.py [--minutes 30] [--quick] [--tracemalloc FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import _support  # noqa: F401 - tests/ on sys.path
from scale import _traffic, running_agent

_MB = 1024.0  # /proc reports kB


def memory(pid: int) -> dict[str, float]:
    """RSS and its anonymous / file-backed / shared parts in MB, from /proc/<pid>/status."""
    keys = {"VmRSS": "rss_mb", "RssAnon": "anon_mb", "RssFile": "file_mb", "RssShmem": "shmem_mb"}
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in keys:
            out[keys[name]] = round(int(rest.split()[0]) / _MB, 2)
    return out


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tables(db: Path) -> dict[str, dict[str, int]]:
    """{table: {bytes, rows}}: bytes of the table and its indexes (dbstat), rows by count(*)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        owner = dict(conn.execute("SELECT name, tbl_name FROM sqlite_master WHERE type IN ('table', 'index')"))
        out: dict[str, dict[str, int]] = {}
        for name, size in conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"):
            t = owner.get(name, name)
            out.setdefault(t, {"bytes": 0, "rows": 0})["bytes"] += size
        for t in list(out):
            if t in owner.values() and not t.startswith("sqlite_"):
                out[t]["rows"] = conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]
        return out
    finally:
        conn.close()


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (minute, MB) points, MB/min."""
    if len(points) < 2:
        return 0.0
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


def db_files(db: Path) -> int:
    return sum(p.stat().st_size for p in db.parent.glob(db.name + "*") if p.is_file())


async def soak(pid: int, db: Path, url: str, seconds: float, every: float, streams: int, tail_s: float
               ) -> dict[str, Any]:
    samples: list[dict[str, Any]] = []
    t0 = time.monotonic()
    first_tables, first_db = tables(db), db_files(db)

    async def sampler() -> None:
        while True:
            el = time.monotonic() - t0
            s = {"min": round(el / 60, 3), **memory(pid), "fds": len(os.listdir(f"/proc/{pid}/fd")),
                 "threads": len(os.listdir(f"/proc/{pid}/task")), "cpu_s": round(cpu_s(pid), 2),
                 "db_mb": round(db_files(db) / 2**20, 2)}
            samples.append(s)
            print(json.dumps({"sample": s}), flush=True)
            if el >= seconds:
                return
            await asyncio.sleep(min(every, max(0.0, seconds - el)))

    load, _ = await asyncio.gather(_traffic(url, seconds + 1.0, streams), sampler())
    hours = (time.monotonic() - t0) / 3600
    last_tables, last_db = tables(db), db_files(db)
    per_table = {t: {"bytes_per_h": round((v["bytes"] - first_tables.get(t, {}).get("bytes", 0)) / hours),
                     "rows_per_h": round((v["rows"] - first_tables.get(t, {}).get("rows", 0)) / hours),
                     "bytes": v["bytes"], "rows": v["rows"]}
                 for t, v in sorted(last_tables.items())}
    tail = [s for s in samples if s["min"] >= samples[-1]["min"] - tail_s / 60]
    first, last = samples[0], samples[-1]
    return {
        "minutes": round(last["min"], 2), "tail_minutes": round(tail_s / 60, 2),
        "rss_mb_start": first["rss_mb"], "rss_mb_end": last["rss_mb"],
        "rss_mb_max": max(s["rss_mb"] for s in samples),
        "anon_mb_start": first["anon_mb"], "anon_mb_end": last["anon_mb"],
        "file_mb_start": first["file_mb"], "file_mb_end": last["file_mb"],
        "shmem_mb_end": last.get("shmem_mb"),
        "rss_slope_mb_per_min_tail": round(slope([(s["min"], s["rss_mb"]) for s in tail]), 4),
        "anon_slope_mb_per_min_tail": round(slope([(s["min"], s["anon_mb"]) for s in tail]), 4),
        # the page caches fill for ~25 min at 10 Hz (docs/performance.md): where the plateau begins, its slope
        "rss_slope_mb_per_min_last5": round(slope([(s["min"], s["rss_mb"]) for s in samples
                                                   if s["min"] >= last["min"] - 5]), 4),
        "rss_within_1mb_of_end_from_min": next(s["min"] for s in samples
                                               if all(abs(x["rss_mb"] - last["rss_mb"]) <= 1.0
                                                      for x in samples if x["min"] >= s["min"])),
        "file_slope_mb_per_min_tail": round(slope([(s["min"], s["file_mb"]) for s in tail]), 4),
        "fds_min": min(s["fds"] for s in samples), "fds_max": max(s["fds"] for s in samples),
        "threads_end": last["threads"],
        "cpu_pct": round(100 * (last["cpu_s"] - first["cpu_s"]) / max(1e-9, 60 * (last["min"] - first["min"])), 3),
        "db_mb_end": round(last_db / 2**20, 2), "db_mb_per_h": round((last_db - first_db) / 2**20 / hours, 2),
        "tables": per_table, "requests_done": load.get("completed"),
        "rss_series": [[s["min"], s["rss_mb"], s["anon_mb"], s["file_mb"]]
                       for s in samples[:: max(1, len(samples) // 60)]],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="soak length (>= 30 for the issue's figure)")
    ap.add_argument("--quick", action="store_true", help="a 2-minute smoke run; the slope is over its last third")
    ap.add_argument("--sample-s", type=float, default=0.1, help="the agent's GPU/host sampling interval")
    ap.add_argument("--scrape-s", type=float, default=1.0, help="the agent's /metrics scrape interval")
    ap.add_argument("--streams", type=int, default=8, help="concurrent streamed requests of the load")
    ap.add_argument("--every", type=float, default=10.0, help="seconds between samples of the agent")
    ap.add_argument("--tracemalloc", metavar="FILE", help="trace the agent's allocations, growth per site to FILE")
    args = ap.parse_args()
    if args.tracemalloc:  # inherited by the agent (and ignored by every other process, see memtrace/)
        os.environ["LYNXTOP_TRACEMALLOC_OUT"] = str(Path(args.tracemalloc).resolve())
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent / "memtrace"),
                                                                 os.environ.get("PYTHONPATH")]))
    minutes = 2.0 if args.quick else args.minutes
    tail_s = min(600.0, minutes * 60 / 3)
    with running_agent(args.sample_s, args.scrape_s) as (agent, tmp, _sock, url):
        db = tmp / "state" / "lynxtop.db"
        out = asyncio.run(soak(agent.pid, db, url, minutes * 60, 2.0 if args.quick else args.every, args.streams,
                               tail_s))
        out["agent_log"] = str(tmp / "agent.log")
    out.update(sample_s=args.sample_s, scrape_s=args.scrape_s, streams=args.streams, quick=args.quick,
               tracemalloc=args.tracemalloc)
    out["targets"] = {"rss_mb_end": 120.0, "rss_slope_mb_per_min_tail": 0.1}
    out["pass"] = all(out[k] <= v for k, v in out["targets"].items())
    print(json.dumps(out), flush=True)
    return 0 if out["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
