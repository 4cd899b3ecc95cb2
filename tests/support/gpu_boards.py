"""The boards a fake NVML node lists, changed by a test between agent processes, and what the store then says of
each index: its `gpu.identity_changed` events and its board segments (which board was behind it, when).

For the store's GPU identity tests (tests/store/test_s2*_gpu_identity*, _gone_at_start, _identity_gap): the real
GPU sampler over `FakeNvml(BoardsNode(...))` gives the static rows the agent passes to `StoreWriter.upsert_gpus`.
"""

from __future__ import annotations

from pathlib import Path

from lynxtop.agent.gpu.protocol import FakeGpuSpec, FakeGpuState
from lynxtop.contract.events import Event, EventKind
from lynxtop.store.reader import StoreReader


class BoardsNode:
    """The fake NVML's node: one board a UUID, at its list index; `specs` is what a test changes."""

    def __init__(self, uuids: list[str]):
        self.specs = [FakeGpuSpec(index=i, uuid=u) for i, u in enumerate(uuids)]

    def driver_version(self) -> str:
        return "580.159.04"

    def gpus(self) -> list[FakeGpuSpec]:
        return list(self.specs)

    def state(self, index: int, now: float) -> FakeGpuState:
        return FakeGpuState(power_w=100.0 + index)


def identity_events(db: Path) -> list[Event]:
    """The stored `gpu.identity_changed` events, in `StoreReader.events` order (a reader opened and closed for
    each call: no read snapshot held between agent processes)."""
    r = StoreReader(db)
    try:
        return r.events(kinds=[EventKind.GPU_IDENTITY_CHANGED.value])
    finally:
        r.close()


def segments_at(db: Path, gpu: int) -> list[tuple]:
    """(uuid, since_ms, until_ms) of every board recorded behind NVML index `gpu`, oldest first."""
    r = StoreReader(db)
    try:
        return [(s["uuid"], s["since_ms"], s["until_ms"]) for s in r.gpu_identities() if s["gpu"] == gpu]
    finally:
        r.close()
