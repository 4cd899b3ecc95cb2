"""Where the GPU sampling thread's time goes: the sampler alone on the simulator's 8 GPUs with DP8 engines.

The tick runs in isolation (no agent, no scrape, no store) on a manual clock stepped by the sampling period, so
the figures are CPU per tick, not wall time: `cpu_ms_per_tick` (process time of `GpuSampler.sample` over N
ticks, median of 5 blocks), `backend_share` (the part of cProfile's cumulative time spent inside the fake NVML
and the simulator's GPU model, which a real node pays in C inside libnvidia-ml), and with --profile the
top functions by own time. DP8: eight engines, one GPU each, under streamed decode, each publishing its state
file twice a second (staggered, its figures moving a little each time) as the simulated engines do; the
publishes are not counted. With --frozen-model the model answers the 8 states of its first look for ever: the
difference is what the simulator's model (and the new segments it sets off in the fake) costs a tick.
Last line: one JSON object.
Usage: python benchmarks/gpu_sampling_profile.py [--hz 10] [--ticks 300] [--profile [--sort cumulative] [--top 25]]
       [--frozen-model]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
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


def dp8_states(state_dir: Path, only: int | None = None, k: int = 0) -> None:
    """Eight live engines (this process holds their memory, so they count as alive), one GPU each; `only` one of
    them, publishing its `k`-th interval: streamed load moves its figures a little at every publish."""
    me = os.getpid()
    ticks = process_identity(me)
    wobble = 0.05 * math.sin(0.7 * k)
    for i in range(8) if only is None else (only,):
        write_state(state_dir, EngineState(
            engine_pid=100000 + i, api_pid=me, model="deepseek-ai/DeepSeek-V3", tp=1, gpus=[i],
            phase="ready", holders=[Holder(gpu=i, pid=me, start_ticks=ticks, mem_bytes=120 << 30)],
            running=12, busy_frac=0.8 + wobble, prefill_frac=0.2 - wobble, decode_frac=0.8 + wobble,
            mean_batch=12.0 + 10 * wobble, prompt_tokens_per_s=800.0 * (1 - wobble),
            generation_tokens_per_s=1500.0 * (1 + wobble), updated_unix=time.time()))


class Publisher:
    """The engines' publishes on the benchmark's clock: each engine twice a second, staggered, as the simulated
    engines of a streamed DP8 load do (so the GPU model steps on new figures, not a frozen node)."""

    PERIOD_S = 0.5

    def __init__(self, state_dir: Path, start: float):
        self.state_dir = state_dir
        self.due = [start + i * self.PERIOD_S / 8 for i in range(8)]
        self.k = 0

    def __call__(self, now: float) -> None:
        for i, due in enumerate(self.due):
            if now >= due:
                self.k += 1
                dp8_states(self.state_dir, only=i, k=self.k)
                self.due[i] = due + self.PERIOD_S * max(1, int((now - due) / self.PERIOD_S) + 1)


def _cpu() -> float:
    return time.process_time()


def run(hz: float, ticks: int, profile: bool, frozen: bool = False, sort: str = "tottime", top: int = 25) -> dict:
    with tempfile.TemporaryDirectory() as d:
        state_dir = Path(d)
        dp8_states(state_dir)
        # the directory as a running node's is: created long ago (its later publishes are written in place), so
        # the model's reader lists it once, not at every step as it must while its mtime is too recent to trust
        old = time.time_ns() - 60 * 10**9
        os.utime(state_dir, ns=(old, old))
        clock = Clock()
        scen = SimScenario(state_dir)
        if frozen:
            first = [scen.state(i, clock.t) for i in range(8)]
            scen.state = lambda index, now: first[index]  # type: ignore[method-assign]
        s = GpuSampler(lambda: FakeNvml(scen, clock=clock), clock=clock, xid_events=False)
        assert s.open()["state"] == "ok"
        period = 1.0 / hz
        pids = {os.getpid()}

        publish = Publisher(state_dir, clock.t)

        def block(n: int, prof: cProfile.Profile | None = None) -> float:
            """CPU seconds of `n` ticks' sampling (the engines' publishes in between are not counted)."""
            spent = 0.0
            for _ in range(n):
                clock.t += period
                publish(clock.t)
                if prof is not None:
                    prof.enable()
                c = _cpu()
                s.sample(pids)
                spent += _cpu() - c
                if prof is not None:
                    prof.disable()
            return spent

        block(int(hz) * 2)  # warm: GPM has its previous sample, the slow reads are spread out
        per_tick = [block(ticks // 5) * 1000 / (ticks // 5) for _ in range(5)]
        clock.t += period
        tick = s.sample(pids)
        assert len(tick.gpu_rows) == 8 and tick.gpu_rows[0]["sm_active_pct"] is not None
        prof = cProfile.Profile()
        block(ticks, prof)
        s.close()
    st = pstats.Stats(prof)
    total = sum(v[2] for v in st.stats.values())  # own time of everything
    backend = sum(v[2] for (f, _, _), v in st.stats.items()
                  if f.endswith(("gpu/fake.py", "gpu/fake_driver.py", "gpu/scripted.py", "sim/gpus.py",
                                 "sim/state.py", "contract/files.py")))
    out = {"hz": hz, "ticks": ticks, "gpus": 8, "engines": 8, "frozen_model": frozen,
           "cpu_ms_per_tick": round(statistics.median(per_tick), 3),
           "cpu_pct_of_core": round(statistics.median(per_tick) * hz / 10, 3),
           "backend_share": round(backend / total, 3) if total else None}
    if profile:
        st.sort_stats(sort).print_stats(top)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hz", type=float, default=10.0)
    ap.add_argument("--ticks", type=int, default=300)
    ap.add_argument("--profile", action="store_true", help="print the top functions by own time")
    ap.add_argument("--frozen-model", action="store_true", help="the model's first 8 states answered for ever")
    ap.add_argument("--sort", default="tottime", help="with --profile: pstats sort key (tottime, cumulative)")
    ap.add_argument("--top", type=int, default=25, help="with --profile: how many functions")
    args = ap.parse_args()
    print(json.dumps(run(args.hz, args.ticks, args.profile, args.frozen_model, args.sort, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
