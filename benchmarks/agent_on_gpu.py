"""The whole agent on a real GPU node: `lynxtop agent` (real NVML, no profile) records a matmul load.

Run on a GPU machine where lynxtop is installed (`python3 -m pip install --no-deps --no-build-isolation .` is
enough where aiohttp, psutil, prometheus-client and nvidia-ml-py exist; the last flag where the machine has no
network) and torch is present:

    python3 benchmarks/agent_on_gpu.py

It starts the agent on a temporary state directory, idles a few seconds, runs a bf16 matmul loop on GPU 0, then
reads `lynxtop status --json` over the control socket and the samples from the history database. Never changes
clocks, power or modes. Last line: one JSON object; exit 1 when a check failed.
"""

from __future__ import annotations

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


def _matmul_load(seconds: float) -> tuple[int, int]:
    """A bf16 matmul loop on GPU 0; (start, end) in epoch ms."""
    import torch

    t_load = int(time.time() * 1000)
    a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()
    return t_load, int(time.time() * 1000)


def _median(rows: list[dict], col: str) -> float | None:
    return sorted(x[col] for x in rows)[len(rows) // 2] if rows else None


def _summary(status: dict, rows: list[dict], t_load: int, t_end: int) -> dict:
    """What the agent reported and recorded for GPU 0, idle before the load and busy during it."""
    gpu0 = [x for x in rows if x["gpu"] == 0]
    idle = [x for x in gpu0 if x["ts_ms"] < t_load and x.get("sm_active_pct") is not None]
    busy = [x for x in gpu0 if t_load + 1500 < x["ts_ms"] < t_end and x.get("sm_active_pct") is not None]
    return {
        "nvml": status["agent"]["nvml"], "gpus": [(g["name"], g.get("arch"), g.get("gpm_supported"))
                                                   for g in status["gpus"]],
        "simulated": status["agent"]["simulated"], "missed_ticks": status["agent"]["missed_ticks"],
        "rows_gpu0": len(gpu0),
        "idle_sm_active_max": max((x["sm_active_pct"] for x in idle), default=None),
        "busy_sm_active_median": _median(busy, "sm_active_pct"),
        "busy_tensor_active_median": _median(busy, "tensor_active_pct"),
        "busy_util_gpu_median": _median(busy, "util_gpu_pct"),
        "busy_power_w_max": max((x["power_w"] for x in busy), default=None),
    }


def _checks(out: dict) -> dict[str, bool]:
    return {
        "nvml_ok": out["nvml"]["state"] == "ok",
        "not_simulated": out["simulated"] is False,
        "idle_sm_below_5": out["idle_sm_active_max"] is not None and out["idle_sm_active_max"] < 5,
        "busy_sm_above_80": (out["busy_sm_active_median"] or 0) > 80,
        "busy_tensor_above_80": (out["busy_tensor_active_median"] or 0) > 80,
    }


def _measure(db: Path, sock: Path) -> dict:
    """Idle, load, then the agent's status and its recorded GPU samples."""
    from lynxtop.store.reader import StoreReader

    deadline = time.monotonic() + 30
    while not sock.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(3)  # idle samples
    t_load, t_end = _matmul_load(6)
    time.sleep(1.5)  # let the last ticks commit
    status = json.loads(subprocess.run([sys.executable, "-m", "lynxtop", "status", "--json", "--socket",
                                        str(sock)], capture_output=True, text=True, timeout=30).stdout)
    r = StoreReader(str(db))
    _, rows = r.series("gpu", ["sm_active_pct", "tensor_active_pct", "util_gpu_pct", "power_w",
                               "mem_used_bytes"], t_load - 60_000, t_end + 5_000, max_points=100_000)
    r.close()
    return _summary(status, rows, t_load, t_end)


def main() -> int:
    import torch  # noqa: F401 - fail before starting the agent when it is missing

    tmp = Path(tempfile.mkdtemp(prefix="lynxtop-agent-gpu-"))
    db, sock = tmp / "lynxtop.db", tmp / "agent.sock"
    cfg = write_agent_config(tmp / "config.toml", db, sock, sample_interval_s=0.5)
    log = open(tmp / "agent.log", "w")  # noqa: SIM115 - closed below
    agent = subprocess.Popen([sys.executable, "-m", "lynxtop", "agent", "--config", str(cfg)],
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    checks: dict[str, bool] = {}
    out: dict = {}
    try:
        out = _measure(db, sock)
        checks = _checks(out)
    finally:
        os.killpg(agent.pid, signal.SIGTERM)
        agent.wait(timeout=30)
        log.close()
    print((tmp / "agent.log").read_text()[-3000:])
    for name, ok in checks.items():
        print(("PASS " if ok else "FAIL ") + name)
    print(json.dumps({**out, "checks": checks}))
    return 0 if checks and all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
