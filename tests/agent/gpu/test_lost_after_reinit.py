"""A GPU lost, found answering again when NVML re-initialises (a GPU reset, a driver reload), then lost again is
reported lost again: the once-only `gpu.lost` is forgotten for every GPU a (re)initialisation finds answering, not
only when the lost-probe sees it come back."""

from __future__ import annotations

import pynvml
from gpu_fakes import ConstantNode

from lynxtop.agent.gpu.fake import FakeNvml, h200_specs
from lynxtop.agent.gpu.protocol import FakeGpuState
from lynxtop.agent.gpu.sampler import GpuSampler


def _run(s, clock, n, dt=1.0):
    tick = None
    for _ in range(n):
        clock.advance(dt)
        tick = s.sample(set())
    return tick


def _sampler(clock, events) -> tuple[ConstantNode, list[FakeNvml], GpuSampler]:
    """Two healthy GPUs; every NVML the sampler opens is kept in `made`. The lost-probe is far off: only a
    re-initialisation sees a lost GPU answer again."""
    node = ConstantNode(h200_specs(2), [FakeGpuState(), FakeGpuState()])
    made: list[FakeNvml] = []

    def factory():
        made.append(FakeNvml(node, clock=clock))
        return made[-1]

    s = GpuSampler(factory, clock=clock, on_event=events, xid_events=False, retry_initial_s=1.0, lost_probe_s=600,
                   lost_settle_s=0.0)  # a loss right after a return is a new episode here (test_s22_gpu_noise.py)
    s.open()
    return node, made, s


def test_a_gpu_lost_again_after_a_reinit_is_reported_again(clock, events):
    node, made, s = _sampler(clock, events)
    _run(s, clock, 2)
    node.states[1] = FakeGpuState(lost=True)  # GPU 1 falls off the bus
    assert _run(s, clock, 1).gpu_rows[1]["lost"] == 1
    # the operator resets the GPU / reloads the driver: NVML asks to be re-initialised, GPU 1 is fine again
    node.states[1] = FakeGpuState()
    made[-1].fail_all = pynvml.NVML_ERROR_UNINITIALIZED
    _run(s, clock, 1)
    assert _run(s, clock, 3).gpu_rows[1]["lost"] == 0 and s.status()["state"] == "ok"
    node.states[1] = FakeGpuState(lost=True)  # ...and it falls off the bus again a day later
    assert _run(s, clock, 1).gpu_rows[1]["lost"] == 1
    s.close()
    assert events.kinds().count("gpu.lost") == 2, events.kinds()


def test_a_gpu_still_lost_across_a_reinit_is_reported_once(clock, events):
    """The other side: a GPU lost before the re-initialisation and still lost after it is the same loss."""
    node, made, s = _sampler(clock, events)
    _run(s, clock, 1)
    node.states[1] = FakeGpuState(lost=True)
    assert _run(s, clock, 1).gpu_rows[1]["lost"] == 1
    made[-1].fail_all = pynvml.NVML_ERROR_UNINITIALIZED
    _run(s, clock, 1)
    assert _run(s, clock, 3).gpu_rows[1]["lost"] == 1 and s.status()["state"] == "ok" and len(made) == 2
    s.close()
    assert events.kinds().count("gpu.lost") == 1, events.kinds()
