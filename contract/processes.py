"""`GET /v1/processes`: the processes on the node's GPUs at the agent's last tick, typed.

The agent builds `GpuProcesses` (agent/api/processes.py), the API writes `to_json()`, the client reads
`from_json()`: strictly, by contract/records.py's one rule (a missing pid or a wrong type is a `RecordError`,
a `ValueError`, naming the item and field), ignoring keys a newer agent adds. `in_run` is False for a process
that is not a member of the supervised vLLM run: the stray job that holds the memory vLLM needs. `stale` is True
for a process last seen on a GPU that is now lost (agent/gpu/lost.py): whether it still holds it is unknown.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lynxtop.contract.records import RecordError, read_list, strict_fields


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
    # the GPU is lost (off the bus, NVML cannot list its processes): this is its last row before, not a reading now
    stale: bool = False

    @classmethod
    def from_json(cls, d: Any) -> GpuProcess:
        return cls(**strict_fields(cls, d, "process"))

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
            raise RecordError("processes answer", "", f"must be a JSON object, not {type(d).__name__}")
        age = strict_fields(cls, {"age_s": d["age_s"]} if "age_s" in d else {}, "processes answer").get("age_s")
        return cls(tuple(read_list(GpuProcess, d.get("processes", []), "processes")), age)

    def to_json(self) -> dict[str, Any]:
        return {"age_s": self.age_s, "processes": [p.to_json() for p in self.processes]}
