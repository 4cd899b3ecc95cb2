"""Free space for a new run: no vLLM is started where it would die of a full disk.

The agent gives vLLM the run's log file as stdout and stderr (launcher.spawn). vLLM's log lines go through
`logging`, which swallows a failed write, but its progress bars (tqdm: the checkpoint shards, the CUDA graphs) and
`print` re-raise OSError(ENOSPC): on a full file system a load dies with exit 1 and an empty log. A restart or a
switch there would stop the working model, fail to start the new one, then crash-loop with no stated cause.

So before anything is stopped the file systems a new run writes to are looked at: the run-log directory, and the
database's directory (serving.json, the runs' TMPDIRs under run-tmp). Below `[agent] min_free_mb` (0: not checked)
an operator's start, restart or switch is refused (409 `disk_full`: `refuse_if_short`, beside the supervisor's
other checks) and an autostart or a retry waits (`DiskGate`, shaped like gpu_holders.GpuGate: state `waiting`, one
event per episode, re-checked every `backoff_initial_s`, a stop ends it). A run that exits before ready with its
log's file system that low says so in its crash event (`crash_cause`, agent/serving/failures.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lynxtop.agent.api.control import ActionError
from lynxtop.agent.serving.watch import ThreadOrInline
from lynxtop.contract.config import AgentConfig, Config, Profile
from lynxtop.contract.events import EventKind, Severity
from lynxtop.contract.files import free_bytes
from lynxtop.contract.status import ServingState as S  # noqa: N817 - read as a state name: S.WAITING

if TYPE_CHECKING:
    from lynxtop.agent.serving.actions import ActionSlot
    from lynxtop.agent.serving.lifecycle import RunLifecycle
    from lynxtop.agent.serving.retry import Retry
    from lynxtop.agent.serving.run import Run

log = logging.getLogger("lynxtop.agent.serving.supervisor")

CODE = "disk_full"  # the control API's error code and the wait events' details.reason (docs/api.md)
MIB = 1 << 20
_ENOSPC = os.strerror(errno.ENOSPC)


@dataclasses.dataclass(frozen=True)
class Short:
    """A file system a new run writes to, below the threshold."""

    path: Path  # the directory as configured
    free: int  # bytes
    threshold: int  # bytes ([agent] min_free_mb)

    def what(self) -> str:
        return (f"the file system of {self.path} is nearly full: {self.free} bytes free ({self.free / MIB:.1f} "
                f"MiB), below [agent] min_free_mb = {self.threshold // MIB} MiB")

    def refusal(self, action: str) -> str:
        """The 409's message: what is wrong, why it matters, how to proceed."""
        return (f"cannot {action}: {self.what()}. vLLM writes its output there and dies on a full disk (its "
                "progress bars re-raise ENOSPC), so a new run would fail; what runs now was left alone. Free space "
                "there (old run logs, for one) or lower min_free_mb; nothing was changed")

    def details(self) -> dict[str, Any]:
        return {"path": str(self.path), "free_bytes": self.free, "min_free_bytes": self.threshold}


def look(agent: AgentConfig) -> Short | None:
    """The first file system a new run writes to that is below `min_free_mb`; None when all have room, the check
    is off, or statvfs cannot tell (then the start goes ahead, as with any check that cannot be made).
    statvfs may block (a hung network file system): call it in a thread."""
    threshold = agent.min_free_mb * MIB
    if threshold <= 0:
        return None
    for where in (agent.run_log_dir, agent.database.parent):
        free = free_bytes(where)
        if free is None:
            log.warning("cannot read the free space of %s: not checked", where)
            continue
        if free < threshold:
            return Short(where, free, threshold)
    return None


async def refuse_if_short(agent: AgentConfig, action: str) -> None:
    """An operator's start, restart or switch, before anything is stopped: 409 disk_full when a file system the
    new run writes to is below the threshold."""
    short = await asyncio.to_thread(look, agent)
    if short is not None:
        raise ActionError(CODE, short.refusal(action), 409, details=short.details())


async def crash_cause(run: Run, agent: AgentConfig) -> str | None:
    """Why a run that exited before ready likely died: its log's file system full (below the threshold now, or
    low while it ran, or the log could not be created for want of space); None otherwise."""
    where = Path(run.log_path).parent
    # inline when no thread can start (a pids limit): the crash is then still handled and the policy applied
    free = await ThreadOrInline(f"run {run.run_id}: the free space of {where}").call(free_bytes, where)
    low = free is not None and free < agent.min_free_mb * MIB
    seen = (run.log_problem is not None and run.log_problem[0] == "space") or _ENOSPC in (run.proc.log_error or "")
    if not (low or seen):
        return None
    said = f"{free} bytes free" if free is not None else "no space left"
    return f"the run log's file system {where} is full: {said}"


class DiskGate:
    """An autostart or a retry (or a start the disk filled under after its checks) waits here, launching nothing,
    while a file system the run writes to is below the threshold: state `waiting` with the reason, one event per
    episode, re-checked every `backoff_initial_s`; a stop ends the wait (`cancel`)."""

    def __init__(self, lc: RunLifecycle, slot: ActionSlot, retry: Retry, config: Callable[[], Config]):
        self._lc = lc
        self._slot = slot
        self._retry = retry
        self._config = config
        self.task: asyncio.Task | None = None  # the start or retry waiting here

    async def _look(self) -> Short | None:
        return await asyncio.to_thread(look, self._config().agent)

    async def wait(self, prof: Profile, autostart: bool) -> None:
        """Return once the file systems the run writes to have room (at once when they have)."""
        short = await self._look()
        if short is None:
            return
        lc = self._lc
        lc.profile, lc.profile_name = prof, prof.name
        self._retry.started()  # no retry pending: this wait is the retry

        def why(s: Short) -> str:
            return f"not starting profile {prof.name}: {s.what()}; starts once there is room"

        lc.set_state(S.WAITING, why(short))
        self._held(prof, short, autostart)
        self.task = asyncio.current_task()
        try:
            with self._slot.waiting():
                while short is not None:
                    await asyncio.sleep(self._config().agent.backoff_initial_s)
                    before, short = short, await self._look()
                    if short is not None and why(short) != lc.reason:  # the same episode: no new event
                        lc.set_state(S.WAITING, why(short), recount=short.path == before.path)
        finally:
            self.task = None
        log.info("profile %s: the file systems it writes to have room now; starting it", prof.name)

    def _held(self, prof: Profile, short: Short, autostart: bool) -> None:
        kind, severity = ((EventKind.AGENT_AUTOSTART_HELD, Severity.ERROR) if autostart
                          else (EventKind.SERVING_BACKOFF, Severity.WARNING))
        self._lc.event(kind, severity, f"{'autostart' if autostart else 'start'} of profile {prof.name} held: "
                       f"{short.what()}; vLLM dies on a full disk (its progress bars re-raise ENOSPC). Waiting until "
                       "there is room (lynxtop stop ends the wait)", reason=CODE, **short.details())

    async def cancel(self) -> None:
        """A stop ends a start or retry that waits here."""
        task = self.task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
