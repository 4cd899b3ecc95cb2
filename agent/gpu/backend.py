"""The NVML backend seam: one object that answers pynvml's functions under pynvml's names.

The sampler never imports `pynvml` functions directly; it calls them on a backend, so tests, the simulator
and the demo can swap the real library (`RealNvml`) for a scripted one (`fake.FakeNvml`) that raises the same
`pynvml.NVMLError` instances. Constants and structs still come from `pynvml` itself: importing it never
loads libnvidia-ml, so that works on machines without a driver.
"""

from __future__ import annotations

from typing import Any

import pynvml


class RealNvml:
    """A thin view of the `pynvml` module: attribute lookups are resolved once, then cached on the object."""

    simulated = False

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("nvml"):
            raise AttributeError(name)
        fn = getattr(pynvml, name)
        setattr(self, name, fn)  # later lookups skip __getattr__
        return fn


FAKE_SCENARIOS = ("h200x8", "a100x8", "lost", "missing", "xid", "nodriver", "sim")


def open_backend(fake: str = "", sim_state_dir: str | None = None) -> Any:
    """The backend for a config's `fake_nvml` value: "" is the real NVML, anything else a simulated node.

    nvmlInit is not called here: the sampler does it, so a missing driver becomes a state, not an exception.
    """
    if not fake:
        return RealNvml()
    from lynxtop.agent.gpu.fake import FakeNvml, scripted_scenario

    if fake == "sim":
        from lynxtop.agent.sim.gpus import SimScenario  # written by the simulator; imported only when asked

        return FakeNvml(SimScenario(sim_state_dir))
    if fake == "nodriver":
        return FakeNvml(scripted_scenario("h200x8"), init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    return FakeNvml(scripted_scenario(fake))
