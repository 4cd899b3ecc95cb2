"""Per-process SM share from NVML's process utilisation (issue 28.4): read per GPU, and degrading to "no share"
(never an exception, never another GPU's loss) when NVML has no samples or does not support the call."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
from gpu_fakes import ConstantNode, ScriptedNode, make

from lynxtop.agent.gpu.fake import FakeNvml, h200_specs
from lynxtop.agent.gpu.fake_driver import err
from lynxtop.agent.gpu.protocol import FakeGpuSpec, FakeGpuState

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


class _WallStamped(FakeNvml):
    """NVML as it is: process samples stamped with the wall clock (CLOCK_REALTIME µs, "CPU Timestamp"), here the
    manual clock plus `WALL["offset_s"]`."""

    def nvmlDeviceGetProcessUtilization(self, handle, timeStamp):
        shares = self._check(handle, "nvmlDeviceGetProcessUtilization").process_sm_pct
        now_us = int((self.clock() + WALL["offset_s"]) * 1e6)
        if not shares or now_us <= timeStamp:
            raise err(pynvml.NVML_ERROR_NOT_FOUND)
        return [SimpleNamespace(pid=p, timeStamp=now_us, smUtil=int(v), memUtil=0, encUtil=0, decUtil=0)
                for p, v in shares.items()]


WALL = {"offset_s": 1.7e9}


def test_sm_share_survives_a_wall_clock_step_back(clock, events):
    """After the wall clock steps back an hour the newest stamp seen is an hour ahead of every new sample: asked
    from there, NVML answered NOT_FOUND and every process's SM share read None for the hour."""
    node = ConstantNode(h200_specs(1), [FakeGpuState(processes=[(4242, 1 << 30)], process_sm_pct={4242: 90})])
    s, _ = make(node, clock, events, wall_clock=lambda: clock() + WALL["offset_s"])
    s._factory = lambda: _WallStamped(node, clock=clock)
    s.open()
    for _ in range(2):
        clock.advance(1.0)
        tick = s.sample(frozenset())
    assert tick.process_rows[0]["sm_util_pct"] == 90
    WALL["offset_s"] -= 3600  # NTP steps the wall clock back an hour
    for _ in range(3):
        clock.advance(1.0)
        assert s.sample(frozenset()).process_rows[0]["sm_util_pct"] == 90
    WALL["offset_s"] += 7200  # and forward two
    for _ in range(3):
        clock.advance(1.0)
        assert s.sample(frozenset()).process_rows[0]["sm_util_pct"] == 90
    s.close()
