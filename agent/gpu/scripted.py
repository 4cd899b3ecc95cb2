"""Scripted fake nodes: a serving node under a steady, slowly breathing load, and its named incidents.

Used by tests, the demo (`fake_nvml = "h200x8"`, "lost", "xid", ...) and `lynxtop check --fake`: each is a
`Scenario` (protocol.py) that `fake.FakeNvml` turns into pynvml-shaped answers.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from lynxtop.agent.gpu.protocol import FakeGpuSpec, FakeGpuState

MIB = 1024 * 1024
# a scripted XID stays in the GPU's state this long after it fired, so that the first look after it, at any
# sampling interval (at most 60 s), sees it; the fake delivers it once (fake_driver.py: `prev_xids`)
XID_SHOWN_S = 60.0


def _wave(t: float, period: float, phase: float) -> float:
    """0..1, smooth, so the demo's charts move without looking random."""
    return 0.5 + 0.5 * math.sin(2 * math.pi * (t / period + phase))


class ScriptedNode:
    """A serving node under a steady, slowly breathing load; time is seconds since the first look.

    `events` maps elapsed seconds -> (gpu, change) for scripted incidents: "lost", or an XID number.
    `processes` maps a GPU index to (pid, bytes) pairs, so tests can put real pids on a GPU; `process_sm` maps a
    GPU index to {pid: SM share %} (NVML's process utilisation).
    """

    def __init__(self, specs: list[FakeGpuSpec], driver: str = "580.159.04",
                 lost: dict[int, float] | None = None, xids: list[tuple[float, int, int]] | None = None,
                 processes: dict[int, list[tuple[int, int]]] | None = None, load: float = 1.0,
                 process_sm: dict[int, dict[int, float]] | None = None):
        self._specs = specs
        self._driver = driver
        self.lost = dict(lost or {})  # gpu -> elapsed seconds after which it is lost
        self.xids = list(xids or [])  # (elapsed seconds, gpu, xid): fires once, seen by looks for XID_SHOWN_S
        self.processes = dict(processes or {})
        self.process_sm = dict(process_sm or {})
        self.load = load  # 0 = idle node, 1 = busy serving
        self.start: float | None = None

    def driver_version(self) -> str:
        return self._driver

    def gpus(self) -> list[FakeGpuSpec]:
        return list(self._specs)

    def state(self, index: int, now: float) -> FakeGpuState:
        if self.start is None:
            self.start = now
        t = now - self.start
        spec = self._specs[index]
        busy = self.load * (0.55 + 0.4 * _wave(t, 40.0, index * 0.02))
        decode = _wave(t, 7.0, 0.1)  # 1 = decode-heavy (memory bound), 0 = prefill-heavy (tensor bound)
        hopper = spec.cc[0] >= 9
        link_rate = self.load * (12e9 + 8e9 * _wave(t, 5.0, 0.3)) / max(spec.nvlink_count, 1)
        sm = 100 * busy
        st = FakeGpuState(
            util_gpu_pct=min(100.0, 100 * busy + 35) if self.load else 0.0,
            util_mem_pct=60 * busy * decode,
            sm_active_pct=sm,
            sm_occupancy_pct=sm * (0.2 + 0.5 * decode),
            tensor_active_pct=sm * (0.9 - 0.6 * decode),
            dram_bw_pct=sm * (0.2 + 0.7 * decode),
            fp16_active_pct=sm * 0.05,
            fp32_active_pct=sm * 0.08,
            pcie_tx_bytes_per_s=self.load * 2e8,
            pcie_rx_bytes_per_s=self.load * 6e8,
            nvlink_tx_bytes_per_s=[link_rate] * spec.nvlink_count,
            nvlink_rx_bytes_per_s=[link_rate * 0.98] * spec.nvlink_count,
            mem_used_bytes=int(spec.mem_total_bytes * (0.9 if self.load else 0.0)),
            power_w=(90 + (spec.power_limit_w - 140) * busy) if self.load else 85.0,
            temp_c=32 + 40 * busy,
            sm_clock_mhz=1980 if hopper else 1410,
            mem_clock_mhz=3201 if hopper else 1593,
            throttle_reasons=0x4 if busy > 0.9 else (0x0 if self.load else 0x1),
            processes=list(self.processes.get(index, [])),
            process_sm_pct=dict(self.process_sm.get(index, {})),
        )
        lost_after = self.lost.get(index)
        if lost_after is not None and t >= lost_after:
            st = replace(st, lost=True)
        st.xid_events = [x for (at, gpu, x) in self.xids if gpu == index and at <= t < at + XID_SHOWN_S]
        return st


def h200_specs(n: int = 8, **overrides: Any) -> list[FakeGpuSpec]:
    return [FakeGpuSpec(index=i, name="NVIDIA H200", **overrides) for i in range(n)]


def a100_specs(n: int = 8, **overrides: Any) -> list[FakeGpuSpec]:
    base = dict(name="NVIDIA A100-SXM4-80GB", cc=(8, 0), mem_total_bytes=81920 * MIB, power_limit_w=400.0,
                nvlink_count=12, gpm=False, nvlink_field_counters=True)
    base.update(overrides)
    return [FakeGpuSpec(index=i, **base) for i in range(n)]


def b200_specs(n: int = 8, **overrides: Any) -> list[FakeGpuSpec]:
    """HGX B200: Blackwell (SM100), 183,359 MiB as NVML reports it (~179 GiB of the 192 GB HBM3e), NVLink 5."""
    base = dict(name="NVIDIA B200", cc=(10, 0), mem_total_bytes=183359 * MIB, power_limit_w=1000.0,
                nvlink_count=18, gpm=True, nvlink_field_counters=True)
    base.update(overrides)
    return [FakeGpuSpec(index=i, **base) for i in range(n)]


# an old driver: no GPM, no v2 memory info, no clock-event names (only the older throttle-reason call)
MISSING_FUNCTIONS = frozenset({"nvmlGpmQueryDeviceSupport", "nvmlGpmSampleGet", "nvmlDeviceGetMemoryInfo_v2",
                               "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetRemappedRows"})


def scripted_scenario(name: str, **kwargs: Any) -> ScriptedNode:
    """The named scripted node (see `FAKE_SCENARIOS` in backend.py); kwargs go to `ScriptedNode`."""
    if name == "h200x8":
        return ScriptedNode(h200_specs(), **kwargs)
    if name == "a100x8":
        return ScriptedNode(a100_specs(), driver="535.183.01", **kwargs)
    if name == "b200x8":
        return ScriptedNode(b200_specs(), driver="570.133.20", **kwargs)
    if name == "lost":
        kwargs.setdefault("lost", {3: 30.0})
        kwargs.setdefault("xids", [(29.0, 3, 79)])  # "fallen off the bus" comes first, as on real nodes
        return ScriptedNode(h200_specs(), **kwargs)
    if name == "missing":
        return ScriptedNode(h200_specs(missing_functions=MISSING_FUNCTIONS,
                                       unsupported=frozenset({"nvmlDeviceGetTotalEnergyConsumption"})),
                            driver="470.256.02", **kwargs)
    if name == "xid":
        kwargs.setdefault("xids", [(5.0, 1, 31), (10.0, 2, 48), (15.0, 0, 94)])
        return ScriptedNode(h200_specs(), **kwargs)
    raise ValueError(f"unknown fake NVML scenario {name!r} (known: h200x8, a100x8, b200x8, lost, missing, xid, sim)")
