"""`lynxtop stop` of runs nobody supervises, as one action of the supervisor (the processes' part: heldstop.py).

With nothing supervised, a run the agent holds (adoption.py: alive with its token, not provably the server) or whose
record it cannot read keeps serving on the GPUs; a stop of it used to be "already stopped" (the CLI exits 0). The
stop runs in the supervisor's action slot like any stop: STOPPING, SIGTERM, the grace, SIGKILL, the GPUs' release,
then the held run's row closed and its record removed, and STOPPED. Its events carry the held run's id, not the
lifecycle's last run's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from lynxtop.agent.api.control import ActionError, ExpectRun
from lynxtop.agent.serving import heldstop, procs
from lynxtop.agent.serving.adoption import FALLBACK_GRACE_S
from lynxtop.agent.serving.stopping import files_text, wait_gpus_released
from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.contract.status import ServingState as S  # noqa: N817 - read as a state name

if TYPE_CHECKING:
    from lynxtop.agent.serving.supervisor import Supervisor

log = logging.getLogger(__name__)


class HeldStopAction:
    """The supervisor's stop of unsupervised runs; it reads the supervisor's parts (config, adoption, slot)."""

    def __init__(self, sup: Supervisor):
        self._sup = sup

    def nothing_supervised(self) -> bool:
        return self._sup.runs.state in (S.STOPPED, S.CRASH_LOOP) and self._sup._slot.current is None

    def say_held(self) -> None:
        """At the agent's start: "stopped" alone read as nothing running while a held server serves on."""
        rec, runs = self._sup._adoption.held, self._sup.runs
        if rec is not None and runs.state == S.STOPPED:
            runs.set_state(S.STOPPED, f"agent started; run {rec.run_id} (profile {rec.profile}, pid {rec.pid}) left "
                                      "by the previous agent was not adopted and is not supervised "
                                      "(serving.not_adopted): `lynxtop stop` ends it")

    async def look(self) -> heldstop.HeldRuns:
        """The runs alive that this agent does not supervise (held at adoption, unreadable, lost records)."""
        sup = self._sup
        log_dir = os.path.realpath(sup.cfg.agent.run_log_dir)
        try:
            return await asyncio.to_thread(heldstop.look, log_dir, sup._adoption.held)
        except procs.ProcUnreadable as exc:  # who runs is unknown (the agent out of descriptors), not "nobody"
            raise ActionError("procs_unknown", f"{exc}: whether processes of an earlier run still serve cannot be "
                                               "told; nothing was done, try again", 503) from None

    def stop(self, by: str, expect_run: ExpectRun, held: heldstop.HeldRuns) -> str:
        """SIGTERM, the grace (the held run's profile's, else the fallback), SIGKILL; then the held run's row is
        closed and its record removed. Returns the action's answer."""
        sup = self._sup
        record = sup._adoption.held
        ours = record if record is not None and record.token in held.runs else None
        prof = sup.cfg.profile(ours.profile) if ours is not None else None
        grace = prof.stop_grace_s if prof is not None else FALLBACK_GRACE_S
        pids = held.pids()
        what = (f"run {ours.run_id} (profile {ours.profile}, pid {ours.pid}), held at the agent's start and "
                f"not supervised (pids {pids})" if ours is not None else
                f"processes of an earlier run nobody supervises (pids {pids})")
        run_id = ours.run_id if ours is not None else None
        sup._begin("stop", by, ours.profile if ours is not None else None, expect_run)
        sup._stops.note.stopping(by, None, grace)  # stopped by an operator: no autostart at the next start
        self._event(run_id, EventKind.ACTION_STOP, Severity.INFO, f"stop requested by {by}: {what}", by=by, pids=pids)
        sup._slot.run(self._do_stop(held, grace, f"stopped by {by}", what, run_id))
        return f"stopping {what}"

    def _event(self, run_id: int | None, kind: EventKind, severity: Severity, message: str, **details: Any) -> None:
        details.setdefault("state", self._sup.runs.state)
        self._sup._sink.put(Event(kind, severity, message, details=details, run_id=run_id))

    async def _do_stop(self, held: heldstop.HeldRuns, grace: float, reason: str, what: str,
                       run_id: int | None) -> None:
        sup = self._sup
        sup._retry.cancel()
        sup.runs.set_state(S.STOPPING, f"{reason}: {what}")
        t0 = time.monotonic()
        res = await heldstop.stop(held, grace, sup.runs.timing.stop_kill_wait_s)

        def event(kind: EventKind, severity: Severity, message: str, with_log: bool = False, **d: Any) -> None:
            self._event(run_id, kind, severity, message, **d)

        if res.survivors:
            event(EventKind.SERVING_UNKILLABLE, Severity.CRITICAL, f"{what}: process(es) still alive after "
                  f"SIGKILL: {res.survivors}", pids=res.survivors)
        await wait_gpus_released(event, run_id, sup.gpus, res.pids, time.monotonic(),
                                 sup.cfg.agent.gpu_release_timeout_s)
        files = ""
        try:
            closed = await sup._adoption.close_held()
            files = files_text(closed) if closed is not None else ""
        except procs.ProcUnreadable as exc:  # its record stays: the agent's next start looks again
            log.warning("the held run's leftovers cannot be looked for (%s): its record is kept", exc)
        sup._stops.note.stopped()
        sup.runs.set_state(S.STOPPED, reason)
        killed = f"; SIGKILLed after the {grace:g} s grace: pids {res.killed}" if res.killed else ""
        event(EventKind.SERVING_STOPPED, Severity.INFO, f"serving stopped ({reason}): {what} ended in "
              f"{time.monotonic() - t0:.1f} s{killed}{files}", pids=res.pids, killed=res.killed,
              survivors=res.survivors)
