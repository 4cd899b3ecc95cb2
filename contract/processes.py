"""`GET /v1/processes`: the processes on the node's GPUs at the agent's last tick, typed.

The agent builds `GpuProcesses` (agent/api/processes.py), the API writes `to_json()`, the client reads
`from_json()`: strictly for the fields it needs (a missing pid or a wrong type is a `ValueError` naming the
item and field), ignoring keys a newer agent adds. `in_run` is False for a process that is not a member of
the supervised vLLM run: the stray job that holds the memory vLLM needs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# field -> (accepted types, required); bool is never accepted as a number
_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "gpu": ((int, type(None)), False), "pid": ((int,), True), "user": ((str, type(None)), False),
    "command": ((str, type(None)), False), "used_mem_bytes": ((int, type(None)), False),
    "sm_util_pct": ((int, float, type(None)), False), "in_run": ((bool,), False),
}


@dataclass(frozen=True)
class GpuProcess:
    """One process on one GPU: its memory there, its SM share (NVML's process utilisation; None: no sample)."""

    pid: int
    gpu: int | None = None
    user: str | None = None  # None: the process is gone or not visible from the agent (another PID namespace)
    command: str | None = None  # secret-looking values masked by the agent
    used_mem_bytes: int | None = None
    sm_util_pct: float | None = None
    in_run: bool = False

    @classmethod
    def from_json(cls, d: Any, where: str = "process") -> GpuProcess:
        if not isinstance(d, Mapping):
            raise ValueError(f"{where}: must be a JSON object, not {type(d).__name__}")
        kw = {}
        for name, (types, required) in _FIELDS.items():
            if name not in d:
                if required:
                    raise ValueError(f"{where}.{name}: missing (a required field)")
                continue
            value = d[name]
            if isinstance(value, bool) and bool not in types or not isinstance(value, types):
                raise ValueError(f"{where}.{name}: expected {' or '.join(t.__name__ for t in types)}, "
                                 f"got {value!r:.60}")
            kw[name] = value
        return cls(**kw)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class GpuProcesses:
    """The answer: every GPU's processes, by GPU, the run's first; `age_s` since the tick that read them."""

    processes: tuple[GpuProcess, ...] = ()
    age_s: float | None = None

    @property
    def strays(self) -> list[GpuProcess]:
        return [p for p in self.processes if not p.in_run]

    @classmethod
    def from_json(cls, d: Any) -> GpuProcesses:
        if not isinstance(d, Mapping):
            raise ValueError(f"processes answer: must be a JSON object, not {type(d).__name__}")
        items = d.get("processes", [])
        if not isinstance(items, list):
            raise ValueError(f"processes: must be a JSON list, not {type(items).__name__}")
        age = d.get("age_s")
        if isinstance(age, bool) or not isinstance(age, (int, float, type(None))):
            raise ValueError(f"age_s: expected a number or null, got {age!r:.60}")
        return cls(tuple(GpuProcess.from_json(p, f"processes[{i}]") for i, p in enumerate(items)), age)

    def to_json(self) -> dict[str, Any]:
        return {"age_s": self.age_s, "processes": [p.to_json() for p in self.processes]}
