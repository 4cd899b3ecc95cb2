"""Helpers for the GPU sampling tests: a manual clock, a constant node, an event recorder."""

from __future__ import annotations

from lynxtop.agent.gpu.fake import FakeNvml, ScriptedNode
from lynxtop.agent.gpu.protocol import FakeGpuSpec, FakeGpuState
from lynxtop.agent.gpu.sampler import GpuSampler


class ManualClock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


class ConstantNode:
    """A node whose GPUs hold one fixed state each (exact expected values), unless a test edits `states`."""

    def __init__(self, specs: list[FakeGpuSpec], states: list[FakeGpuState] | None = None,
                 driver: str = "580.159.04"):
        self.specs = specs
        self.states = states or [FakeGpuState() for _ in specs]
        self._driver = driver

    def driver_version(self) -> str:
        return self._driver

    def gpus(self) -> list[FakeGpuSpec]:
        return list(self.specs)

    def state(self, index: int, now: float) -> FakeGpuState:
        return self.states[index]


class Events(list):
    def __call__(self, kind, severity, message, details=None):
        self.append((kind, severity, message, details))

    def kinds(self) -> list[str]:
        return [e[0] for e in self]


def make(scenario, clock, events=None, **kw) -> tuple[GpuSampler, list[FakeNvml]]:
    """A sampler over a fake backend; the list holds every backend the factory made (one per (re)init)."""
    made: list[FakeNvml] = []

    def factory() -> FakeNvml:
        made.append(FakeNvml(scenario, clock=clock))
        return made[-1]

    kw.setdefault("xid_events", False)
    return GpuSampler(factory, clock=clock, on_event=events, **kw), made


__all__ = ["ConstantNode", "Events", "ManualClock", "ScriptedNode", "make"]
