"""`GET /v1/processes`: who holds each GPU, for the dashboard's Processes view (nvitop's main view).

The GPU sampler reads the compute processes per GPU (their memory, their SM share from NVML's process
utilisation) and tags each as a member of the supervised run or not; here each gets its user and command
line from /proc. A process that is not the run's is what an operator looks for first when vLLM fails to
start for want of memory. Command lines are foreign: a value after a flag or a NAME= whose name says secret
(`--api-key X`, `HF_TOKEN=...`) is masked as everywhere else (contract/redact.py), and a command is cut at
COMMAND_CAP characters.
"""

from __future__ import annotations

import pwd
from collections.abc import Callable, Iterable
from typing import Any

from lynxtop.agent.serving import procs
from lynxtop.contract.processes import GpuProcess, GpuProcesses
from lynxtop.contract.redact import redact_argv

COMMAND_CAP = 1000  # characters of a command line served; enough for a vLLM argv, bounded for a hostile one


def _user(pid: int) -> str | None:
    uid = procs.uid(pid)
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _command(pid: int, secret_names: Iterable[str]) -> str | None:
    argv = procs.cmdline(pid)
    if argv is None:
        return None  # gone, or in a PID namespace the agent does not see
    text = " ".join(redact_argv(argv, secret_names)).strip() if argv else procs.title(pid)
    return text if len(text) <= COMMAND_CAP else text[:COMMAND_CAP] + " [...]"


def describe(rows: Iterable[dict[str, Any]], age_s: float | None, secret_names: Iterable[str] = (),
             run_members: Callable[[], Iterable[int]] | None = None) -> GpuProcesses:
    """Each GPU process of the last tick with its user and command: by GPU, the run's first, then by memory.

    A process the tick did not count as the run's is checked against `run_members()` (a fresh look at the run's
    processes) before it is called a stray: the tick's membership can predate workers the run started since
    (the first seconds after a start, when an operator looks), and a false alarm there sends them hunting."""
    names = tuple(secret_names)
    rows = list(rows)
    members: set[int] = set()
    if run_members is not None and any(not r.get("in_vllm_tree") for r in rows):
        members = set(run_members())
    out = []
    for r in rows:
        pid, gpu, sm = r.get("pid"), r.get("gpu"), r.get("sm_util_pct")
        if not isinstance(pid, int):
            continue
        out.append(GpuProcess(pid=pid, gpu=gpu if isinstance(gpu, int) else None, user=_user(pid),
                              command=_command(pid, names), used_mem_bytes=r.get("used_mem_bytes"),
                              sm_util_pct=sm, in_run=bool(r.get("in_vllm_tree")) or pid in members,
                              stale=bool(r.get("stale"))))
    out.sort(key=lambda p: (-1 if p.gpu is None else p.gpu, not p.in_run, -(p.used_mem_bytes or 0), p.pid))
    return GpuProcesses(tuple(out), age_s)
