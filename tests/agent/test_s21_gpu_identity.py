"""GPU identity (s21): a GPU lost while NVML enumerates comes back, a reload that reorders the indices is told,
and a lost GPU's processes stay known (stale) so a stop does not confirm a release nobody saw.

Real sampler objects over the fake NVML (real `pynvml.NVMLError`s); the release wait runs over node.py's real
`NodeGpuView`, fed as the tick feeds it (agent/sampling.py)."""

from __future__ import annotations

import asyncio
import time

import pynvml

from lynxtop.agent.gpu.fake import FakeNvml, h200_specs
from lynxtop.agent.gpu.protocol import FakeGpuSpec, FakeGpuState
from lynxtop.agent.gpu.sampler import GpuSampler
from lynxtop.agent.node import NodeGpuView
from lynxtop.agent.serving.stopping import wait_gpus_released
from lynxtop.contract.events import Event, EventKind, Severity

UUID_A = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
UUID_B = "GPU-bbbbbbbb-0000-4000-8000-000000000000"
UUID_C = "GPU-cccccccc-0000-4000-8000-000000000000"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Node:
    """The fake NVML's scenario: specs and states the test changes between ticks (a reset, a reload)."""

    def __init__(self, specs: list[FakeGpuSpec], states: list[FakeGpuState]):
        self.specs, self.states = specs, states

    def driver_version(self) -> str:
        return "580.159.04"

    def gpus(self) -> list[FakeGpuSpec]:
        return list(self.specs)

    def state(self, index: int, now: float) -> FakeGpuState:
        return self.states[index]


def kinds(events: list) -> list[EventKind]:
    return [e[0] for e in events]


# ---------------------------------------------------------------------------------- 1. lost while enumerating


def test_a_gpu_lost_at_enumeration_is_set_up_when_it_answers_again():
    clock = Clock()
    node = Node(h200_specs(8), [FakeGpuState(power_w=100.0 + i) for i in range(8)])
    node.states[3] = FakeGpuState(lost=True)
    events: list = []
    s = GpuSampler(lambda: FakeNvml(node, clock=clock), clock=clock, xid_events=False, lost_probe_s=1.0,
                   on_event=lambda *a: events.append(a), lost_settle_s=0.0)  # told recovered at once (s22)
    s.open()
    assert [g["idx"] for g in s.static()] == [0, 1, 2, 4, 5, 6, 7]
    assert kinds(events).count(EventKind.GPU_LOST) == 1
    version = s.static_version
    clock.t += 2
    assert s.sample(set()).gpu_rows[3]["lost"] == 1  # still lost: probed, no answer
    assert s.static_version == version and EventKind.GPU_RECOVERED not in kinds(events)

    node.states[3] = FakeGpuState(power_w=333.0, processes=[(777, 1 << 30)])  # reset: it answers again
    clock.t += 2
    tick = s.sample(set())
    row = tick.gpu_rows[3]
    assert row["gpu"] == 3 and row["lost"] == 0 and row["power_w"] == 333
    assert 777 in {r["pid"] for r in tick.process_rows}
    static = {g["idx"]: g for g in s.static()}
    assert sorted(static) == list(range(8))
    assert static[3]["uuid"] == "GPU-5111a7ed-0000-4000-8000-000000000003" and static[3]["mem_total_bytes"]
    assert static[3]["driver_version"] == "580.159.04"
    assert s.static_version == version + 1  # readers re-read static() (gpu_info, upsert_gpus)
    rec = [e for e in events if e[0] is EventKind.GPU_RECOVERED]
    assert len(rec) == 1 and rec[0][3]["gpu"] == 3 and rec[0][3]["uuid"] == static[3]["uuid"]
    Event(*rec[0])  # the store takes it
    # lost again later: a second gpu.lost (the first episode ended)
    node.states[3] = FakeGpuState(lost=True)
    clock.t += 2
    s.sample(set())
    assert kinds(events).count(EventKind.GPU_LOST) == 2


def test_a_gpu_lost_at_enumeration_stays_lost_while_set_up_fails_and_others_sample():
    """The probe asks for the handle again; GPU_IS_LOST again keeps it lost, no event, no static bump."""
    clock = Clock()
    node = Node(h200_specs(2), [FakeGpuState(), FakeGpuState(lost=True)])
    events: list = []
    s = GpuSampler(lambda: FakeNvml(node, clock=clock), clock=clock, xid_events=False, lost_probe_s=1.0,
                   on_event=lambda *a: events.append(a))
    s.open()
    version = s.static_version
    for _ in range(5):
        clock.t += 2
        tick = s.sample(set())
        assert [r["lost"] for r in tick.gpu_rows] == [0, 1] and tick.gpu_rows[0]["power_w"] is not None
    assert s.static_version == version and len(s.static()) == 1
    assert kinds(events) == [EventKind.GPU_LOST]


# ---------------------------------------------------------------------------------- 2. identity across a reload


