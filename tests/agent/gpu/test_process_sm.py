"""Per-process SM share from NVML's process utilisation (issue 28.4): read per GPU, and degrading to "no share"
(never an exception, never another GPU's loss) when NVML has no samples or does not support the call."""

from __future__ import annotations

from gpu_fakes import ScriptedNode, make

from lynxtop.agent.gpu.fake import h200_specs
from lynxtop.agent.gpu.protocol import FakeGpuSpec

FN = "nvmlDeviceGetProcessUtilization"


def _sm(tick) -> dict[tuple[int, int], int | None]:
    return {(p["gpu"], p["pid"]): p["sm_util_pct"] for p in tick.process_rows}


def test_each_process_gets_its_sm_share_and_one_without_samples_none(clock, events):
    node = ScriptedNode(h200_specs(2), processes={0: [(4242, 80 << 30), (777, 1 << 30)], 1: [(4243, 80 << 30)]},
                        process_sm={0: {4242: 71.0}, 1: {4243: 64.0}})
    s, _ = make(node, clock, events)
    s.open()
    for _ in range(3):  # steady from tick to tick: the window keeps the newest sample in view
        clock.advance(1.0)
        assert _sm(s.sample({4242, 4243})) == {(0, 4242): 71, (0, 777): None, (1, 4243): 64}


def test_no_samples_is_normal_and_asked_again(clock, events):
    node = ScriptedNode(h200_specs(1), processes={0: [(4242, 80 << 30)]})  # NVML answers NOT_FOUND
    s, made = make(node, clock, events)
    s.open()
    for _ in range(3):
        clock.advance(1.0)
        tick = s.sample({4242})
        assert _sm(tick) == {(0, 4242): None} and tick.process_rows[0]["used_mem_bytes"] == 80 << 30
    assert made[0].calls[FN] == 3  # not switched off: samples come once something computes
    node.process_sm = {0: {4242: 55.0}}
    clock.advance(1.0)
    assert _sm(s.sample({4242})) == {(0, 4242): 55}
    assert not events


def test_not_supported_on_one_gpu_leaves_the_others(clock, events):
    specs = [FakeGpuSpec(index=0, unsupported=frozenset({FN})), FakeGpuSpec(index=1)]
    node = ScriptedNode(specs, processes={0: [(10, 1 << 30)], 1: [(11, 2 << 30)]}, process_sm={0: {10: 9.0},
                                                                                                 1: {11: 33.0}})
    s, made = make(node, clock, events)
    s.open()
    for _ in range(3):
        clock.advance(1.0)
        tick = s.sample(set())
        assert _sm(tick) == {(0, 10): None, (1, 11): 33}
        assert {r["gpu"] for r in tick.gpu_rows} == {0, 1}
    assert made[0].calls[FN] == 1 + 3  # GPU 0 once, GPU 1 every tick
