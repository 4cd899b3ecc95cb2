"""The one writer of the agent's TOML for tests and benchmarks.

Tests import it as `support.agent_config`; benchmarks too, after `import _support` (benchmarks/_support.py adds
the repository's tests/ to sys.path), so a new or renamed config key is changed here only. Values are rendered
as TOML (strings and paths quoted as JSON strings, which are valid TOML basic strings); `extra` is raw TOML
appended to [agent] for the odd case (a value TOML must see as written, like `nan`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from support.ports import free_port

SIM = Path(sys.executable).parent / "lynxtop-sim-vllm"  # the project's simulated vLLM
MODEL = "deepseek-ai/DeepSeek-V4.1"


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (str, Path)):
        return json.dumps(str(v))
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {type(v).__name__}: {v!r}")


def _keys(values: Mapping[str, Any]) -> str:
    return "".join(f"{k} = {toml_value(v)}\n" for k, v in values.items() if v is not None)


def profile(name: str, executable: str | Path, *, model: str = MODEL, port: int | None = 0, **keys: Any) -> str:
    """One [[profile]]; `port` 0 (the default) takes a free one, None leaves it out (the agent's default);
    the other keys are written in the order given (a None value is left out)."""
    return "\n[[profile]]\n" + _keys({"name": name, "executable": executable, "model": model,
                                      "port": free_port() if port == 0 else port, **keys})


def sim_profile(name: str, *, tp: int = 8, startup_s: float = 0.3, sim_args: Sequence[str] = (),
                readiness_timeout_s: float = 30, stop_grace_s: float = 3, shutdown_timeout_s: float = 1,
                **keys: Any) -> str:
    """A [[profile]] running the simulated vLLM (`sim_args`: more of its flags, like ("--sim-fail", "oom"))."""
    return profile(name, SIM, tensor_parallel_size=tp,
                   extra_args=["--sim-startup-seconds", str(startup_s), *sim_args],
                   readiness_timeout_s=readiness_timeout_s, stop_grace_s=stop_grace_s,
                   shutdown_timeout_s=shutdown_timeout_s, **keys)


def agent_toml(database: str | Path, socket: str | Path, *, profiles: str | Iterable[str] = (),
               sla: Mapping[str, Any] | None = None, extra: str = "", **agent: Any) -> str:
    """A whole config: [agent] (database, socket, then `agent`'s keys in order, then `extra`), [sla], profiles."""
    text = "\n[agent]\n" + _keys({"database": database, "socket": socket, **agent})
    if extra:
        text += extra.rstrip("\n") + "\n"
    if sla:
        text += "\n[sla]\n" + _keys(sla)
    return text + (profiles if isinstance(profiles, str) else "".join(profiles))


def write_agent_config(path: Path, database: str | Path, socket: str | Path, **kw: Any) -> Path:
    """`agent_toml(...)` written to `path`; returns `path`."""
    path.write_text(agent_toml(database, socket, **kw))
    return path