def _two_gpu_sampler(node: Node, clock: Clock, events: list) -> tuple[GpuSampler, list[FakeNvml]]:
    made: list[FakeNvml] = []

    def factory() -> FakeNvml:
        made.append(FakeNvml(node, clock=clock))
        return made[-1]

    s = GpuSampler(factory, clock=clock, xid_events=False, retry_initial_s=1.0,
                   on_event=lambda *e: events.append(e))
    return s, made


def _reload(s: GpuSampler, made: list[FakeNvml], clock: Clock) -> None:
    """The driver reloads under the agent: readings answer UNINITIALIZED, the sampler opens NVML again."""
    made[-1].fail_all = pynvml.NVML_ERROR_UNINITIALIZED
    n = len(made)
    for _ in range(10):
        clock.t += 2
        s.sample(set())
        if len(made) > n and s.status()["state"] == "ok":
            return
    raise AssertionError("NVML was not opened again")


def test_a_reload_that_reorders_indices_is_one_identity_event():
    clock = Clock()
    node = Node([FakeGpuSpec(index=0, uuid=UUID_A), FakeGpuSpec(index=1, uuid=UUID_B),
                 FakeGpuSpec(index=2, uuid=UUID_C)], [FakeGpuState() for _ in range(3)])
    events: list = []
    s, made = _two_gpu_sampler(node, clock, events)
    s.open()
    clock.t += 1
    s.sample(set())
    assert not [e for e in events if e[0] is EventKind.GPU_IDENTITY_CHANGED]  # the first open: nothing to compare

    node.specs = [FakeGpuSpec(index=0, uuid=UUID_B), FakeGpuSpec(index=1, uuid=UUID_A),
                  FakeGpuSpec(index=2, uuid=UUID_C)]
    _reload(s, made, clock)
    told = [e for e in events if e[0] is EventKind.GPU_IDENTITY_CHANGED]
    assert len(told) == 1
    kind, severity, message, details = told[0]
    assert severity == "warning"
    assert f"GPU 0: {UUID_A} -> {UUID_B}" in message and f"GPU 1: {UUID_B} -> {UUID_A}" in message
    assert "GPU 2" not in message  # unchanged indices are not named
    assert details["changes"] == [{"gpu": 0, "old_uuid": UUID_A, "new_uuid": UUID_B},
                                  {"gpu": 1, "old_uuid": UUID_B, "new_uuid": UUID_A}]
    assert Event(kind, Severity(severity), message, details).kind is EventKind.GPU_IDENTITY_CHANGED
    # the next reload with the same order: no new identity event
    _reload(s, made, clock)
    assert len([e for e in events if e[0] is EventKind.GPU_IDENTITY_CHANGED]) == 1


def test_a_reload_that_keeps_the_order_tells_nothing_and_a_board_gone_is_named():
    clock = Clock()
    node = Node([FakeGpuSpec(index=0, uuid=UUID_A), FakeGpuSpec(index=1, uuid=UUID_B)],
                [FakeGpuState(), FakeGpuState()])
    events: list = []
    s, made = _two_gpu_sampler(node, clock, events)
    s.open()
    _reload(s, made, clock)
    assert EventKind.GPU_IDENTITY_CHANGED not in kinds(events)
    # board A falls off the bus: B is enumerated at index 0, index 1 is gone
    node.specs = [FakeGpuSpec(index=0, uuid=UUID_B)]
    node.states = [FakeGpuState()]
    _reload(s, made, clock)
    told = [e for e in events if e[0] is EventKind.GPU_IDENTITY_CHANGED]
    assert len(told) == 1
    assert told[0][3]["changes"] == [{"gpu": 0, "old_uuid": UUID_A, "new_uuid": UUID_B},
                                     {"gpu": 1, "old_uuid": UUID_B, "new_uuid": None}]


def test_a_gpu_lost_at_a_reopen_is_compared_once_it_is_set_up():
    """A GPU lost while NVML enumerates has no UUID yet: no change is claimed for it then; once it answers its
    UUID is compared with what that index was."""
    clock = Clock()
    node = Node([FakeGpuSpec(index=0, uuid=UUID_A), FakeGpuSpec(index=1, uuid=UUID_B)],
                [FakeGpuState(), FakeGpuState()])
    events: list = []
    made: list[FakeNvml] = []

    def factory() -> FakeNvml:
        made.append(FakeNvml(node, clock=clock))
        return made[-1]

    s = GpuSampler(factory, clock=clock, xid_events=False, retry_initial_s=1.0, lost_probe_s=1.0,
                   on_event=lambda *e: events.append(e))
    s.open()
    node.specs = [FakeGpuSpec(index=0, uuid=UUID_A), FakeGpuSpec(index=1, uuid=UUID_C)]  # a board swapped in
    node.states = [FakeGpuState(), FakeGpuState(lost=True)]
    _reload(s, made, clock)
    assert EventKind.GPU_IDENTITY_CHANGED not in kinds(events)  # index 1's board unknown yet
    node.states[1] = FakeGpuState()
    clock.t += 2
    s.sample(set())
    told = [e for e in events if e[0] is EventKind.GPU_IDENTITY_CHANGED]
    assert len(told) == 1 and told[0][3]["changes"] == [{"gpu": 1, "old_uuid": UUID_B, "new_uuid": UUID_C}]


