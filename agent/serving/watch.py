"""Watching one run: its readiness (/health, the startup phases of its log) and then its health while serving.

A `RunWatch` lives as long as one run's lifecycle task and owns its probes; what it finds it hands to the run
lifecycle (agent/serving/lifecycle.py), which alone changes the serving state: `ready`, `not_ready_in_time`,
`on_verdict`, `stable`. It reports what it sees in the run's log (phases, an unwritable log) as events.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeVar

from lynxtop.agent.serving import procs
from lynxtop.agent.serving.health import Health, HealthProbe, HttpClient, Verdict
from lynxtop.agent.serving.idleprobe import IdleProbe, api_key
from lynxtop.agent.serving.launcher import ServerProcess
from lynxtop.agent.serving.run import Run, now_ms
from lynxtop.contract.config import AgentConfig, Profile
from lynxtop.contract.events import EventKind, Severity
from lynxtop.contract.status import ServingState as S  # noqa: N817 - read as a state name: S.READY

if TYPE_CHECKING:
    from lynxtop.agent.serving.lifecycle import RunLifecycle

log = logging.getLogger("lynxtop.agent.serving.supervisor")
T = TypeVar("T")


class ThreadOrInline:
    """Blocking calls handed to a worker thread, or made inline when no thread can start.

    A thread that cannot start (RuntimeError: can't start new thread, at the pids/TasksMax limit the agent shares
    with vLLM's own thread bursts) once escaped a run's watch and killed it: serving said "starting" for ever.
    Made inline, the call costs the loop a few ms instead; one warning per episode (`what` names the call)."""

    def __init__(self, what: str):
        self.what = what
        self.refused = False

    async def call(self, fn: Callable[..., T], *args: object) -> T:
        try:
            # submit raises at once when it cannot start a thread; the call's own errors come from the await
            fut = asyncio.get_running_loop().run_in_executor(None, fn, *args)
        except RuntimeError as exc:
            if not self.refused:
                self.refused = True
                log.warning("%s: no worker thread could start (%s: a process/thread limit, TasksMax or the pids "
                            "cgroup, is reached); made inline until threads start again", self.what, exc)
            return fn(*args)
        if self.refused:
            self.refused = False
            log.info("%s: worker threads start again", self.what)
        return await fut


def server_url(profile: Profile) -> str:
    host = profile.host
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{profile.port}"


def others_listening(proc: ServerProcess, prof: Profile) -> list[procs.PortHolder]:
    """Who listens on the profile's port when no process of the run does ([]: the run does, or /proc/net cannot
    say): a 200 from /health proves the run is ready only if its own process answered it."""
    ours, holders = procs.listener_is_ours(prof.port, proc.members())
    return holders if ours is False else []


STOPPED_NAMED = 5  # stopped processes a hang message names at most


def load_text(run: Run) -> str:
    """`loading weights, 27/60 shards (45%)`: where a load is, for an event's message."""
    phase, progress = run.tracker.phase, run.tracker.progress
    if phase == "loading weights" and progress is not None:
        return f"{phase}, {progress[0]}/{progress[1]} shards ({progress[2]:.0f}%)"
    return phase


def stopped_members(known: Mapping[int, int]) -> str | None:
    """The run's known processes (pid -> start ticks) in state T or t (SIGSTOP, a debugger, a job-control stop),
    for a hang message: "the server is frozen" then says by what, and the operator knows where to look. A pid
    whose start time differs is someone else now (reused), never named."""
    found: list[str] = []
    for pid, ticks in sorted(known.items()):
        s = procs.stat(pid)
        if s is not None and s.start_ticks == ticks and s.state in ("T", "t"):
            found.append(f"{pid} ({s.comm if s.comm.isprintable() else ascii(s.comm)})")
    if not found:
        return None
    more = f" and {len(found) - STOPPED_NAMED} more" if len(found) > STOPPED_NAMED else ""
    return (f"process {', '.join(found[:STOPPED_NAMED])}{more} stopped (state T: SIGSTOP or a debugger; "
            "kill -CONT PID resumes it)")


