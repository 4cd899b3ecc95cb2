#!/usr/bin/env python3
"""Fault benchmark: SIGKILL the (simulated) vLLM server N times at random moments while the agent supervises it.

Measures how fast the agent notices each crash (from the kill to its `serving.crash` event), whether any
process of the killed run is left behind (the EngineCore survives a SIGKILL of the API server by design),
and whether every crash ends in a new ready run. Runs the real agent (`python -m lynxtop agent`) with the
simulated vLLM and fake NVML "sim"; nothing touches a GPU. The agent runs under RLIMIT_NOFILE 1024 (soft = hard,
the limit of the issue 11 incident). After the kills, a slowloris phase (benchmarks/slowloris.py: 1,500 half-sent
requests on the control socket and 1,100 idle TCP connections to metrics_listen, re-opened as the agent closes
them) measures status latency, missed ticks and log growth under the flood.

Last line of output: one JSON object {detect_p99_s, detect_median_s, orphans_left, restarts_ok, kills,
slowloris_conns_held, status_p99_ms_under_slowloris, ticks_missed_under_slowloris, log_bytes_under_slowloris, ...}.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import _support  # noqa: F401 - puts tests/ on sys.path for `support`
import slowloris
from support.agent_config import sim_profile, write_agent_config
from support.ports import free_port

from lynxtop.agent.serving import procs


class _Unix(http.client.HTTPConnection):
    def __init__(self, path: str):
        super().__init__("agent", timeout=5)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(5)
        self.sock.connect(self.path)


def status(sock: str) -> dict | None:
    try:
        c = _Unix(sock)
        c.request("GET", "/v1/status")
        return json.loads(c.getresponse().read())
    except (OSError, ValueError):
        return None


def wait_ready(sock: str, not_run: int | None, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = status(sock)
        if st and st["serving"]["state"] == "ready" and st["serving"]["run_id"] != not_run:
            return st
        time.sleep(0.02)
    raise TimeoutError(f"no ready run within {timeout} s (last: {st and st['serving']})")


@dataclass
class Tally:
    detect: list[float] = field(default_factory=list)  # seconds from SIGKILL to the serving.crash event
    orphans: int = 0
    restarts_ok: int = 0
    all_old: set[int] = field(default_factory=set)


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=60.0, help="per restart")
    ap.add_argument("--slowloris-seconds", type=float, default=20.0, help="0 = no slowloris phase")
    return ap.parse_args()


def _crash_ts(db: Path, run_id: int) -> int | None:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    row = conn.execute("SELECT ts_ms FROM events WHERE kind = 'serving.crash' AND run_id = ?", (run_id,)).fetchone()
    conn.close()
    return row[0] if row else None


def _kill_once(sock: str, db: Path, st: dict, timeout: float, t: Tally) -> tuple[dict, str]:
    """SIGKILL the serving leader, wait for the next ready run; returns its status and a line for the log."""
    pid, run_id = st["serving"]["pid"], st["serving"]["run_id"]
    old = set(procs.run_processes(None, pid, [pid]))
    t.all_old |= old
    killed_ms = time.time() * 1000
    os.kill(pid, signal.SIGKILL)
    try:
        st = wait_ready(sock, run_id, timeout)
        t.restarts_ok += 1
    except TimeoutError as exc:
        print(f"{exc}", file=sys.stderr)
        st = wait_ready(sock, run_id, timeout)
    left = [p for p in old if procs.alive(p)]
    t.orphans += len(left)
    crash = _crash_ts(db, run_id)
    if crash is not None:
        t.detect.append((crash - killed_ms) / 1000)
    return st, (f"run {run_id} pid {pid} ({len(old)} processes) -> run {st['serving']['run_id']}; detected in "
                f"{t.detect[-1] if crash is not None else float('nan'):.3f} s; left behind: {left}")


def _report(args: argparse.Namespace, t: Tally, flood: dict) -> int:
    detect = sorted(t.detect)
    p99 = detect[min(len(detect) - 1, max(0, int(round(0.99 * len(detect))) - 1))] if detect else None
    print(json.dumps({
        "detect_p99_s": round(p99, 4) if p99 is not None else None,
        "detect_median_s": round(statistics.median(detect), 4) if detect else None,
        "detect_max_s": round(detect[-1], 4) if detect else None,
        "orphans_left": t.orphans,
        "restarts_ok": t.restarts_ok,
        "kills": args.kills,
        "processes_killed_runs": len(t.all_old),
        "agent_nofile": slowloris.AGENT_NOFILE,
        **{k: v for k, v in flood.items() if not k.startswith("agent_")},
    }))
    flood_ok = not flood or ((flood["status_p99_ms_under_slowloris"] or 1e9) <= 100
                             and flood["ticks_missed_under_slowloris"] == 0
                             and flood["log_bytes_under_slowloris"] <= 1 << 20)
    return 0 if t.restarts_ok == args.kills and t.orphans == 0 and flood_ok else 1


def main() -> int:
    args = _args()
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="lynxtop-faults-"))
    sock = str(tmp / "agent.sock")
    db = tmp / "state" / "lynxtop.db"
    metrics_port = free_port()
    cfg = write_agent_config(tmp / "config.toml", db, sock, metrics_listen=f"127.0.0.1:{metrics_port}",
                             fake_nvml="sim", sample_interval_s=0.2, default_profile="sim", autostart=True,
                             backoff_initial_s=0.1, backoff_max_s=0.5, crash_loop_failures=1000,
                             gpu_release_timeout_s=10,
                             profiles=sim_profile("sim", readiness_timeout_s=60, stop_grace_s=5))
    env = dict(os.environ, LYNXTOP_SIM_STATE_DIR=str(tmp / "sim-state"))
    env.pop("NOTIFY_SOCKET", None)
    log = open(tmp / "agent.log", "wb")  # noqa: SIM115
    agent = subprocess.Popen([sys.executable, "-m", "lynxtop", "agent", "--config", str(cfg)], stdout=log,
                             stderr=subprocess.STDOUT, env=env, preexec_fn=slowloris.agent_limit)
    flood: dict = {}
    tally = Tally()
    try:
        st = wait_ready(sock, None, args.timeout)
        for i in range(args.kills):
            time.sleep(rng.uniform(0.1, 1.0))  # a random moment in the serving life
            st, line = _kill_once(sock, db, st, args.timeout, tally)
            print(f"kill {i + 1}/{args.kills}: {line}", file=sys.stderr)
        if args.slowloris_seconds > 0:
            wait_ready(sock, None, args.timeout)
            time.sleep(1.0)
            flood = slowloris.measure(sock, metrics_port, tmp / "agent.log", args.slowloris_seconds)
    finally:
        slowloris.stop_agent(agent, tmp / "sim-state")
        log.close()
    return _report(args, tally, flood)


if __name__ == "__main__":
    sys.exit(main())
