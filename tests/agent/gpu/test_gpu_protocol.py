"""The backend protocol is the whole seam: every backend answers all of it, and the sampler calls nothing else.

A backend is looked up by pynvml's names at run time, so a renamed or forgotten function would only fail on the
node that reaches that code path. These tests check the real library, the scripted fake and the simulator-coupled
node against `GpuBackend`, then run the sampler (XID poll included) through every scripted scenario behind a
proxy that fails on any name the protocol does not list, and require that together they call all of it.
"""

from __future__ import annotations

import inspect
import threading
import time
from typing import Any

import pynvml
import pytest
from gpu_fakes import Events, ManualClock

from lynxtop.agent.gpu.backend import SCRIPTED_SCENARIOS, RealNvml, open_backend
from lynxtop.agent.gpu.fake import FakeNvml, ScriptedNode, h200_specs, scripted_scenario
from lynxtop.agent.gpu.protocol import GpuBackend, Scenario, backend_members
from lynxtop.agent.gpu.sampler import GpuSampler
from lynxtop.contract.events import EventKind
from lynxtop.sim.gpus import SimScenario

MEMBERS = backend_members()
FUNCTIONS = sorted(n for n in MEMBERS if n.startswith("nvml"))


def _binds(impl: Any, proto: Any) -> None:
    """`impl` accepts every way the protocol's signature may be called (required only, and everything)."""
    params = list(inspect.signature(proto).parameters.values())[1:]  # without self
    positional = [p for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    keywords = {p.name: object() for p in params if p.kind is p.KEYWORD_ONLY}
    sig = inspect.signature(impl)
    sig.bind(*[object() for p in positional if p.default is p.empty])
    sig.bind(*[object() for _ in positional], **keywords)


def test_the_protocol_lists_what_the_gpu_code_calls():
    assert "simulated" in MEMBERS and len(FUNCTIONS) == 36
    assert "nvmlDeviceGetPcieThroughput" not in MEMBERS  # blocks ~21 ms: never called (docs/sampling.md)


@pytest.mark.parametrize("name", FUNCTIONS)
def test_real_pynvml_provides_every_function(name):
    fn = getattr(pynvml, name)
    assert callable(fn)
    _binds(fn, getattr(GpuBackend, name))
    assert getattr(RealNvml(), name) is fn


def test_real_backend_is_a_gpu_backend():
    nv = RealNvml()
    assert nv.simulated is False
    for name in FUNCTIONS:
        getattr(nv, name)  # resolves every name (no driver needed: nothing is called)
    assert isinstance(nv, GpuBackend)


@pytest.mark.parametrize("make", [lambda d: FakeNvml(scripted_scenario("h200x8")),
                                  lambda d: open_backend("sim", str(d), SimScenario)], ids=["fake", "sim"])
def test_fake_and_simulated_backends_provide_every_member(make, tmp_path):
    nv = make(tmp_path)
    assert isinstance(nv, GpuBackend) and nv.simulated is True
    for name in FUNCTIONS:
        _binds(getattr(nv, name), getattr(GpuBackend, name))


def test_the_simulated_node_is_a_scenario(tmp_path):
    scen = SimScenario(tmp_path)
    for name in ("driver_version", "gpus", "state"):
        _binds(getattr(scen, name), getattr(Scenario, name))
    assert scen.state(0, time.monotonic()).mem_used_bytes == 0


class StrictBackend:
    """Forwards protocol names to the real fake, records them, and fails on anything else."""

    def __init__(self, inner: FakeNvml, calls: set[str]):
        self._inner = inner
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        if name not in MEMBERS:
            raise AssertionError(f"the GPU code called {name!r}, which GpuBackend does not list")
        self._calls.add(name)
        return getattr(self._inner, name)


def _run(node: Any, calls: set[str], events: Events, clock: ManualClock, init_error: int | None = None) -> None:
    made: list[FakeNvml] = []

    def factory() -> Any:
        made.append(FakeNvml(node, clock=clock, init_error=init_error))
        return StrictBackend(made[-1], calls)

    s = GpuSampler(factory, clock=clock, on_event=events, slow_interval_s=5.0, lost_probe_s=1.0)
    try:
        s.open()
        for _ in range(4):
            s.sample({1234})
            clock.advance(10.0)
        if made and made[-1].initialized:
            made[-1].inject_xid(0, 48)
            s.sample({1234})  # the tick reads the event set
    finally:
        s.close()


def test_the_sampler_calls_only_the_protocol_and_all_of_it(tmp_path):
    calls: set[str] = set()
    events = Events()
    nodes = [scripted_scenario(n) for n in SCRIPTED_SCENARIOS if n != "nodriver"]
    nodes.append(ScriptedNode(h200_specs(2, nvlink_count=0)))  # no NVLink: the link-state probe
    nodes.append(SimScenario(tmp_path))
    nodes.append(ScriptedNode(h200_specs(1), processes={0: [(1234, 1 << 30)]}, process_sm={0: {1234: 40.0}}))
    for node in nodes:
        _run(node, calls, events, ManualClock())
    _run(scripted_scenario("h200x8"), calls, events, ManualClock(), init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    assert not [t for t in threading.enumerate() if t.name == "lynxtop-xid"]
    assert calls == MEMBERS, f"never called: {sorted(MEMBERS - calls)}"
    assert events and all(isinstance(e[0], EventKind) for e in events)
    assert {EventKind.GPU_XID, EventKind.GPU_LOST, EventKind.NVML_MISSING_FUNCTION,
            EventKind.NVML_UNAVAILABLE} <= set(e[0] for e in events)


def test_the_backend_is_the_union_of_small_surfaces_and_the_fake_is_composed_the_same_way():
    """Issue 27: one protocol per NVML surface, each answered by one part of the fake, none over the size limit."""
    from lynxtop.agent.gpu import fake
    from lynxtop.agent.gpu.protocol import SURFACES

    parts = (fake.FakeLibrary, fake.FakeDeviceFacts, fake.FakeReadings, fake.FakeSlowCounters, fake.FakeGpm,
             fake.FakeEvents)
    assert set(FakeNvml.__mro__) >= set(parts) and set(GpuBackend.__mro__) >= set(SURFACES)
    seen: set[str] = set()
    for surface, part in zip(SURFACES, parts, strict=True):
        wanted = {n for n in vars(surface) if n.startswith("nvml")}
        assert wanted and not wanted & seen  # every function belongs to exactly one surface
        seen |= wanted
        assert {n for n in vars(part) if n.startswith("nvml")} == wanted, part.__name__
        assert len(wanted) <= 12
    assert seen | {"simulated"} == MEMBERS