# ---------------------------------------------------------------------------------- 3. a lost GPU's processes


def test_a_lost_gpus_last_processes_stay_listed_as_stale_until_it_answers():
    clock = Clock()
    node = Node(h200_specs(2), [FakeGpuState(processes=[(11, 1 << 30)]),
                                FakeGpuState(processes=[(4242, 14 << 30)])])
    s = GpuSampler(lambda: FakeNvml(node, clock=clock), clock=clock, xid_events=False, lost_probe_s=5.0)
    s.open()
    clock.t += 1
    rows = s.sample(set()).process_rows
    assert {r["pid"]: r.get("stale", False) for r in rows} == {11: False, 4242: False}
    node.states[1] = FakeGpuState(lost=True, processes=[(4242, 14 << 30)])
    seen = []
    for _ in range(3):  # lost, then probed without an answer: the rows stay, the same objects every tick
        clock.t += 2
        tick = s.sample(set())
        assert tick.gpu_rows[1]["lost"] == 1
        stale = [r for r in tick.process_rows if r["gpu"] == 1]
        assert [(r["pid"], r["used_mem_bytes"], r["stale"]) for r in stale] == [(4242, 14 << 30, True)]
        assert [r.get("stale", False) for r in tick.process_rows if r["gpu"] == 0] == [False]
        seen.append(stale[0])
    assert all(r is seen[0] for r in seen)  # stored once (store/writer.py keeps only a new object)
    node.states[1] = FakeGpuState(processes=[])  # reset: the holder is gone with it
    clock.t += 6
    tick = s.sample(set())
    assert tick.gpu_rows[1]["lost"] == 0 and {r["pid"] for r in tick.process_rows} == {11}


def _view_after(s: GpuSampler, clock: Clock) -> NodeGpuView:
    """A tick of `s` fed to node.py's view as agent/sampling.py feeds it."""
    view = NodeGpuView()
    clock.t += 2
    tick = s.sample(set())
    view.update(time.monotonic(), tick.process_rows, s.status(), s.static())
    return view


def test_a_stop_whose_process_was_on_a_lost_gpu_says_release_not_confirmed_without_waiting():
    clock = Clock()
    node = Node(h200_specs(2), [FakeGpuState(), FakeGpuState(processes=[(4242, 14 << 30)])])
    s = GpuSampler(lambda: FakeNvml(node, clock=clock), clock=clock, xid_events=False)
    s.open()
    clock.t += 1
    s.sample(set())
    node.states[1] = FakeGpuState(lost=True)
    since = time.monotonic()
    view = _view_after(s, clock)
    assert 4242 in view.compute_pids()[1]  # the GPUs-taken look sees the holder too
    events: list = []
    t0 = time.monotonic()
    left = asyncio.run(wait_gpus_released(lambda *a, **kw: events.append((a, kw)), 7, view, [4242], since, 30.0))
    assert time.monotonic() - t0 < 10  # not the 30 s timeout
    assert left == []
    assert [a[0] for a, _ in events] == [EventKind.SERVING_GPU_RELEASE_UNKNOWN]
    (kind, sev, msg), kw = events[0]
    assert sev is Severity.WARNING and "4242" in msg and "GPU 1" in msg and "lost" in msg and "run 7" in msg
    assert kw["pids"] == [4242] and kw["gpus"] == [1]


def test_a_holder_on_a_healthy_gpu_still_times_out_beside_a_lost_one():
    """The stale rows do not hide a holder NVML still reads: that one is waited for and named as before."""
    clock = Clock()
    node = Node(h200_specs(2), [FakeGpuState(processes=[(5151, 1 << 30)]),
                                FakeGpuState(processes=[(4242, 14 << 30)])])
    s = GpuSampler(lambda: FakeNvml(node, clock=clock), clock=clock, xid_events=False)
    s.open()
    clock.t += 1
    s.sample(set())
    node.states[1] = FakeGpuState(lost=True)
    since = time.monotonic()
    view = _view_after(s, clock)
    events: list = []
    left = asyncio.run(wait_gpus_released(lambda *a, **kw: events.append((a, kw)), 7, view, [4242, 5151],
                                          since, 1.0))
    assert left == [5151]
    assert [a[0] for a, _ in events] == [EventKind.SERVING_GPU_RELEASE_TIMEOUT, EventKind.SERVING_GPU_RELEASE_UNKNOWN]
    assert events[0][1]["pids"] == [5151] and events[1][1]["pids"] == [4242]
