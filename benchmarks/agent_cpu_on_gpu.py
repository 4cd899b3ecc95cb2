"""The whole agent's CPU on a real GPU node: `lynxtop agent` (real NVML, no profile) at 1 Hz and 10 Hz sampling.

scale.py measures the agent on 8 simulated GPUs behind the fake NVML, where the fake and the simulator's GPU model
run inside the agent process; this is the same agent on real GPUs, where those costs are the driver's. Run on a
GPU machine where lynxtop is installed (`python3 -m pip install --no-deps --no-build-isolation .`: the last flag
where the machine has no network, as pip would fetch setuptools otherwise):

    python3 benchmarks/agent_cpu_on_gpu.py [--seconds 20] [--rates 1,10]

Per rate: the process' utime+stime over the measured seconds (after a warm-up), as % of one core, and each thread's
share from /proc/<pid>/task/*/stat (Python threads are not named at the OS level, so threads are listed by their
share, largest first), voluntary context switches a second, RSS, and the agent's missed ticks. Only reads NVML;
never changes clocks, power or modes. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _support  # noqa: F401 - puts tests/ on sys.path for `support`
from support.agent_config import write_agent_config

_TICK = os.sysconf("SC_CLK_TCK")


def _threads(pid: int) -> dict[int, tuple[float, int]]:
    """tid -> (utime+stime seconds, voluntary context switches)."""
    out: dict[int, tuple[float, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rpartition(")")[2].split()
            vol = next(int(x.split()[1]) for x in (task / "status").read_text().splitlines()
                       if x.startswith("voluntary_ctxt_switches"))
        except (OSError, StopIteration):
            continue
        out[int(task.name)] = ((int(fields[11]) + int(fields[12])) / _TICK, vol)
    return out


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def _status(sock: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "lynxtop", "status", "--json", "--socket", str(sock)],
                          capture_output=True, text=True, timeout=30)
    return json.loads(done.stdout)


def measure(hz: float, seconds: float, warmup: float) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="lynxtop-agent-cpu-"))
    db, sock = tmp / "lynxtop.db", tmp / "agent.sock"
    cfg = write_agent_config(tmp / "config.toml", db, sock, sample_interval_s=1.0 / hz)
    log = open(tmp / "agent.log", "w")  # noqa: SIM115 - closed below
    agent = subprocess.Popen([sys.executable, "-m", "lynxtop", "agent", "--config", str(cfg)],
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(warmup)
        before, w0 = _threads(agent.pid), time.monotonic()
        time.sleep(seconds)
        after, wall = _threads(agent.pid), time.monotonic() - w0
        st = _status(sock)
        rss = _rss_mb(agent.pid)
    finally:
        os.killpg(agent.pid, signal.SIGTERM)
        agent.wait(timeout=30)
        log.close()
    per = sorted(((after[t][0] - before.get(t, (0.0, 0))[0], after[t][1] - before.get(t, (0.0, 0))[1])
                  for t in after), reverse=True)
    cpu = sum(c for c, _ in per)
    return {"sample_hz": hz, "seconds": round(wall, 1), "cpu_pct": round(100 * cpu / wall, 3),
            "threads_pct": [round(100 * c / wall, 3) for c, _ in per if c > 0],
            "threads_vol_ctx_per_s": [round(v / wall, 1) for c, v in per if c > 0],
            "rss_mb": rss, "gpus": len(st.get("gpus", [])), "simulated": st["agent"]["simulated"],
            "missed_ticks": st["agent"]["missed_ticks"], "nvml": st["agent"]["nvml"].get("state")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--rates", default="1,10", help="sampling rates in Hz, comma-separated")
    args = ap.parse_args()
    out = {f"{r}hz": measure(float(r), args.seconds, args.warmup) for r in args.rates.split(",")}
    for k, v in out.items():
        print(k, v, file=sys.stderr)
    print(json.dumps(out))
    return 0 if all(v["nvml"] == "ok" and not v["simulated"] for v in out.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
