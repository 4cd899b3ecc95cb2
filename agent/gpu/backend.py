"""The NVML backend for a config's `fake_nvml` value: the real library, a scripted fake node, or a simulated one.

The sampler never imports `pynvml` functions directly; it calls them on a `GpuBackend` (protocol.py), so tests,
the simulator and the demo can swap the real library (`RealNvml`) for a scripted one (`fake.FakeNvml`) that raises
the same `pynvml.NVMLError` instances. Importing `pynvml` never loads libnvidia-ml, so this works without a driver.

The GPU layer does not know the simulator: the simulator-coupled node ("sim") is a `ScenarioFactory` that the
composing code (the node, the CLI) passes to `open_backend`, or registers once with `register_scenario`.
"""

from __future__ import annotations

from typing import Any

import pynvml

from lynxtop.agent.gpu.protocol import GpuBackend, ScenarioFactory


class RealNvml:
    """A thin view of the `pynvml` module: attribute lookups are resolved once, then cached on the object."""

    simulated = False

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("nvml"):
            raise AttributeError(name)
        fn = getattr(pynvml, name)
        setattr(self, name, fn)  # later lookups skip __getattr__
        return fn


SCRIPTED_SCENARIOS = ("h200x8", "a100x8", "b200x8", "lost", "missing", "xid", "nodriver")
FAKE_SCENARIOS = (*SCRIPTED_SCENARIOS, "sim")

_registered: dict[str, ScenarioFactory] = {}


def register_scenario(name: str, factory: ScenarioFactory) -> None:
    """Make `open_backend(name, state_dir)` build `FakeNvml(factory(state_dir))` (e.g. "sim" -> SimScenario)."""
    _registered[name] = factory


def open_backend(fake: str = "", sim_state_dir: str | None = None,
                 scenario: ScenarioFactory | None = None) -> GpuBackend:
    """The backend for a config's `fake_nvml` value: "" is the real NVML, anything else a fake node.

    `scenario` builds the node for a name that is not scripted here ("sim"); without it a registered factory is
    used. nvmlInit is not called here: the sampler does it, so a missing driver becomes a state, not an exception.
    """
    if not fake:
        return RealNvml()  # type: ignore[return-value]  # pynvml's functions, looked up by name
    from lynxtop.agent.gpu.fake import FakeNvml, scripted_scenario

    if fake == "nodriver":
        return FakeNvml(scripted_scenario("h200x8"), init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    if fake in SCRIPTED_SCENARIOS:
        return FakeNvml(scripted_scenario(fake))
    factory = scenario or _registered.get(fake)
    if factory is None:
        if fake in FAKE_SCENARIOS:
            raise ValueError(f"fake NVML scenario {fake!r} needs its scenario factory (open_backend(scenario=...) "
                             "or register_scenario)")
        raise ValueError(f"unknown fake NVML scenario {fake!r} (known: {', '.join(FAKE_SCENARIOS)})")
    return FakeNvml(factory(sim_state_dir))
