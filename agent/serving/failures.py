"""What follows a run's failure: a crash (any exit nobody asked for) or a readiness timeout.

The rest of the run's tree is stopped and its GPU memory waited for, the run's end recorded, then the restart
policy (policy.py, through retry.py) decides: a retry after a backoff, or a crash loop that waits for an operator.
A load that times out twice in a row gives up too, however far apart the timeouts (policy.READINESS_TIMEOUTS_IN_A_ROW):
the crash-loop window never holds two timeouts of a load as slow as the window is long.
The serving state changes only through the run lifecycle's `set_state`, which stays its one writer.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from lynxtop.agent.serving import diskspace, policy
from lynxtop.agent.serving.actions import ActionSlot
from lynxtop.agent.serving.launcher import ExitInfo
from lynxtop.agent.serving.retry import PendingRetry, Retry
from lynxtop.agent.serving.run import Run
from lynxtop.agent.serving.startup import tail_lines
from lynxtop.agent.serving.watch import ThreadOrInline
from lynxtop.contract.config import Config, Profile
from lynxtop.contract.events import EventKind, Severity
from lynxtop.contract.redact import redact_argv
from lynxtop.contract.status import ServingState as S  # noqa: N817 - read as a state name: S.READY

if TYPE_CHECKING:
    from lynxtop.agent.serving.lifecycle import RunLifecycle

log = logging.getLogger("lynxtop.agent.serving.supervisor")

# who the retry's action is by ("agent (...)"): the refusal of a start while it loads names its cause
RETRY_AFTER_CRASH = "retry after a crash"
RETRY_AFTER_TIMEOUT = "retry after a readiness timeout"

_LIMITS = {
    errno.EAGAIN: "the system refused a new process or thread: a process/thread limit is reached (the agent "
                  "unit's TasksMax, its pids cgroup, or RLIMIT_NPROC; vLLM's threads count against it too)",
    errno.ENOMEM: "the system refused a new process for want of memory: a memory limit (the unit's MemoryMax or "
                  "its memory cgroup), the node's memory, or a process/thread limit (TasksMax, pids cgroup)",
    errno.EMFILE: "the agent has no file descriptor left (its LimitNOFILE)",
    errno.ENFILE: "the system has no file descriptor left (fs.file-max)",
}


# argparse's own last line when it refuses a command line (`PROG: error: MESSAGE`, then exit 2), for the three
# refusals of a flag: the flag is named in each. vLLM's FlexibleArgumentParser is an argparse parser.
_ARGPARSE = re.compile(r"^\S+(?: serve)?: error: (?P<msg>unrecognized arguments: (?P<unrec>[^\s=]+)\S*.*"
                       r"|ambiguous option: (?P<amb>--?[^\s=]+)\S* could match .*"
                       r"|argument (?P<arg>--?[^\s:/]+)(?:/\S+)?: invalid choice: .*)$")
REFUSAL_TAIL_LINES = 20  # argparse's error is the last line vLLM writes before it exits


def argparse_refusal(lines: list[str]) -> tuple[str, str] | None:
    """(the flag, argparse's message) when the last line of argparse's form among `lines` (a run's log tail)
    refuses a flag: unrecognized, ambiguous or given a value it does not take. None otherwise: an engine's error
    that only mentions a flag is a crash like any other."""
    for line in reversed(lines):
        m = _ARGPARSE.match(line.strip())
        if m is not None:
            msg = m.group("msg")
            return m.group("unrec") or m.group("amb") or m.group("arg"), msg if len(msg) <= 300 else msg[:300] + "..."
    return None


def os_refusal(exc: BaseException) -> str | None:
    """What limit refused a process, a thread or a descriptor (a passing refusal: a retry may succeed), or None
    when `exc` is no such refusal (a missing executable, a refused log path: retrying changes nothing)."""
    if isinstance(exc, OSError):
        return _LIMITS.get(exc.errno or 0)
    if isinstance(exc, RuntimeError) and "thread" in str(exc):  # threading: "can't start new thread"
        return _LIMITS[errno.EAGAIN]
    return None


class Failures:
    def __init__(self, lc: RunLifecycle, slot: ActionSlot, retry: Retry, config: Callable[[], Config]):
        self._lc = lc
        self._slot = slot
        self._retry = retry
        self._config = config

    async def not_ready_in_time(self, run: Run, prof: Profile) -> None:
        lc = self._lc
        why = f"not ready within {prof.readiness_timeout_s:g} s"
        lc.event(EventKind.SERVING_READINESS_TIMEOUT, Severity.ERROR,
                 f"run {run.run_id}: {why} (phase: {run.tracker.phase}); stopping it", with_log=True)
        lc.set_state(S.STOPPING, why)
        await lc.stop_and_release(run, prof.stop_grace_s)
        await lc.finish_run(run, why)
        await self._count(prof, why, readiness_timeout=True)

    async def crashed(self, run: Run, prof: Profile, ex: ExitInfo, readiness: str) -> None:
        """An exit nobody asked for: clean up the rest of the tree, then back off or give up."""
        if readiness == "timeout":
            return  # already counted
        lc = self._lc
        when = "before becoming ready" if readiness != "ready" else "while serving"
        reason = f"vLLM {ex.describe()} {when} (not requested by anyone)"
        refused = None
        if readiness != "ready":  # a load dies of ENOSPC on its progress bars, its log empty: name the full disk
            full = await diskspace.crash_cause(run, self._config().agent)
            reason = f"{full}; {reason}" if full else reason
            refused = await self._refused_flag(lc)
        run.crash_reason = f"crashed: {reason}"
        lc.resolve_outcome(False)
        lc.event(EventKind.SERVING_CRASH, Severity.ERROR, f"run {run.run_id}: {reason}", with_log=True,
                 exit_code=ex.exit_code, exit_signal=ex.exit_signal)
        lc.set_state(S.STOPPING, f"cleaning up after crash: {reason}")
        await lc.stop_and_release(run, min(prof.stop_grace_s, 5.0))
        await lc.finish_run(run, f"crashed: {reason}")
        if refused is not None:
            self._refused(prof, *refused)
            return
        await self._count(prof, reason)

    @staticmethod
    async def _refused_flag(lc: RunLifecycle) -> tuple[str, str] | None:
        """The flag vLLM's argparse refused at start, read from the run's log tail (None: no such refusal)."""
        proc = lc.proc
        if proc is None:
            return None
        # inline when no thread can start (a pids limit), as the crash's other reads: the crash is still handled
        read = ThreadOrInline(f"run {proc.record.run_id}: the tail of its log")
        lines = await read.call(tail_lines, proc.record.log_path, REFUSAL_TAIL_LINES)
        return argparse_refusal(lines)

    def _refused(self, prof: Profile, flag: str, message: str) -> None:
        """vLLM refused its command line: every retry would exit the same way, so none is made (no backoff into
        a crash loop). The agent gives up at once as after a crash loop (held across agent restarts, until an
        operator acts), naming the flag and the profile."""
        lc = self._lc
        lc.resolve_outcome(False)
        self._retry.fail(prof.name)  # counted in the window as any failure (the status' failures_in_window)
        self._retry.started()  # but no retry pending
        msg = (f"gave up at once: vLLM refused its command line ({message}): a configuration error, not a crash; "
               f"no retry would start. Fix {flag} in profile {prof.name} (its extra_args, or the setting that "
               "passes it), then lynxtop start")
        lc.set_state(S.CRASH_LOOP, msg)
        self._retry.save_crash_loop(prof.name, msg)
        lc.event(EventKind.SERVING_CRASH_LOOP, Severity.CRITICAL, f"profile {prof.name}: {msg}", with_log=True,
                 failures=1, reason="config_error", flag=flag)

    async def after_exit(self, run: Run, prof: Profile, ex: ExitInfo, readiness: str) -> None:
        """`crashed`, never raising: an error while handling the end is logged and told, the run's rest stopped
        and its end recorded as far as they go, and the restart policy still decides (a dead task once left
        serving "stopping" with the policy gone)."""
        try:
            await self.crashed(run, prof, ex, readiness)
            return
        except Exception as exc:  # noqa: BLE001 - the end of a run is handled whatever it met
            what = f"{type(exc).__name__}: {exc}"
        lc = self._lc
        log.error("run %s (profile %s): handling its exit failed: %s", run.run_id, prof.name, what, exc_info=True)
        lc.resolve_outcome(False)
        reason = f"vLLM {ex.describe()} (not requested by anyone; handling its end met {what})"
        lc.event(EventKind.SERVING_WATCH_ERROR, Severity.ERROR, f"run {run.run_id} (profile {prof.name}): {reason}; "
                 "cleaning up and applying the restart policy anyway", error=what, where="run exit")
        for step in (lambda: lc.stop_and_release(run, min(prof.stop_grace_s, 5.0)),
                     lambda: lc.finish_run(run, f"crashed: {reason}")):
            try:
                await step()
            except Exception:  # noqa: BLE001 - each step as far as it goes
                log.exception("run %s: cleaning up after its exit failed", run.run_id)
        if lc.state in (S.BACKOFF, S.CRASH_LOOP) or readiness == "timeout":
            return  # the policy had decided already
        try:
            await self._count(prof, reason)
        except Exception as exc:  # noqa: BLE001 - at least never "stopping" for ever
            log.exception("run %s: applying the restart policy failed", run.run_id)
            lc.set_state(S.STOPPED, f"{reason}; the restart policy could not be applied ({exc}): lynxtop start")

    async def start_refused(self, prof: Profile, exc: Exception, own: bool) -> bool:
        """A start the OS refused (spawn's OSError, a thread that could not start): nothing was started. An
        operator's start is "stopped" (serving.start_failed): they see it and act. The agent's own start (a
        retry, the autostart) met a passing refusal (a process/thread, memory or descriptor limit) is counted as a
        failure and backed off (the crash-loop limit still caps it): going "stopped" there ended the restart
        policy for good. Returns False (for `launch`)."""
        lc = self._lc
        argv = prof.argv()
        limit = os_refusal(exc)
        why = f"{exc}: {limit}" if limit else str(exc)
        lc.profile, lc.profile_name = prof, prof.name
        lc.event(EventKind.SERVING_START_FAILED, Severity.ERROR, f"could not start profile {prof.name}: {why}",
                 argv=redact_argv(argv))
        if own and limit is not None:
            await self._count(prof, f"could not start {argv[0]}: {why}")
            return False
        self._retry.started()  # no retry pending (one that failed here is over)
        lc.set_state(S.STOPPED, f"could not start {argv[0]}: {why}")
        lc.resolve_outcome(False)
        return False

    async def port_taken(self, prof: Profile, why: str, pids: list[int], own: bool) -> bool:
        """Another process listens on the port a start would bind: nothing was started. An operator's start (its
        own check refused it before, supervisor.py; here only a switch's or restart's second half) is "stopped".
        The agent's own start (a retry, the autostart) counts it as a failure and backs off: the crashed run's
        straggler or a hand-started server often frees it within seconds, and going "stopped" there ended the
        restart policy for good (the crash-loop limit still caps it). Returns False (for `launch`)."""
        lc = self._lc
        lc.profile, lc.profile_name = prof, prof.name
        lc.event(EventKind.SERVING_PORT_IN_USE, Severity.ERROR, f"could not start profile {prof.name}: {why}",
                 pids=pids, port=prof.port)
        if own:
            await self._count(prof, why)
            return False
        self._retry.started()  # no retry pending
        lc.set_state(S.STOPPED, why)
        lc.resolve_outcome(False)
        return False

    def resume(self, pending: PendingRetry) -> bool:
        """At agent start, nothing adopted, no crash loop or operator's stop holding: the retry the previous agent
        scheduled and did not carry out (it was killed during the backoff) is scheduled again for what is left of
        its delay, its failures counted toward the crash-loop limit. False: its profile is gone from the config."""
        lc, cfg = self._lc, self._config()
        prof = cfg.profile(pending.profile)
        if prof is None:
            lc.event(EventKind.SERVING_STOPPED, Severity.ERROR, f"not retrying: profile {pending.profile}, whose "
                     "retry was pending when the agent restarted, is no longer in the config")
            return False
        self._retry.resume(pending)
        delay, failures = pending.delay_s(), len(self._retry.failures)
        lc.profile_name, lc.profile = prof.name, prof
        lc.set_state(S.BACKOFF, f"{pending.reason or 'failed'} (scheduled before the agent restarted; due in "
                                f"{delay:.1f} s)")
        lc.event(EventKind.SERVING_BACKOFF, Severity.WARNING, f"profile {prof.name}: the retry pending when the "
                 f"agent restarted goes on: retry in {delay:.1f} s (failure {failures} of "
                 f"{cfg.agent.crash_loop_failures} allowed in {cfg.agent.crash_loop_window_s:g} s)", delay_s=delay,
                 failures=failures, resumed=True)
        cause = RETRY_AFTER_TIMEOUT if pending.readiness_timeout else RETRY_AFTER_CRASH
        self._retry.schedule(delay, lambda: self._retry_due(prof, cause))  # as the previous agent would have
        return True

    async def _count(self, prof: Profile, reason: str, readiness_timeout: bool = False) -> None:
        lc = self._lc
        lc.resolve_outcome(False)
        a = self._config().agent
        window = a.crash_loop_window_s
        delay = self._retry.fail(prof.name, readiness_timeout)
        failures = len(self._retry.failures)
        if delay is None:
            if self._retry.gave_up_on_timeouts:
                msg = (f"gave up: the load did not become ready within readiness_timeout_s "
                       f"({prof.readiness_timeout_s:g} s) twice in a row; not retrying until an operator acts "
                       f"(lynxtop start / restart / switch). If the load is only slow, raise readiness_timeout_s "
                       f"for profile {prof.name} (a 284B model takes 10-30 min); else its log says where it stopped")
            else:
                msg = (f"crash loop: {failures} failures within {window:g} s; not retrying until an "
                       f"operator acts (lynxtop start / restart / switch). Last: {reason}")
            lc.set_state(S.CRASH_LOOP, msg)
            self._retry.save_crash_loop(prof.name, msg)
            lc.event(EventKind.SERVING_CRASH_LOOP, Severity.CRITICAL, f"profile {prof.name}: {msg}", with_log=True,
                     failures=failures)
            return
        in_a_row = self._retry.failures.timeouts_in_a_row
        timeouts = (f"; readiness timeout {in_a_row} of {policy.READINESS_TIMEOUTS_IN_A_ROW} in a row allowed"
                    if readiness_timeout else "")
        lc.set_state(S.BACKOFF, f"{reason}; retry {self._retry.failures.consecutive} in {delay:.1f} s")
        lc.event(EventKind.SERVING_BACKOFF, Severity.WARNING, f"profile {prof.name}: retry in {delay:.1f} s "
                 f"(failure {failures} of {a.crash_loop_failures} allowed in {window:g} s{timeouts})",
                 with_log=True, delay_s=delay, failures=failures)
        cause = RETRY_AFTER_TIMEOUT if readiness_timeout else RETRY_AFTER_CRASH
        self._retry.schedule(delay, lambda: self._retry_due(prof, cause))

    async def _retry_due(self, prof: Profile, cause: str) -> None:
        """The retry takes the action slot as an action of the agent's own and keeps it until its run is ready or
        failed: an operator's start meanwhile is refused (it once spawned a second server beside the retry's, the
        slot freed at the spawn), while a stop, restart or switch may replace the retry while it only waits."""
        lc = self._lc
        if self._slot.current is not None or lc.state != S.BACKOFF:
            return
        self._retry.task_done()
        # the profile as configured now (an adopted run may have been started with older flags)
        current = self._config().profile(prof.name)
        if current is None:
            self._retry.started()
            lc.set_state(S.STOPPED, f"profile {prof.name} is no longer in the config; not restarted")
            lc.event(EventKind.SERVING_STOPPED, Severity.ERROR,
                     f"not retrying: profile {prof.name} is no longer in the config")
            return
        self._slot.begin("retry", f"agent ({cause})", prof.name)
        self._slot.run(self._retry_run(current))

    async def _retry_run(self, prof: Profile) -> None:
        lc = self._lc
        if not await lc.launch(prof, f"retry {self._retry.failures.consecutive} after failure", retry=True):
            return
        run = lc.run
        if run is None:
            return
        with self._slot.waiting():  # resolve_outcome frees the slot at once (ActionSlot.release_waiting)
            await asyncio.shield(run.outcome)
