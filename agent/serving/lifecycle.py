"""The run lifecycle: one server start at a time, start -> readiness -> serving -> exit or stop.

The only writer of the serving state (stopped, waiting, starting, ready, degraded, stopping, backoff, crash-loop),
of the current profile and of the current `Run` (agent/serving/run.py). Each run has one lifecycle task
(readiness -> watching -> crash handling). Any exit nobody asked for is a crash, whatever the exit code: vLLM can
exit 0 when its engine dies. A model that took 20 minutes to load is never restarted here except after a crash, a
readiness timeout, or a hang with `restart_on_hang` on (policy.py decides; the supervisor carries it out).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol

from lynxtop.agent.events import EventSink
from lynxtop.agent.serving import launcher, logcap, policy, procs, runtmp
from lynxtop.agent.serving.actions import ActionSlot, clock
from lynxtop.agent.serving.adoption import FALLBACK_GRACE_S, Adopted
from lynxtop.agent.serving.failures import Failures
from lynxtop.agent.serving.gpu_holders import GpuGate, GpuGuard
from lynxtop.agent.serving.health import Health, HttpClient, Verdict, version_of
from lynxtop.agent.serving.health_episode import HealthEpisode
from lynxtop.agent.serving.launcher import ExitInfo, ServerProcess
from lynxtop.agent.serving.retry import PendingRetry, Retry
from lynxtop.agent.serving.run import Run, now_ms
from lynxtop.agent.serving.runstore import RunStore, store_call
from lynxtop.agent.serving.startup import tail_lines
from lynxtop.agent.serving.statefiles import ServerState
from lynxtop.agent.serving.stopping import report_stop, wait_gpus_released
from lynxtop.agent.serving.watch import RunWatch, server_url
from lynxtop.contract.config import Config, Profile
from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.contract.redact import redact_argv
from lynxtop.contract.status import ServingState as S  # noqa: N817 - read as a state name: S.READY

log = logging.getLogger("lynxtop.agent.serving.supervisor")

LOG_TAIL_LINES = 20
RUN_LOGS_KEPT = 200  # per-run vLLM logs kept in log_dir (a run's row outlives its log: store/retention.py)

# a silent /health ("unresponsive": a frozen or wedged API server) is a hang too, told with the hang's kinds
_DEGRADED = {"hang": EventKind.SERVING_DEGRADED_HANG, "unresponsive": EventKind.SERVING_DEGRADED_HANG,
             "health": EventKind.SERVING_DEGRADED_HEALTH}
_RECOVERED = {"hang": EventKind.SERVING_RECOVERED_HANG, "unresponsive": EventKind.SERVING_RECOVERED_HANG,
              "health": EventKind.SERVING_RECOVERED_HEALTH}
# A reason that only re-counts (a failing /health's "N times in a row", every probe) is logged at most this often:
# logged at each probe it was 720 lines an hour.
REASON_REMINDER_S = 600.0


class GpuView(Protocol):
    """What the supervisor needs to know about the GPUs (node.py answers from the sampler's latest tick)."""

    def gpu_info(self) -> list[dict[str, Any]] | None:
        """[{index, name, cc_major, cc_minor, mem_total_bytes, nvlink_count, driver_version}] (the last three may
        be absent: then not checked), or None when the GPUs cannot be read (NVML down)."""
        ...

    def compute_pids(self) -> tuple[float, set[int]] | None:
        """(monotonic time of the latest sample, pids holding GPU memory), or None when unknown."""
        ...


class LiveRunError(RuntimeError):
    """`launch` while the current run is unfinished: a bug of the caller, never a second server."""


def refuse_if_current(run: Run | None, prof: Profile) -> None:
    """A launch never replaces a run that is not finished: the old server would keep loading or serving on the same
    GPUs, unsupervised (`stop` reaches only the current run). Whoever launches stops the run first."""
    if run is not None and not run.finished:
        alive = "alive" if not run.proc.exited else "exited, its end not yet handled"
        raise LiveRunError(f"not starting profile {prof.name}: run {run.run_id} (pid {run.proc.pid}, {alive}) is "
                           "still the current run; a second server would crowd its GPUs")


class ClusterGate(Protocol):
    """On a head: whether Ray reports the GPUs a profile needs (agent/cluster/view.py), and where Ray's GCS is."""

    address: str

    def missing(self, prof: Profile) -> str | None: ...

    async def wait_change(self, timeout_s: float) -> None: ...


def port_taken(prof: Profile, holders: list[procs.PortHolder]) -> str:
    """Why `prof` cannot start while `holders` listen where it would bind."""
    return (f"port {prof.port} is already in use: {'; '.join(h.describe() for h in holders)}; a second server "
            f"there would fail to bind while the one answering /health is not this agent's (ps -fp PID; stop it, "
            f"or give profile {prof.name} another port)")


@dataclasses.dataclass(frozen=True)
class Timing:
    """How often /health is asked, after how many failures it counts, how long a kill is waited for."""

    health_poll_s: float = 1.0
    health_fail_threshold: int = 3
    stop_kill_wait_s: float = 15.0


class RunLifecycle:
    def __init__(self, config: Callable[[], Config], store: RunStore, events: EventSink, gpus: GpuView,
                 slot: ActionSlot, retry: Retry, state_path: Path, *, host: str, simulated: bool,
                 timing: Timing, http: HttpClient, cluster: ClusterGate | None,
                 on_change: Callable[[], None] | None, on_hang: Callable[[Profile], None]):
        self._config = config
        self._store = store
        self._events = events
        self._gpus = gpus
        self._slot = slot
        self._retry = retry
        # serving.json, and its copy beside the control socket (a tmpfs): adoption reads them at start
        self.state_file = ServerState(state_path, self.event, socket=config().agent.socket)
        self._host, self._simulated, self.timing = host, simulated, timing
        self._http = http
        self._cluster = cluster
        self._on_change = on_change
        self._on_hang = on_hang  # the supervisor's restart after a hang (an action of its own)
        self._gate_task: asyncio.Task | None = None  # the start or retry waiting at the cluster's gate
        self._task: asyncio.Task | None = None  # the current run's lifecycle task
        self._closing = False
        self._failures = Failures(self, slot, retry, config)  # what follows a crash or a readiness timeout
        self.gpu_gate = GpuGate(self, slot, retry, GpuGuard(gpus), config)  # foreign processes on the GPUs
        self._health = HealthEpisode()  # a flapping /health is one "health" episode (health_episode.py)

        self.state: S = S.STOPPED
        self.state_since_ms = now_ms()
        self.reason = "agent started"
        self._logged_at = time.monotonic()  # when the state or its reason was last logged
        self.profile: Profile | None = None
        self.profile_name: str | None = None  # set with `profile`; alone for a crash loop whose profile was removed
        self.run: Run | None = None  # the current run, or the last one once it ended
        self.crashes = 0
        self.restarts = 0

    @property
    def proc(self) -> ServerProcess | None:
        return self.run.proc if self.run is not None else None

    @property
    def run_id(self) -> int | None:
        return self.run.run_id if self.run is not None else None

    def url(self) -> str | None:
        return server_url(self.profile) if self.profile else None

    def vllm_root_pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and not self.proc.exited else None

    def run_log(self) -> tuple[int | None, str] | None:
        """(run id, log path) of the current run, or of the last one once it ended; None before any."""
        return (self.run.run_id, self.run.log_path) if self.run is not None else None

    def run_token(self) -> str | None:
        """The current run's token (its processes carry it in their environment)."""
        return self.proc.record.token if self.proc is not None else None

    def run_members(self, table: Any = None) -> list[int]:
        """The current run's processes outside the leader's tree (a /proc scan: call it in a thread)."""
        return self.proc.members(table) if self.proc is not None else []

    def readiness_deadline(self) -> tuple[float, int] | None:
        """(readiness_timeout_s, deadline on the agent's timeline) of a run starting now: a slow load says how long
        it may still take before it is stopped; None in any other state."""
        run = self.run
        if self.state != S.STARTING or run is None or run.ready_timeout_s is None or run.ready_deadline_ms is None:
            return None
        return run.ready_timeout_s, run.ready_deadline_ms

    def set_state(self, state: S, reason: str, *, recount: bool = False) -> None:
        """`recount`: the reason only counts on (the same failure seen again): logged as a slow reminder."""
        now = time.monotonic()
        if state != self.state or (reason != self.reason and not recount):
            log.info("serving: %s -> %s (%s)", self.state, state, reason)
            self._logged_at = now
        elif reason != self.reason and now - self._logged_at >= REASON_REMINDER_S:
            log.info("serving: still %s (%s)", state, reason)
            self._logged_at = now
        if state != self.state:
            self.state_since_ms = now_ms()
        self.state = state
        self.reason = reason
        if self._on_change:
            self._on_change()

    def event(self, kind: EventKind, severity: Severity, message: str, with_log: bool = False, *,
              about_run: int | None | Literal["current"] = "current", **details: Any) -> None:
        """A supervisor event, its state and run added (`about_run`: a held run's; None: a start's, not the last's)."""
        details.setdefault("state", self.state)
        if with_log and self.proc is not None:
            details["log_tail"] = tail_lines(self.proc.record.log_path, LOG_TAIL_LINES)
            details["log_path"] = self.proc.record.log_path
        self._events.put(Event(kind, severity, message, details=details,
                               run_id=self.run_id if about_run == "current" else about_run))

    # ------------------------------------------------------------------------------------- a run's start

    async def _await_cluster(self, prof: Profile) -> None:
        """A head starts a Ray profile only once Ray reports the GPUs it needs, saying what is missing meanwhile.

        The wait is not a failure (no backoff, no crash-loop count) and a stop ends it."""
        missing = self._cluster.missing(prof) if self._cluster is not None and prof.uses_ray else None
        if missing is None or self._cluster is None:
            return
        self.profile, self.profile_name = prof, prof.name
        self._retry.started()
        self.set_state(S.WAITING, missing)
        self.event(EventKind.CLUSTER_WAITING, Severity.WARNING, f"profile {prof.name}: {missing}",
                   gpus_needed=prof.gpus_needed)
        self._gate_task = asyncio.current_task()
        try:
            with self._slot.waiting():
                while missing is not None:
                    await self._cluster.wait_change(5.0)
                    missing = self._cluster.missing(prof)
                    if missing is not None and missing != self.reason:
                        self.set_state(S.WAITING, missing)
        finally:
            self._gate_task = None
        self.event(EventKind.CLUSTER_WHOLE, Severity.INFO, f"profile {prof.name}: Ray reports the "
                   f"{prof.gpus_needed} GPUs it needs; starting vLLM")

    async def cancel_gate(self) -> None:
        """A stop ends a start or retry that waits for the cluster or for its GPUs."""
        await self.gpu_gate.cancel()
        task = self._gate_task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def launch(self, prof: Profile, reason: str, restart: bool = False, autostart: bool = False,
                     retry: bool = False) -> bool:
        """Spawn a new run of `prof` (the GPUs were freed by whoever stopped the previous run); `restart`: an
        operator's or the hang policy's restart, counted. Waits while processes not of the run hold its GPUs
        (gpu_holders.py: an operator's action was refused for them already; an autostart or retry waits).
        `autostart`, `retry`: the agent's own start, which a passing refusal by the OS backs off (failures.py)."""
        refuse_if_current(self.run, prof)
        if restart:
            self.restarts += 1
        try:
            await self._await_cluster(prof)
            if not await self.gpu_gate.wait(prof, autostart):  # held: another lynxtop agent's run (gpu_holders.py)
                return self.resolve_outcome(False) or False
            agent = self._config().agent
            protect = {self.proc.record.log_path} if self.proc is not None else set()
            for old in launcher.prune_logs(agent.run_log_dir, RUN_LOGS_KEPT, protect,
                                           agent.run_logs_max_total_mb * launcher.MIB):
                log.info("removed old run log %s (keeping the newest %d, %d MiB at most: run_logs_max_total_mb)",
                         old, RUN_LOGS_KEPT, agent.run_logs_max_total_mb)
            spawned = prof
            if self._cluster is not None and prof.uses_ray and "RAY_ADDRESS" not in prof.env:
                # the cluster this agent runs, by name: ray.init("auto") takes whichever Ray started last on the host
                spawned = dataclasses.replace(prof, env={**prof.env, "RAY_ADDRESS": self._cluster.address})
            taken = await asyncio.to_thread(procs.port_holders, prof.host, prof.port)
            if taken:  # every start (restart, switch, retry) checks the port once the previous run is gone
                return await self._failures.port_taken(prof, port_taken(prof, taken),
                                                       sorted({p for h in taken for p in h.pids}),
                                                       own=autostart or retry)
            refuse_if_current(self.run, prof)  # again after the awaits, none between this check and the spawn
            run = Run.launch(spawned, agent.run_log_dir, runtmp.root_for(agent.database))
        except LiveRunError:
            raise
        except (OSError, RuntimeError) as exc:  # nothing was started (spawn never raises once it forked)
            return await self._failures.start_refused(prof, exc, own=autostart or retry)
        proc = run.proc
        self.run = run
        self.profile, self.profile_name = prof, prof.name
        self._retry.started()
        self.state_file.save(proc.record)  # before any await: an agent killed now must still find this server
        # Returns at once: the row waits in the writer's queue while the disk is full (a full disk once held a
        # restart 30 s in "stopping" here and the run was never recorded).
        run.run_id = await store_call(
            self._store.create_run, profile=prof.name, argv=proc.record.argv, model=prof.model, host=self._host,
            started_ms=run.started_ms, pid=proc.pid, pid_start_time=proc.record.start_ticks, log_path=run.log_path,
            simulated=self._simulated or launcher.runs_simulator(proc.record.argv), flags=prof.flags())
        proc.record.run_id = run.run_id
        self.state_file.save(proc.record)
        self.set_state(S.STARTING, reason)
        tmp = f"; it keeps the agent's own temporary directory: {proc.tmp_error}" if proc.tmp_error else ""
        tmp += f"; {proc.pidfd_error}" if proc.pidfd_error else ""  # a descriptor refused after the fork
        self.event(EventKind.SERVING_STARTING, Severity.INFO, f"run {run.run_id}: started profile {prof.name} "
                   f"(pid {proc.pid}): {reason}{tmp}", pid=proc.pid, argv=redact_argv(proc.record.argv),
                   log_path=run.log_path, tmp_dir=proc.record.tmp_dir)
        RunWatch(self, run, prof, self._http, agent).check_log()
        self._task = asyncio.get_running_loop().create_task(self._lifecycle(run, prof), name=f"run-{run.run_id}")
        return True

    def adopt(self, found: Adopted, stopping: str | None = None) -> None:
        """Watch the server a previous agent left (adoption.py found it) like any run; `stopping` (why): one whose
        stop it did not finish, made current for the stop to end it, never watched (its exit is no crash)."""
        record = found.record
        run = self.run = Run.adopt(found.proc, record, found.profile.readiness_timeout_s)
        self.profile, self.profile_name = found.profile, record.profile
        if stopping is not None:
            self.set_state(S.STOPPING, stopping)
            return
        self.set_state(S.STARTING, f"adopted run {record.run_id} (pid {record.pid}) from the previous agent")
        self.event(EventKind.SERVING_ADOPTED, Severity.INFO, f"adopted run {record.run_id} (profile "
                   f"{record.profile}, pid {record.pid}) left running by the previous agent: no restart",
                   pid=record.pid)
        self._task = asyncio.get_running_loop().create_task(self._lifecycle(run, found.profile),
                                                            name=f"run-{record.run_id}")

    async def sweep_tmp(self) -> None:
        """At agent start, once adoption is decided: the TMPDIRs of runs that are gone (a node crash; a stop that
        left a process) are removed, but none a process could still be in (runtmp.sweep)."""
        agent = self._config().agent
        root = runtmp.root_for(agent.database)
        proc = self.proc  # the adopted run, or one an operator started meanwhile
        names = runtmp.stale(root, [proc.record.tmp_dir if proc else None])  # now: a later start is never among them
        if names:
            await asyncio.to_thread(lambda: runtmp.sweep(root, names, agent.run_log_dir,
                                                         set(proc.members()) if proc else set()))

    def hold_crash_loop(self, profile: str, reason: str) -> None:
        """At agent start, with nothing adopted: the crash loop the previous agent recorded goes on."""
        self.profile_name, self.profile = profile, self._config().profile(profile)
        self.set_state(S.CRASH_LOOP, f"{reason} (recorded before the agent restarted)")
        self.event(EventKind.SERVING_CRASH_LOOP, Severity.WARNING, f"profile {profile} is still in crash-loop from "
                   "before the agent restarted; not starting it (lynxtop start / restart / switch / stop to act)")

    def resume_retry(self, pending: PendingRetry) -> bool:
        """At agent start: the retry the previous agent left pending goes on (Failures.resume)."""
        return self._failures.resume(pending)

    async def not_ready_in_time(self, run: Run, prof: Profile) -> None:
        await self._failures.not_ready_in_time(run, prof)

    def adopted_silent(self, run: Run, prof: Profile, silent_s: float) -> None:
        """A run adopted as ready, silent since (hung, or stuck in a shutdown begun while no agent ran): said once,
        never stopped as a slow load, restarted only as a hung server is (`restart_on_hang`)."""
        restart = policy.restart_on_verdict(True, self._config().agent, self._slot.current is not None, True)
        why = (f"adopted run {run.run_id}, ready before the agent restarted, has not answered GET /health in "
               f"{silent_s:g} s since its adoption (hung, or stuck in a shutdown?)")
        self.set_state(self.state, why)
        then = ("restarting it (restart_on_hang)" if restart else
                f"it is not stopped: check it (ps -fp {run.proc.pid}), then `lynxtop restart` or `lynxtop stop`")
        self.event(EventKind.SERVING_DEGRADED_HANG, Severity.ERROR, f"run {run.run_id}: {why}; {then}", with_log=True,
                   condition="unresponsive")
        if restart:
            self._on_hang(prof)

    # ------------------------------------------------------------------------------------- readiness, serving

    async def _lifecycle(self, run: Run, prof: Profile) -> None:
        proc = run.proc
        watch = RunWatch(self, run, prof, self._http, self._config().agent)
        # beside the watch, not in it: a copy of the log never delays a /health probe
        capper = asyncio.get_running_loop().create_task(logcap.look_after(  # its size cap and its disk reserve
            run.log_path, lambda: self._config().agent, lambda: not proc.exited), name="run-log-upkeep")
        try:
            readiness = await watch.watched()  # never raises but a cancel: a dead watch left a run unwatched
        finally:
            capper.cancel()
        if proc.exited and not self._closing:
            if readiness != "timeout":  # a timeout was counted already, as a failure rather than a crash
                self.crashes += 1
            await self._failures.after_exit(run, prof, proc.exit or ExitInfo(None, None, known=False), readiness)

    def changed(self) -> None:
        """Something the status shows changed (a phase): the node refreshes its status line."""
        if self._on_change:
            self._on_change()

    def stable(self) -> None:
        """The run stayed up for `stable_after_s`: its failures are forgiven."""
        if self._retry.failures:
            log.info("run %s stable for %.0f s: failure count reset", self.run_id,
                     self._config().agent.stable_after_s)
        self._retry.failures.reset()

    async def ready(self, run: Run, url: str) -> None:
        proc = run.proc
        proc.note_files()  # the run's /dev/shm segments exist by now; a later kill of the whole run hides them
        was_ready = run.was_ready
        ready_ms = proc.record.ready_ms if was_ready else now_ms()
        assert ready_ms is not None
        run.ready_ms = ready_ms
        self._retry.ready()  # the load fits its timeout: earlier readiness timeouts are no longer in a row
        _, body = await self._http.get(url + "/version")  # capped in size (agent/serving/health.py)
        run.vllm_version = version_of(body) or run.vllm_version
        if was_ready:
            self.state_file.save(proc.record)  # with the segments seen now
            self.set_state(S.READY, f"adopted run {run.run_id} answers GET /health 200")
            self.event(EventKind.SERVING_READY, Severity.INFO, f"run {run.run_id}: adopted and serving (ready since "
                       f"{clock(ready_ms)})", adopted=True)
            self.resolve_outcome(True)
            return
        load_s = (ready_ms - (run.started_ms or ready_ms)) / 1000
        gpus = self._gpus.gpu_info() or []
        if run.run_id is not None:
            await store_call(self._store.update_run, run.run_id, ready_ms=ready_ms, vllm_version=run.vllm_version,
                             gpu_names=sorted({str(g.get("name")) for g in gpus}) or None,
                             gpu_count=len(gpus) or None)
        proc.record.ready_ms = ready_ms
        self.state_file.save(proc.record)
        self.set_state(S.READY, f"GET /health answered 200 after {load_s:.1f} s")
        self.event(EventKind.SERVING_READY, Severity.INFO, f"run {run.run_id}: ready after {load_s:.1f} s "
                   f"(vLLM {run.vllm_version or 'version unknown'})", with_log=True, load_s=load_s)
        self.resolve_outcome(True)

    def resolve_outcome(self, ok: bool) -> None:
        if self.run is not None:
            self.run.resolve(ok)
        self._slot.release_waiting()

    def on_verdict(self, verdict: Verdict) -> None:
        """A verdict on the current run from health.py: hung or unhealthy marks it degraded (a hang restarts it with
        `restart_on_hang`), healthy again clears that condition (each only by its own source; "health" once settled)."""
        run = self.run
        if run is None or (verdict := self._health.judge(run.run_id, verdict)) is None:  # type: ignore[assignment]
            return  # no run, or a "health" episode still settling: degraded until /health holds healthy
        if verdict.health in (Health.HUNG, Health.PROGRESSING) and self.state not in (S.READY, S.DEGRADED):
            return  # a hang of a run that is no longer serving (stopping, crashed) says nothing
        if not verdict.bad:
            if run.clear_degraded(verdict.condition) and self.state == S.DEGRADED:
                if run.degraded:
                    self.set_state(S.DEGRADED, run.degraded_reason())
                else:
                    self.set_state(S.READY, verdict.reason)
                self.event(_RECOVERED[verdict.condition], Severity.INFO, f"run {self.run_id}: {verdict.reason}",
                           with_log=True, condition=verdict.condition)
            return
        new = run.mark_degraded(verdict.condition, verdict.reason)
        if self.state in (S.READY, S.DEGRADED):
            self.set_state(S.DEGRADED, run.degraded_reason(), recount=verdict.repeat and not new)
            if new:
                self.event(_DEGRADED[verdict.condition], Severity.ERROR, f"run {self.run_id}: degraded: "
                           f"{verdict.reason}", with_log=True, condition=verdict.condition)
        if policy.restart_on_verdict(verdict.health is Health.HUNG, self._config().agent,
                                     self._slot.current is not None, self.profile is not None):
            assert self.profile is not None
            self._on_hang(self.profile)

    # ------------------------------------------------------------------------------------- a run's end

    async def stop_and_release(self, run: Run, grace_s: float) -> None:
        """Stop a run that failed (its events said why) and wait for its GPU memory."""
        res = await run.proc.stop(grace_s, self.timing.stop_kill_wait_s)
        report_stop(self.event, self.run_id, run.proc, res, files_in_caller_event=False)
        await wait_gpus_released(self.event, self.run_id, self._gpus, res.pids, time.monotonic(),
                                 self._config().agent.gpu_release_timeout_s)

    async def finish_run(self, run: Run, end_reason: str) -> None:
        if run.finished:
            return
        run.finished = True
        ex = run.proc.exit
        if run.run_id is not None:
            await store_call(self._store.update_run, run.run_id, ended_ms=now_ms(),
                             exit_code=ex.exit_code if ex else None, exit_signal=ex.exit_signal if ex else None,
                             end_reason=end_reason)
        self.state_file.remove()
        run.proc.close()

    async def stop_current(self, reason: str, end_reason: str, grace_s: float | None = None) -> None:
        """Stop the current run, if any (`grace_s`: not the profile's), and wait for its GPU memory's release."""
        run = self.run
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self._task = None
        self.resolve_outcome(False)
        if run is None:
            return
        proc = run.proc
        if proc.exited and not proc.members() and run.finished:
            return
        if run.crash_reason and proc.exited:
            end_reason = run.crash_reason  # it crashed before this stop reached it
        grace = grace_s if grace_s is not None else self.profile.stop_grace_s if self.profile else FALLBACK_GRACE_S
        self.set_state(S.STOPPING, reason)
        t0 = time.monotonic()
        res = await proc.stop(grace, self.timing.stop_kill_wait_s)
        files = report_stop(self.event, self.run_id, proc, res, files_in_caller_event=True)
        self.event(EventKind.SERVING_EXITED, Severity.INFO, f"run {run.run_id}: stopped in "
                   f"{time.monotonic() - t0:.1f} s ({proc.exit.describe() if proc.exit else 'exit unknown'}){files}",
                   with_log=True, pids=res.pids, removed=res.removed, not_removed=res.not_removed)
        await wait_gpus_released(self.event, self.run_id, self._gpus, res.pids, time.monotonic(),
                                 self._config().agent.gpu_release_timeout_s)
        await self.finish_run(run, end_reason)

    async def close(self, stop_serving: bool) -> None:
        """Agent exit: the run's task ends; with live restore its server keeps running (its record stays)."""
        if not stop_serving and self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if stop_serving and self.run is not None and not self.run.finished:
            await self.stop_current("agent shutting down (live_restore off)", "stopped with the agent")
            self.set_state(S.STOPPED, "agent shut down")
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self.proc is not None:
            self.proc.close()