class RunWatch:
    def __init__(self, lc: RunLifecycle, run: Run, prof: Profile, http: HttpClient, agent: AgentConfig):
        self._lc = lc
        self._run = run
        self._prof = prof
        self._http = http
        self._agent = agent
        self._looks = ThreadOrInline(f"run {run.run_id}: the look at its processes while it loads")
        self._look: asyncio.Task[None] | None = None  # the look in flight beside the probes (`look_while_loading`)
        self._look_error: str | None = None  # the last failed look's error, logged once per episode
        self._stalled = False  # the run's log silent for load_stall_warn_s, and told (once per episode)

    async def watched(self) -> str:
        """Readiness, then health while serving, until the run exits or is stopped: 'ready' (it was ready),
        'timeout' (stopped as not ready in time) or 'exited'.

        An unexpected exception met while watching (a bug, the OS refusing a thread or a descriptor) is logged
        with the run and its profile and told as an event, once per episode, and the watch resumes a moment later:
        a dead watch left a loading run "starting" for ever, its readiness, its readiness timeout and its crash
        never seen, and restart and switch answering busy."""
        readiness: str | None = None
        said: str | None = None
        while True:
            try:
                if readiness is None:
                    readiness = await self.until_ready()
                if readiness == "ready":
                    await self.while_serving()
                return readiness
            except Exception as exc:  # noqa: BLE001 - the run stays watched whatever the watch met
                said = self._failed(exc, said)
            if readiness is None and self._lc.state in (S.READY, S.DEGRADED) and self._lc.run is self._run:
                readiness = "ready"  # it failed after the run was made ready: watched as serving from now
            await asyncio.sleep(max(self._lc.timing.health_poll_s, 1.0))

    def _failed(self, exc: Exception, said: str | None) -> str:
        """Log and tell what stopped the watch a moment (`said`: the last error told; the same again is not)."""
        run, prof = self._run, self._prof
        what = f"{type(exc).__name__}: {exc}"
        if what != said:
            log.error("run %s (profile %s): watching it failed: %s; the watch resumes", run.run_id, prof.name, what,
                      exc_info=exc)
            self._lc.event(EventKind.SERVING_WATCH_ERROR, Severity.ERROR,
                           f"run {run.run_id} (profile {prof.name}, pid {run.proc.pid}): watching it met an "
                           f"unexpected error ({what}); the watch resumes (readiness, health, exit), the server "
                           "was left alone; the agent's log has the traceback", error=what, where="run watch")
        else:
            log.debug("run %s: watching it failed again: %s", run.run_id, what)
        return what

    async def until_ready(self) -> str:
        """'ready', 'timeout' (the lifecycle stopped it) or 'exited'."""
        run, prof, lc = self._run, self._prof, self._lc
        proc = run.proc
        # from the run's start, not from now: an adopted server mid-load has already used part of it. Counted on
        # the boot clock from its process's start: a wall clock stepped while the agent was away (NTP) must
        # neither kill a healthy loading server at once nor give back the time it has used
        elapsed = procs.age_s(proc.record.start_ticks)
        if elapsed is None:
            elapsed = max(0.0, (now_ms() - (run.started_ms or now_ms())) / 1000)
        deadline = time.monotonic() + prof.readiness_timeout_s - elapsed
        silent_at: float | None = None  # when an adopted ready server's silence is said (`adopted_silent`)
        if run.was_ready:
            # it was ready under the previous agent: its load time is long past the timeout, so one slow or
            # failed /health right after an agent restart would otherwise kill a healthy server. Never stopped as
            # a slow load; silent for hang_timeout_s it is told, and restarted only as a hung server is
            deadline = float("inf")
            silent_at = time.monotonic() + self._agent.hang_timeout_s
        # adopted after its deadline had passed (its record lost `ready_ms` on a full disk, or the agent was away
        # longer than the timeout): judged not ready only after the health failure allowance, never on one probe
        allowance = lc.timing.health_fail_threshold if run.adopted and time.monotonic() >= deadline else 0
        misses = 0  # probes in a row that did not make it ready
        url = server_url(prof)
        probe = HealthProbe(self._http, url, lc.timing.health_fail_threshold)
        exit_wait = asyncio.ensure_future(proc.wait())
        told = False
        try:
            while not proc.exited:
                self.poll_phases()
                if not run.was_ready:  # a ready server's log is quiet when idle: no load to stall
                    self.check_silence()
                self.check_log()
                self.look_while_loading()
                lc.state_file.resave(proc.record)
                # an adopted ready server may only be busy: its late 200 (a probe kept in flight up to
                # hang_timeout_s) is an answer, or a server slower than 3 s was told silent and restarted
                answered = (await probe.answered_200(self._agent.hang_timeout_s) if run.was_ready
                            else await probe.ok())
                if answered and not proc.exited:
                    # inline, once per answered probe (a few ms of /proc reads): in a worker thread each of its
                    # syscalls waited for the GIL behind a busy loop, and readiness came seconds late
                    others = others_listening(proc, prof)
                    if not others:
                        # ready's own look (note_files) is fresher: the one in flight must not write its older
                        # members over it into the record once it ends
                        await self.drop_look()
                        await lc.ready(run, url)
                        return "ready"
                    if not told:  # once per run: it may answer for the whole readiness timeout
                        told = True
                        lc.event(EventKind.SERVING_PORT_IN_USE, Severity.ERROR,
                                 f"run {run.run_id}: GET /health on {url} answered, but not from this run: "
                                 f"{'; '.join(h.describe() for h in others)}; not ready until the run's own "
                                 "server answers", pids=sorted({p for h in others for p in h.pids}),
                                 port=prof.port)
                misses += 1
                if silent_at is not None and time.monotonic() >= silent_at:
                    silent_at = None  # once: it was never heard since its adoption (hung, or stuck in a stop)
                    lc.adopted_silent(run, prof, self._agent.hang_timeout_s)
                if time.monotonic() >= deadline and misses >= allowance:
                    await lc.not_ready_in_time(run, prof)
                    return "timeout"
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(exit_wait), lc.timing.health_poll_s)
            self.poll_phases()
            return "exited"
        finally:
            probe.close()
            exit_wait.cancel()
            await self.drop_look()

    async def while_serving(self) -> None:
        """While serving: wait for the exit, probe /health now and then, forgive failures after a stable period."""
        lc, proc = self._lc, self._run.proc
        period = max(lc.timing.health_poll_s * 5, 1.0)
        probe = HealthProbe(self._http, server_url(self._prof), lc.timing.health_fail_threshold,
                            hang_timeout_s=self._agent.hang_timeout_s,  # a frozen server is hung too
                            period_s=period)  # a longer gap between probes was not watched (the agent stopped)
        stable_at: float | None = time.monotonic() + self._agent.stable_after_s
        exit_wait = asyncio.ensure_future(proc.wait())
        idle = self._idle_probe()
        try:
            while not proc.exited:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(exit_wait), period)
                if proc.exited:
                    break
                self.check_log()
                lc.state_file.resave(proc.record)
                if stable_at is not None and time.monotonic() >= stable_at:
                    lc.stable()
                    stable_at = None
                verdict = await probe.probe()
                if verdict is not None and verdict.health is Health.HUNG:
                    why = stopped_members(proc.known)
                    if why is not None:
                        verdict = dataclasses.replace(verdict, reason=f"{verdict.reason}; {why}")
                if verdict is not None and not (verdict.bad and proc.exited):
                    lc.on_verdict(verdict)
        finally:
            probe.close()
            exit_wait.cancel()
            if idle is not None:
                idle.cancel()

    def _idle_probe(self) -> asyncio.Task[None] | None:
        """The idle probe's loop beside the watch (idleprobe.py), with `[agent] idle_probe_s` on; None when off."""
        if self._agent.idle_probe_s <= 0:
            return None
        lc, run, prof = self._lc, self._run, self._prof

        def tell(message: str, details: dict[str, object]) -> None:
            lc.event(EventKind.SERVING_IDLE_PROBE_OFF, Severity.INFO, message, **details)

        def verdict(v: Verdict) -> None:
            if lc.run is run and not (v.bad and run.proc.exited):
                lc.on_verdict(v)

        probe = IdleProbe(self._http, server_url(prof), model=prof.served_model_name or prof.model,
                          key=api_key(prof.env), idle_s=self._agent.idle_probe_s,
                          timeout_s=self._agent.hang_timeout_s, tell=tell,
                          run_label=f"run {run.run_id} (profile {prof.name})")
        return asyncio.get_running_loop().create_task(
            probe.run(lambda: lc.state == S.READY and lc.run is run, verdict), name=f"run {run.run_id}: idle probe")

    def look_while_loading(self) -> None:
        """A young run's processes looked at each second (ServerProcess.look_due; in a thread: a look reads every
        process of the node), and the record saved whenever they changed: an agent killed mid-load leaves the next
        one the EngineCore and workers that hide the run's token (setproctitle) by pid and start time.

        The look runs beside the /health probes, one at a time, never before them: on a busy loop (a DP8 /metrics
        scrape, many status pollers) each /proc read of the look's thread waits for the GIL, and a watch that
        awaited the look before each probe saw readiness seconds late."""
        proc = self._run.proc
        if self._look is not None and self._look.done():
            self._look = None  # `_look_now` handled its end; nothing is left to retrieve
        if self._look is None and proc.look_due():
            self._look = asyncio.get_running_loop().create_task(self._look_now(), name=self._looks.what)
        if proc.members_changed():  # the node sampler's looks refresh the members too
            self._lc.state_file.save(proc.record)

    async def _look_now(self) -> None:
        """One look, then the record saved if the members changed. Its errors are logged (once per episode), never
        raised: the watch goes on probing /health whatever a look met."""
        proc, run = self._run.proc, self._run
        try:
            await self._looks.call(proc.members)
            if proc.members_changed():
                self._lc.state_file.save(proc.record)
        except Exception as exc:  # noqa: BLE001 - a failed look costs a look, never the watch
            what = f"{type(exc).__name__}: {exc}"
            if what != self._look_error:
                log.warning("run %s (profile %s, pid %s): looking at its processes while it loads failed: %s; "
                            "looked at again in a moment", run.run_id, self._prof.name, proc.pid, what,
                            exc_info=exc)
            self._look_error = what
            return
        if self._look_error is not None:
            log.info("run %s: its processes can be looked at again", run.run_id)
            self._look_error = None

    async def drop_look(self) -> None:
        """The look in flight, if any, cancelled and waited for: no task of the watch outlives the readiness wait,
        and none saves its (older) members after it. Its worker thread ends on its own; what it sees still
        merges into the run's known processes (ServerProcess._members, under its lock)."""
        look, self._look = self._look, None
        if look is None:
            return
        look.cancel()
        await asyncio.wait({look})  # never raises; a cancel of this watch itself still propagates from here

    def check_log(self) -> None:
        """A run whose output cannot be written is an event (once per episode), never a reason to stop it."""
        run = self._run
        problem, was = run.check_log()
        if problem is not None and (was is None or was[0] != problem[0]):
            self._lc.event(EventKind.SERVING_LOG_UNWRITABLE, Severity.WARNING,
                           f"run {run.run_id}: {problem[1]}; serving goes on, its output is lost until this is fixed",
                           log_path=run.log_path)
        elif problem is None and was is not None:
            self._lc.event(EventKind.SERVING_LOG_WRITABLE, Severity.INFO,
                           f"run {run.run_id}: its log {run.log_path} can be written again", log_path=run.log_path)

    def check_silence(self) -> None:
        """A loading run whose log has not grown for load_stall_warn_s (a hung NFS read of the weights) is told
        once per episode, and again (info) when its output resumes: a stuck load otherwise looked like a slow one
        for the whole readiness timeout. A warning only: nothing is stopped for it (the readiness timeout is)."""
        run, limit = self._run, self._agent.load_stall_warn_s
        silent_s = (now_ms() - run.tracker.grew_ms) / 1000
        if not self._stalled and limit > 0 and silent_s >= limit:
            self._stalled = True
            self._lc.event(EventKind.SERVING_LOAD_STALLED, Severity.WARNING,
                           f"run {run.run_id}: its log {run.log_path} has not grown for {silent_s:.0f} s while "
                           f"loading ({load_text(run)}): a hung read of the weights or a stuck worker? It is not "
                           f"stopped for this; readiness_timeout_s {self._prof.readiness_timeout_s:g} is the only "
                           "stop of a load", silent_s=round(silent_s, 1), phase=run.tracker.phase,
                           log_path=run.log_path)
        elif self._stalled and silent_s < limit:
            self._stalled = False
            self._lc.event(EventKind.SERVING_LOAD_RESUMED, Severity.INFO,
                           f"run {run.run_id}: its log grows again ({load_text(run)})", phase=run.tracker.phase,
                           log_path=run.log_path)

    def poll_phases(self) -> None:
        run = self._run
        for mark in run.new_phases():
            elapsed = (mark.ts_ms - (run.started_ms or mark.ts_ms)) / 1000
            self._lc.event(EventKind.SERVING_PHASE, Severity.INFO,
                           f"run {run.run_id}: {mark.phase} ({elapsed:.0f} s after start)", phase=mark.phase)
            self._lc.changed()
