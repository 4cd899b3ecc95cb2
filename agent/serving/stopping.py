"""What a stop met, said as events: orphans, survivors, leftover files, and the GPU memory's release.

Pure reporting over a `launcher.StopResult` and the GPU view; the run lifecycle decides when to stop and what
state follows. `event` is the lifecycle's event call (state and run added there).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any, Protocol

from lynxtop.agent.serving import launcher
from lynxtop.agent.serving.launcher import ServerProcess
from lynxtop.contract.events import EventKind, Severity

Event = Callable[..., Any]


class GpuPids(Protocol):
    def compute_pids(self) -> tuple[float, set[int]] | None: ...


def files_text(res: launcher.StopResult) -> str:
    """'; removed ...; not removed ...' for an event message ('' when the run left no files behind)."""
    text = ""
    if res.removed:
        text += f"; removed the run's leftover files: {', '.join(res.removed)}"
    if res.not_removed:
        text += f"; NOT removed: {', '.join(res.not_removed)}"
    return text


def report_stop(event: Event, run_id: int | None, proc: ServerProcess, res: launcher.StopResult,
                files_in_caller_event: bool) -> str:
    """Events for what a stop met: orphans (named, with the signal each needed), survivors, removed files.

    Returns the sentence about leftover files when the caller puts it in its own event, else ''.
    """
    files = files_text(res)
    if res.survivors:
        event(EventKind.SERVING_UNKILLABLE, Severity.CRITICAL,
              f"run {run_id}: process(es) still alive after SIGKILL: {res.survivors} (uninterruptible "
              "sleep, e.g. stuck in the GPU driver); their memory stays held until they end", pids=res.survivors)
    if res.orphans:
        how = "was already gone" if res.leader_was_dead else "exited"
        event(EventKind.SERVING_ORPHANS, Severity.WARNING,
              f"run {run_id}: the API server (pid {proc.pid}) {how} and left {len(res.orphans)} "
              f"process(es) of the run behind; stopped: " + ", ".join(o.describe() for o in res.orphans) + files,
              pids=[o.pid for o in res.orphans], orphans=[dataclasses.asdict(o) for o in res.orphans],
              removed=res.removed, not_removed=res.not_removed)
        return ""
    if files_in_caller_event or not files:
        return files
    event(EventKind.SERVING_CLEANUP, Severity.WARNING if res.not_removed else Severity.INFO,
          f"run {run_id}: leftover files of the run{files}", removed=res.removed, not_removed=res.not_removed)
    return ""


async def wait_gpus_released(event: Event, run_id: int | None, gpus: GpuPids, pids: list[int], since: float,
                             timeout: float) -> list[int]:
    """Wait until a GPU sample taken after `since` shows none of `pids`; the event names any that remain.

    A pid listed only on lost GPUs (the view's process rows marked `stale`: NVML cannot list a lost GPU's
    processes, the sampler keeps its last ones) cannot be seen leaving: not waited for, and told as not confirmed
    (`serving.gpu_release_unknown`, naming the GPUs and pids) rather than released or timed out."""
    deadline = time.monotonic() + timeout
    wanted = set(pids)
    holding: set[int] = set()
    lost: dict[int, set[int]] = {}
    while True:
        view = gpus.compute_pids()
        if view is None:
            event(EventKind.SERVING_GPU_RELEASE_UNKNOWN, Severity.WARNING,
                  "GPU processes cannot be read (NVML unavailable): GPU memory release not confirmed")
            return []
        ts, on_gpu = view
        lost = _on_lost_gpus(gpus, wanted & on_gpu)
        holding = (wanted & on_gpu) - lost.keys()
        if ts >= since and not holding:
            break
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.1)
    if holding:
        event(EventKind.SERVING_GPU_RELEASE_TIMEOUT, Severity.ERROR,
              f"run {run_id}: GPU memory still held after {timeout:g} s by pids {sorted(holding)}",
              pids=sorted(holding))
    if lost:
        on = sorted({g for gs in lost.values() for g in gs if isinstance(g, int)})
        event(EventKind.SERVING_GPU_RELEASE_UNKNOWN, Severity.WARNING,
              f"run {run_id}: GPU {', '.join(map(str, on))} {'is' if len(on) == 1 else 'are'} lost (NVML cannot "
              f"list a lost GPU's processes): pids {sorted(lost)} were on it when it was lost; GPU memory release "
              "not confirmed there", pids=sorted(lost), gpus=on)
    return sorted(holding)


def _on_lost_gpus(gpus: GpuPids, pids: set[int]) -> dict[int, set[int]]:
    """Those of `pids` the view lists only in stale rows (on lost GPUs), with those GPUs. A view without process
    rows (no `process_rows`) marks none stale."""
    rows = getattr(gpus, "process_rows", None)
    if not pids or not isinstance(rows, list):
        return {}
    stale: dict[int, set[int]] = {}
    fresh: set[int] = set()
    for r in rows:
        pid = r.get("pid") if isinstance(r, dict) else None
        if pid not in pids:
            continue
        if r.get("stale"):
            stale.setdefault(pid, set()).add(r.get("gpu"))
        else:
            fresh.add(pid)
    return {pid: gs for pid, gs in stale.items() if pid not in fresh}
