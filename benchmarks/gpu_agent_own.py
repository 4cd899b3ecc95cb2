"""The agent's own Python in a GPU tick: the sampler over the frozen DP8 node, every NVML answer made constant.

gpu_sampling_profile.py times the sampler with the fake NVML and the simulator's model behind it, which a real
node pays in C inside libnvidia-ml; its `backend_share` comes from cProfile, which inflates small Python calls.
Here the node of `gpu_sampling_profile.py --frozen-model` is warmed up, then every function a tick calls is
swapped for a C-level answer (`dict.get` over integer handles holding each GPU's last real answer; `id` for
nvmlGpmMetricsGet, which leaves the last answer in the reused struct), so `own_ms_per_tick` (process time per
tick, median of 7 blocks, with its spread) is the agent's reading path alone: wrappers, checks, rounding, rows.
The process-utilisation read answers NOT_FOUND (a Python raise, as on an idle GPU). Last line: one JSON object.
Usage: python benchmarks/gpu_agent_own.py [--hz 10] [--ticks 2100]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pynvml
from gpu_sampling_profile import Clock, dp8_states

from lynxtop.agent.gpu.fake import FakeNvml
from lynxtop.agent.gpu.sampler import GpuSampler
from lynxtop.sim.gpus import SimScenario

_CONSTANT = ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetCurrentClocksEventReasons",
             "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetRemappedRows",
             "nvmlDeviceGetTotalEnergyConsumption")


def _not_found(handle: int, since: int) -> None:
    raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)


def constant_answers(s: GpuSampler, b: FakeNvml) -> None:
    """Every per-tick call of `s` answered by C code from the GPUs' last real answers (handles become ints)."""
    gpus = s._gpus
    real = [g.handle for g in gpus]

    def const(fn: str, *args: object) -> object:
        return {i: getattr(b, fn)(h, *args) for i, h in enumerate(real)}.get

    for fn in _CONSTANT:
        setattr(b, fn, const(fn))
    b.nvmlDeviceGetClockInfo = const("nvmlDeviceGetClockInfo", pynvml.NVML_CLOCK_SM)  # (handle, clock): 2 args
    b.nvmlDeviceGetTemperature = const("nvmlDeviceGetTemperature", pynvml.NVML_TEMPERATURE_GPU)
    mem = {i: b.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2) for i, h in enumerate(real)}
    b.nvmlDeviceGetMemoryInfo = lambda h, version=None: mem[h]
    b.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: 0
    b.nvmlDeviceGetProcessUtilization = _not_found
    b.nvmlGpmSampleGet = {}.get
    b.nvmlGpmMetricsGet = id
    for i, g in enumerate(gpus):
        g.handle = i
        if g.gpm is not None:
            g.gpm._h = i
            if hasattr(g.gpm, "_get"):  # the GPM reader binds its sample call once
                g.gpm._get = b.nvmlGpmSampleGet
    if hasattr(s._readings, "_bound"):  # and the per-tick readings theirs: bind again
        s._readings._bound = None


def run(hz: float, ticks: int, blocks: int = 7) -> dict:
    with tempfile.TemporaryDirectory() as d:
        state_dir = Path(d)
        dp8_states(state_dir)
        clock = Clock()
        scen = SimScenario(state_dir)
        first = [scen.state(i, clock.t) for i in range(8)]
        scen.state = lambda index, now: first[index]  # type: ignore[method-assign]
        made: list[FakeNvml] = []

        def factory() -> FakeNvml:
            made.append(FakeNvml(scen, clock=clock))
            return made[-1]

        s = GpuSampler(factory, clock=clock, xid_events=False)
        assert s.open()["state"] == "ok"
        period, pids = 1.0 / hz, {os.getpid()}
        for _ in range(int(hz) * 3):  # warm: GPM has its samples, every slow read done once
            clock.t += period
            s.sample(pids)
        constant_answers(s, made[0])
        for _ in range(int(hz) * 2):
            clock.t += period
            s.sample(pids)

        def block(n: int) -> float:
            spent = 0.0
            for _ in range(n):
                clock.t += period
                c = time.process_time()
                s.sample(pids)
                spent += time.process_time() - c
            return spent * 1000 / n

        per = [block(max(1, ticks // blocks)) for _ in range(blocks)]
        clock.t += period
        tick = s.sample(pids)
        assert len(tick.gpu_rows) == 8 and tick.gpu_rows[0]["sm_active_pct"] is not None
    return {"hz": hz, "ticks": ticks, "gpus": 8, "own_ms_per_tick": round(statistics.median(per), 4),
            "spread": [round(min(per), 4), round(max(per), 4)],
            "own_us_per_gpu_tick": round(statistics.median(per) * 1000 / 8, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hz", type=float, default=10.0)
    ap.add_argument("--ticks", type=int, default=2100)
    args = ap.parse_args()
    print(json.dumps(run(args.hz, args.ticks)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
