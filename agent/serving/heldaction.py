"""`lynxtop stop` of runs nobody supervises, as one action of the supervisor (the processes' part: heldstop.py).

With nothing supervised, a run the agent holds (adoption.py: alive with its token, not provably the server) or whose
record it cannot read keeps serving on the GPUs; a stop of it used to be "already stopped" (the CLI exits 0). The
stop runs in the supervisor's action slot like any stop: STOPPING, SIGTERM, the grace, SIGKILL, the GPUs' release,
then the held run's row closed and its record removed, and STOPPED. Its events carry the held run's id, not the
lifecycle's last run's.

The held server is in the status as data (`serving.held`, `status`), so the CLI and the dashboard say it serves
while the state reads stopped. A status is answered many times a second (the dashboard, Prometheus): it reads the
last check's answer, and a check (the leader's /proc stat and environ, in a thread) starts when that answer is older
than HELD_CHECK_S. A server ended by other means (kill -9 by hand) so leaves the status within HELD_CHECK_S and one
check; one ended by `lynxtop stop` at once (the adoption's `held` is cleared when its run is closed).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from lynxtop.agent.api.control import ActionError, ExpectRun
from lynxtop.agent.serving import heldstop, launcher, procs
from lynxtop.agent.serving.adoption import FALLBACK_GRACE_S
from lynxtop.agent.serving.stopping import files_text, wait_gpus_released
from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.contract.status import HeldRun
from lynxtop.contract.status import ServingState as S  # noqa: N817 - read as a state name

if TYPE_CHECKING:
    from lynxtop.agent.serving.supervisor import Supervisor

log = logging.getLogger(__name__)

# How often, at most, the held server's leader is looked at for the status (two /proc reads in a thread): how long
# the status may still name a server that ended by other means
HELD_CHECK_S = 5.0


def leader_may_live(record: launcher.ServerRecord) -> bool:
    """Whether the held run's leader may still live: False only on proof (no such pid, a zombie, or the pid now
    another process's, its environment read without the run's token). /proc that cannot be read (the agent out of
    descriptors, a hidepid mount) or an environment blank mid-exec proves nothing: the server is still said held."""
    if launcher.leader_is_the_runs(record):
        return True
    try:
        os.kill(record.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    st = procs.stat(record.pid)
    if st is None:
        return True  # it exists but cannot be read
    if st.state in ("Z", "X"):
        return False
    env = procs.environ_raw(record.pid)
    return env is None or procs.environ_blank(env)


def status_of(sup: Supervisor) -> HeldRun | None:
    """`serving.held` for the agent's status (status_view.py adds it to the supervisor's ServingStatus, as it adds
    what the scraper knows: Supervisor is at its size cap, tests/agent/test_class_sizes.py)."""
    return sup._held.status()


class HeldStopAction:
    """The supervisor's stop of unsupervised runs; it reads the supervisor's parts (config, adoption, slot)."""

    def __init__(self, sup: Supervisor):
        self._sup = sup
        self._said: str | None = None  # the reason `say_held` set (replaced once the held server is found gone)
        self._gone: launcher.ServerRecord | None = None  # the held record whose leader a check found gone
        self._checked_at = time.monotonic()  # the adoption looked at the leader just before `say_held`
        self._check: asyncio.Task[None] | None = None

    def nothing_supervised(self) -> bool:
        return self._sup.runs.state in (S.STOPPED, S.CRASH_LOOP) and self._sup._slot.current is None

    def say_held(self) -> None:
        """At the agent's start: "stopped" alone read as nothing running while a held server serves on."""
        rec, runs = self._sup._adoption.held, self._sup.runs
        self._checked_at = time.monotonic()
        if rec is not None and runs.state == S.STOPPED:
            self._said = (f"agent started; run {rec.run_id} (profile {rec.profile}, pid {rec.pid}) left by the "
                          "previous agent was not adopted and is not supervised (serving.not_adopted): `lynxtop "
                          "stop` ends it")
            runs.set_state(S.STOPPED, self._said)

    def status(self) -> HeldRun | None:
        """`serving.held`: the held server while the adoption holds it and no check found it gone; None after a
        held stop closed its run (at once) or once a check found it ended (HELD_CHECK_S and one check late at
        most). Costs no /proc read: a check, when due, runs in a thread and answers the statuses after it."""
        rec = self._sup._adoption.held
        if rec is None or rec is self._gone:
            return None
        self._check_soon(rec)
        return HeldRun(run_id=rec.run_id, profile=rec.profile, pid=rec.pid)

    def _check_soon(self, rec: launcher.ServerRecord) -> None:
        if self._check is not None or time.monotonic() - self._checked_at < HELD_CHECK_S:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # read outside the agent's loop: the last answer stands
            return
        self._checked_at = time.monotonic()
        self._check = loop.create_task(self._look_at(rec))

    async def _look_at(self, rec: launcher.ServerRecord) -> None:
        try:
            alive = await asyncio.to_thread(leader_may_live, rec)
        except Exception:  # noqa: BLE001 - a failed look is no proof it ended: it is said held, looked at again
            log.exception("the held run %s's leader (pid %s) could not be looked at", rec.run_id, rec.pid)
            alive = True
        finally:
            self._check, self._checked_at = None, time.monotonic()
        if alive or self._sup._adoption.held is not rec:
            return
        self._gone = rec
        what = f"run {rec.run_id} (profile {rec.profile}, pid {rec.pid})"
        runs = self._sup.runs
        if runs.state == S.STOPPED and runs.reason == self._said:  # its words would still say it serves
            runs.set_state(S.STOPPED, f"{what}, left by the previous agent and not supervised, has ended (not by "
                                      "lynxtop); its run is closed at the agent's next start")
        self._event(rec.run_id, EventKind.SERVING_EXITED, Severity.WARNING,
                    f"{what}, held at the agent's start and not supervised, ended outside lynxtop (pid {rec.pid} "
                    f"found gone; looked at every {HELD_CHECK_S:g} s while the status is read); its record and run "
                    "row are closed at the agent's next start", pid=rec.pid, held=True)

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
