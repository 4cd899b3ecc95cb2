"""A lost GPU and shifted NVML indices (s23): the board that now answers at a lost GPU's index is not that GPU
coming back, and a lost board that answers at another index is.

NVML indices follow the PCI order of the boards present: when board B (index 1) falls off the bus, the next
driver load enumerates C at index 1. Before, the lost episode was keyed by index only, so C answering at index 1
was told `gpu.recovered` ("GPU 1 <C> answers NVML again: lost for ... s") although B never came back.

Real GpuSampler over the fake NVML (real `pynvml.NVMLError`s); the reload is the sampler's own re-initialisation.
"""

from __future__ import annotations

import pynvml

from lynxtop.agent.gpu.fake import FakeNvml
from lynxtop.agent.gpu.protocol import FakeGpuSpec, FakeGpuState
from lynxtop.agent.gpu.sampler import GpuSampler
from lynxtop.contract.events import EventKind

UUID_A = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
UUID_B = "GPU-bbbbbbbb-0000-4000-8000-000000000000"
UUID_C = "GPU-cccccccc-0000-4000-8000-000000000000"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Node:
    def __init__(self, uuids: list[str]):
        self.set(uuids)

    def set(self, uuids: list[str], lost: frozenset[str] = frozenset()) -> None:
        self.specs = [FakeGpuSpec(index=i, uuid=u) for i, u in enumerate(uuids)]
        self.states = [FakeGpuState(lost=u in lost, processes=[(100 + i, 1 << 30)]) for i, u in enumerate(uuids)]

    def driver_version(self) -> str:
        return "580.159.04"

    def gpus(self) -> list[FakeGpuSpec]:
        return list(self.specs)

    def state(self, index: int, now: float) -> FakeGpuState:
        return self.states[index]


def _sampler(node: Node, clock: Clock, events: list) -> tuple[GpuSampler, list[FakeNvml]]:
    made: list[FakeNvml] = []

    def factory() -> FakeNvml:
        made.append(FakeNvml(node, clock=clock))
        return made[-1]

    s = GpuSampler(factory, clock=clock, xid_events=False, retry_initial_s=1.0, lost_probe_s=1.0, lost_settle_s=5.0,
                   on_event=lambda *e: events.append(e))
    return s, made


def _reload(s: GpuSampler, made: list[FakeNvml], clock: Clock) -> None:
    made[-1].fail_all = pynvml.NVML_ERROR_UNINITIALIZED
    n = len(made)
    for _ in range(10):
        clock.t += 2
        s.sample(set())
        if len(made) > n and s.status()["state"] == "ok":
            return
    raise AssertionError("NVML was not opened again")


def _run(s: GpuSampler, clock: Clock, seconds: float) -> None:
    end = clock.t + seconds
    while clock.t < end:
        clock.t += 1
        s.sample(set())


def _of(events: list, kind: EventKind) -> list:
    return [e for e in events if e[0] is kind]


def test_another_board_shifted_to_a_lost_gpus_index_is_not_that_gpu_recovered():
    clock = Clock()
    node = Node([UUID_A, UUID_B, UUID_C])
    events: list = []
    s, made = _sampler(node, clock, events)
    s.open()
    _run(s, clock, 2)
    node.states[1] = FakeGpuState(lost=True, processes=[(101, 1 << 30)])
    _run(s, clock, 2)
    assert [e[3]["gpu"] for e in _of(events, EventKind.GPU_LOST)] == [1]

    node.set([UUID_A, UUID_C])  # B fell off the bus: C is index 1 at the next driver load
    _reload(s, made, clock)
    _run(s, clock, 20)  # well past the settle time
    assert _of(events, EventKind.GPU_RECOVERED) == [], _of(events, EventKind.GPU_RECOVERED)
    told = _of(events, EventKind.GPU_IDENTITY_CHANGED)
    assert len(told) == 1 and told[0][3]["changes"] == [
        {"gpu": 1, "old_uuid": UUID_B, "new_uuid": UUID_C}, {"gpu": 2, "old_uuid": UUID_C, "new_uuid": None}]
    assert "lost" in told[0][2] and UUID_B in told[0][2]  # says the lost board is not what answers there now
    tick = s.sample(set())
    assert [r["lost"] for r in tick.gpu_rows] == [0, 0]
    assert {r["pid"] for r in tick.process_rows} == {100, 101}  # C's own holder (pid 101 at index 1), not stale
    assert not any(r.get("stale") for r in tick.process_rows)

    # B lost again later (a new board lost at index 1 is a new episode, told)
    node.states[1] = FakeGpuState(lost=True)
    _run(s, clock, 2)
    assert [e[3]["uuid"] for e in _of(events, EventKind.GPU_LOST)] == [UUID_B, UUID_C]


def test_a_lost_board_that_answers_at_another_index_is_told_recovered_under_its_new_index():
    """C (index 2) is lost; at the driver load that follows, A has gone and C answers at index 1: C came back."""
    clock = Clock()
    node = Node([UUID_A, UUID_B, UUID_C])
    events: list = []
    s, made = _sampler(node, clock, events)
    s.open()
    _run(s, clock, 2)
    node.states[2] = FakeGpuState(lost=True)
    _run(s, clock, 2)
    node.set([UUID_B, UUID_C])
    _reload(s, made, clock)
    _run(s, clock, 20)
    rec = _of(events, EventKind.GPU_RECOVERED)
    assert len(rec) == 1, events
    assert rec[0][3]["uuid"] == UUID_C and rec[0][3]["gpu"] == 1
    assert "index 2" in rec[0][2]  # the index it was lost at is named


def test_the_same_board_back_at_its_index_is_still_recovered():
    clock = Clock()
    node = Node([UUID_A, UUID_B])
    events: list = []
    s, made = _sampler(node, clock, events)
    s.open()
    _run(s, clock, 2)
    node.states[1] = FakeGpuState(lost=True)
    _run(s, clock, 2)
    node.set([UUID_A, UUID_B])
    _reload(s, made, clock)
    _run(s, clock, 20)
    rec = _of(events, EventKind.GPU_RECOVERED)
    assert len(rec) == 1 and rec[0][3]["uuid"] == UUID_B and rec[0][3]["gpu"] == 1
    assert _of(events, EventKind.GPU_IDENTITY_CHANGED) == []
