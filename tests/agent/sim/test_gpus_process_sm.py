"""The simulated node reports a per-process SM share as NVML's process utilisation would (issue 28.4): the GPU's
SM activity split over the processes holding it while the engines work, no sample while they idle."""

from __future__ import annotations

import os
import time

from test_gpus import engine_state

from lynxtop.agent.gpu.backend import open_backend
from lynxtop.sim.gpus import SimScenario
from lynxtop.sim.state import write_state


def test_a_busy_engine_has_the_gpus_sm_share_and_an_idle_one_none(tmp_path):
    me = os.getpid()
    write_state(tmp_path, engine_state(me, busy_frac=1.0, decode_frac=1.0, mean_batch=12,
                                       generation_tokens_per_s=86.0))
    busy = SimScenario(tmp_path).state(2, time.monotonic())
    assert busy.sm_active_pct > 0 and busy.process_sm_pct == {me: busy.sm_active_pct}
    nv = open_backend("sim", str(tmp_path), SimScenario)
    nv.nvmlInit()
    samples = nv.nvmlDeviceGetProcessUtilization(nv.nvmlDeviceGetHandleByIndex(2), 0)
    assert [s.pid for s in samples] == [me] and samples[0].smUtil > 0  # what the sampler reads
    write_state(tmp_path, engine_state(me, busy_frac=0.0))
    idle = SimScenario(tmp_path).state(2, time.monotonic())
    assert idle.processes == [(me, 120 * 2**30)] and idle.process_sm_pct == {}
