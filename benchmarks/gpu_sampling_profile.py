"""Where the GPU sampling thread's time goes: the sampler alone on the simulator's 8 GPUs with DP8 engines.

The tick runs in isolation (no agent, no scrape, no store) on a manual clock stepped by the sampling period, so
the figures are CPU per tick, not wall time: `cpu_ms_per_tick` (process time of `GpuSampler.sample` over N
ticks, median of 5 blocks), `backend_share` (the part of cProfile's cumulative time spent inside the fake NVML
and the simulator's GPU model, which a real node pays in C inside libnvidia-ml), and with --profile the
top functions by own time. DP8: eight engines, one GPU each, under steady decode, their state files refreshed
as the simulated engines do. Last line: one JSON object.
Usage: python benchmarks/gpu_sampling_profile.py [--hz 10] [--ticks 300] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lynxtop.agent.gpu.fake import FakeNvml
from lynxtop.agent.gpu.sampler import GpuSampler
from lynxtop.sim.gpus import SimScenario
from lynxtop.sim.state import EngineState, Holder, process_identity, write_state


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def dp8_states(state_dir: Path) -> None:
    """Eight live engines (this process holds their memory, so they count as alive), one GPU each."""
    me = os.getpid()
    for i in range(8):
        write_state(state_dir, EngineState(
            engine_pid=100000 + i, api_pid=me, model="deepseek-ai/DeepSeek-V3", tp=1, gpus=[i],
            phase="ready", holders=[Holder(gpu=i, pid=me, start_ticks=process_identity(me), mem_bytes=120 << 30)],
            running=12, busy_frac=0.8, prefill_frac=0.2, decode_frac=0.8, mean_batch=12.0,
            prompt_tokens_per_s=800.0, generation_tokens_per_s=1500.0, updated_unix=time.time()))


def _cpu() -> float:
    return time.process_time()


def run(hz: float, ticks: int, profile: bool) -> dict:
    with tempfile.TemporaryDirectory() as d:
        state_dir = Path(d)
        dp8_states(state_dir)
        clock = Clock()
        scen = SimScenario(state_dir)
        s = GpuSampler(lambda: FakeNvml(scen, clock=clock), clock=clock, xid_events=False)
        assert s.open()["state"] == "ok"
        period = 1.0 / hz
        pids = {os.getpid()}

        def block(n: int) -> None:
            for _ in range(n):
                clock.t += period
                s.sample(pids)

        block(int(hz) * 2)  # warm: GPM has its previous sample, the slow reads are spread out
        per_tick = []
        for _ in range(5):
            dp8_states(state_dir)  # the engines publish about once a second
            c = _cpu()
            block(ticks // 5)
            per_tick.append((_cpu() - c) * 1000 / (ticks // 5))
        clock.t += period
        tick = s.sample(pids)
        assert len(tick.gpu_rows) == 8 and tick.gpu_rows[0]["sm_active_pct"] is not None
        prof = cProfile.Profile()
        prof.enable()
        block(ticks)
        prof.disable()
        s.close()
    st = pstats.Stats(prof)
    total = sum(v[2] for v in st.stats.values())  # own time of everything
    backend = sum(v[2] for (f, _, _), v in st.stats.items()
                  if f.endswith(("gpu/fake.py", "gpu/fake_driver.py", "gpu/scripted.py", "sim/gpus.py",
                                 "sim/state.py", "contract/files.py")))
    out = {"hz": hz, "ticks": ticks, "gpus": 8, "engines": 8,
           "cpu_ms_per_tick": round(statistics.median(per_tick), 3),
           "cpu_pct_of_core": round(statistics.median(per_tick) * hz / 10, 3),
           "backend_share": round(backend / total, 3) if total else None}
    if profile:
        st.sort_stats("tottime").print_stats(25)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hz", type=float, default=10.0)
    ap.add_argument("--ticks", type=int, default=300)
    ap.add_argument("--profile", action="store_true", help="print the top functions by own time")
    args = ap.parse_args()
    print(json.dumps(run(args.hz, args.ticks, args.profile)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
