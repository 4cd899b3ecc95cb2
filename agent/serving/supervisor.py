"""The supervisor: the control API's serving actions (start, stop, restart, switch), wired over the parts that
each own one job.

- agent/serving/lifecycle.py: the run lifecycle, the only writer of the serving state and the current run;
- agent/serving/actions.py: the one action at a time (busy, preemption by a stop);
- agent/serving/policy.py, retry.py: the restart policy (pure) and the retries it decides, the crash-loop marker;
- agent/serving/switching.py: the switch or restart intent on disk; adoption.py: live restore at agent start;
- agent/config_source.py: the config, re-read in one place (profiles for each action).

An action here validates (the run the caller saw, profile, preflight, free disk space, strays, port), takes the
action slot, and hands the work to the lifecycle; it writes no state of its own. Everything that can refuse is
checked before anything is stopped, the run the caller saw (`expect_run`) again with no await before the slot is
taken. A stop may preempt an action that is only waiting for readiness (an operator must be able to abort a wrong
20-minute load); anything else in progress makes a second action "busy".
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lynxtop.agent.api.control import ANY_RUN, ActionError, ExpectRun
from lynxtop.agent.config_source import ConfigSource
from lynxtop.agent.events import EventSink
from lynxtop.agent.serving import check, diskspace, gpu_holders, heldstop, launcher, procs
from lynxtop.agent.serving.actions import ActionSlot
from lynxtop.agent.serving.adoption import FALLBACK_GRACE_S, Adoption
from lynxtop.agent.serving.health import HttpClient
from lynxtop.agent.serving.heldaction import HeldStopAction
from lynxtop.agent.serving.lifecycle import ClusterGate, GpuView, RunLifecycle, Timing, port_taken, server_url
from lynxtop.agent.serving.retry import Retry
from lynxtop.agent.serving.run import now_ms
from lynxtop.agent.serving.runstore import RunStore
from lynxtop.agent.serving.stopnote import OperatorStop, StopKeeper
from lynxtop.agent.serving.switching import ActionIntent
from lynxtop.contract.config import Config, ConfigError, Profile
from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.contract.models import ModelSpec, find_model
from lynxtop.contract.status import ActionInfo, PhaseMark, ServingStatus
from lynxtop.contract.status import ServingState as S  # noqa: N817 - read as a state name: S.READY

log = logging.getLogger(__name__)

__all__ = ["ClusterGate", "GpuView", "Supervisor", "now_ms", "preflight", "server_url"]

# What the lifecycle shows read-only through the supervisor (the status, the node's tick, tests).
_FROM_LIFECYCLE = frozenset({"state", "state_since_ms", "reason", "profile", "profile_name", "run", "proc",
                             "run_id", "crashes", "restarts", "url", "on_verdict", "vllm_root_pid",
                             "run_log", "run_token", "run_members"})
_FROM_RUN = frozenset({"adopted", "started_ms", "ready_ms", "vllm_version", "tracker"})


def preflight(profile: Profile, gpus: list[dict[str, Any]] | None,
              models: tuple[ModelSpec, ...] = ()) -> tuple[list[str], list[str]]:
    """(problems that forbid the start, warnings) for starting `profile` on this node.

    The GPU part is `lynxtop check` (agent/serving/check.py): its blocking verdicts refuse, its warnings are reported;
    what it could not check (GPU memory or the model unknown) is left unsaid here.
    """
    problems: list[str] = []
    warnings: list[str] = []
    try:
        profile.argv()
    except Exception as exc:  # noqa: BLE001 - any failure to build argv is a config problem to report
        problems.append(f"profile {profile.name}: cannot build the argv: {exc}")
    exe = Path(profile.executable)
    if not exe.exists():
        problems.append(f"executable {exe} does not exist")
    elif not exe.is_file() or not os.access(exe, os.X_OK):
        problems.append(f"executable {exe} is not an executable file")
    if gpus is None:
        warnings.append("GPUs cannot be read (NVML unavailable): GPU count not checked")
        return problems, warnings
    node = check.facts_from_info(gpus, ray_installed=check.ray_installed(profile.executable))
    report = check.check_profile(profile, node, find_model(profile.model, models))
    return problems + report.lines(check.Level.BLOCKING), warnings + report.lines(check.Level.WARNING)


async def refuse_if_crowded(prof: Profile, log_dir: Path, replacing: RunLifecycle | None = None,
                            guard: gpu_holders.GpuGuard | None = None) -> None:
    """Start's checks, made before anything is stopped: processes of an earlier run nobody could adopt (a second
    server would fail or crowd their GPUs), a listener on `prof`'s port (the new run could not bind) and, with
    `guard`, any other process on the GPUs `prof` uses (another agent's model, another team's job).

    `replacing`: the run a restart or switch stops first; its own processes and port are no obstacle. Read in
    this order (holders, then the run's processes) so a process of the run that appears meanwhile is counted as
    the run's, never as a foreign one."""
    def members() -> list[int]:
        return replacing.run_members() if replacing is not None else []

    def look() -> tuple[list[int], list[procs.PortHolder], gpu_holders.Taken | None]:
        strays = procs.runs_started_in(os.path.realpath(log_dir))
        holders = procs.port_holders(prof.host, prof.port)
        on_gpus = guard.look(prof, members) if guard is not None else None
        ours = set(members())
        return ([p for p in strays if p not in ours and procs.alive(p)],
                [h for h in holders if not (h.pids and ours.issuperset(h.pids))], on_gpus)

    try:
        strays, taken, on_gpus = await asyncio.to_thread(look)
    except procs.ProcUnreadable as exc:  # who runs is unknown (the agent out of descriptors), not "nobody"
        raise ActionError("procs_unknown", f"{exc}: whether processes of an earlier run still hold the GPUs or "
                                           "the port cannot be told; nothing was started, try again", 503) from None
    if strays:  # a server nobody could adopt still holds the GPUs: a second one would fail or crowd it
        raise ActionError("strays", f"processes of an earlier run are still alive (pids {strays}) and could not "
                                    "be adopted; check them (ps -fp PID) and stop them before starting serving",
                          409, details={"pids": strays})
    if taken:  # an orphan of a lost state dir, say: refused here, with its pid, not found out after a stop
        raise ActionError("port_in_use", port_taken(prof, taken), 409,
                          details={"pids": sorted({p for h in taken for p in h.pids}), "port": prof.port})
    if on_gpus:  # a second vLLM there fails vLLM's free-memory check only after opening CUDA contexts on them
        raise ActionError(gpu_holders.CODE, on_gpus.refusal(prof), 409, details=on_gpus.details())


def refuse_start_now(runs: RunLifecycle, slot: ActionSlot, wanted: str | None = None) -> None:
    """Start's refusals on what serving does now (no await here: the caller takes the slot right after).
    `wanted`: the profile asked for (None: the current one). Starting or serving it already is the ask met, told
    apart by its code (already_starting / already_serving: the CLI exits 0, docs/api.md); another profile
    serving is a refusal ("state")."""
    state = runs.state
    if slot.name() == "retry":
        raise retry_under_way(runs, slot)
    if state in (S.STARTING, S.READY, S.DEGRADED):
        code = "state" if wanted not in (None, runs.profile_name) else already_code(state)
        raise ActionError(code, f"serving is already {state} (profile {runs.profile_name}); use restart or switch",
                          409)
    if state == S.STOPPING or slot.current is not None:
        raise slot.busy() if slot.current else ActionError("state", "serving is stopping; try again", 409)


def already_code(state: S) -> str:
    """The 409's code for a start asking what serving already does (its own profile starting or served)."""
    return "already_starting" if state == S.STARTING else "already_serving"


def retry_under_way(runs: RunLifecycle, slot: ActionSlot) -> ActionError:
    """The refusal of a start while the agent's own retry starts or loads: named as such (its processes are the
    agent's run, not strays to be stopped, which would throw the load away)."""
    a = slot.current or {}
    cause = str(a.get("by") or "").removeprefix("agent (").removesuffix(")") or "a retry"
    run, state = runs.run, runs.state
    if run is not None and not run.finished:
        doing = f"the agent is loading run {run.run_id if run.run_id is not None else '(new)'}"
    else:
        doing = f"the agent is starting a new run ({state}: {runs.reason})"
    return ActionError("state", f"{doing} of profile {a.get('profile') or runs.profile_name} ({cause}); nothing was "
                                "started: a second server would crowd its GPUs. Watch it with `lynxtop status`; "
                                "`lynxtop stop` ends it, restart or switch replace it", 409,
                       details={"action": a, "run_id": runs.run_id, "state": str(state)})


def retry_replaceable(slot: ActionSlot) -> bool:
    """What holds the slot is the agent's retry, only waiting (its load, its GPUs, the cluster): a restart or
    switch may replace it (it stops that run itself). A retry that is spawning keeps the slot for those moments."""
    return slot.name() == "retry" and slot.stop_may_preempt()


async def replace_waiting_retry(runs: RunLifecycle, slot: ActionSlot) -> None:
    if retry_replaceable(slot):
        await slot.cancel()
        await runs.cancel_gate()


async def strays_hold(autostart: str, log_dir: Path) -> Event | None:
    """The event that holds autostart while processes of an earlier run nobody could adopt live (or /proc cannot
    say whether any do: unknown is not "none"); None: nothing holds it."""
    try:
        strays = await asyncio.to_thread(procs.runs_started_in, os.path.realpath(log_dir))
    except procs.ProcUnreadable as exc:
        return Event(EventKind.AGENT_AUTOSTART_HELD, Severity.ERROR,
                     f"autostart of {autostart} held: {exc}, so whether processes of an earlier run still hold the "
                     "GPUs cannot be told; start it with `lynxtop start` once the agent can read /proc again",
                     details={"pids": [], "reason": "procs_unknown"})
    if not strays:
        return None
    # a server the previous agent left (its state file lost or unreadable): a second one on the same GPUs would fail
    # or, worse, crowd the live one; an operator decides
    return Event(EventKind.AGENT_AUTOSTART_HELD, Severity.ERROR,
                 f"autostart of {autostart} held: processes of an earlier run are still alive (pids {strays}) and "
                 "could not be adopted; check them (ps -fp PID) and stop them; `lynxtop start` refuses while they "
                 "live", details={"pids": strays})


class Supervisor:
    """Validates and carries out the serving actions; wires the lifecycle, the action slot, retries, adoption and
    the switch or restart intent, and owns no state of a run (read it through the lifecycle's names above)."""

    def __init__(self, cfg: Config, store: RunStore, gpus: GpuView, *, state_path: Path, host: str,
                 simulated: bool = False, health_poll_s: float = 1.0, health_fail_threshold: int = 3,
                 stop_kill_wait_s: float = 15.0, rng: random.Random | None = None,
                 on_change: Callable[[], None] | None = None, http: HttpClient | None = None,
                 cluster: ClusterGate | None = None, events: EventSink | None = None,
                 config: ConfigSource | None = None):
        self.config = config or ConfigSource(cfg)  # node.py passes the agent's one source
        self.state_path = state_path
        self.gpus = gpus
        self.http = http or HttpClient()  # the agent's session to vLLM (shared with the scraper under node.py)
        self._own_http = http is None
        self.cluster = cluster  # a head's Ray cluster: Ray profiles start once it has their GPUs
        events = self._sink = events or EventSink(store)  # type: ignore[arg-type] - the agent's one event path
        self._slot = ActionSlot(self._expected_s, self._action_failed, on_change)
        self._retry = Retry(cfg.agent, state_path.with_name("crash-loop.json"), rng, event=self._event)
        self._retry.describe = lambda: (self.runs.run_id, self.runs.reason)  # written into backoff.json
        self.runs = RunLifecycle(lambda: self.config.current, store, events, gpus, self._slot, self._retry,
                                 state_path, host=host, simulated=simulated,
                                 timing=Timing(health_poll_s, health_fail_threshold, stop_kill_wait_s), http=self.http,
                                 cluster=cluster, on_change=on_change, on_hang=self._restart_after_hang)
        self._adoption = Adoption(self.runs.state_file, store, self.runs.event, lambda: self.config.current,
                                  host=host, simulated=simulated)
        self._intent = ActionIntent(state_path.with_name("switch.json"), self.runs.event)
        # an operator's stop: finished, or kept stopped, by the next agent
        self._stops = StopKeeper(state_path.with_name("stopped.json"), self.runs, self._slot, events)
        self._held = HeldStopAction(self)  # `lynxtop stop` of a run nobody supervises
        self._gpu_guard = self.runs.gpu_gate.guard  # one guard: "NVML cannot say" is logged once

    def __getattr__(self, name: str) -> Any:
        if name in _FROM_LIFECYCLE:
            return getattr(self.runs, name)
        if name in _FROM_RUN:  # the current run's, or the last one's once it ended
            run = self.runs.run
            return getattr(run, name) if run is not None else (False if name == "adopted" else None)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def cfg(self) -> Config:
        return self.config.current

    @property
    def action(self) -> dict[str, Any] | None:
        return self._slot.current

    @property
    def next_retry_ms(self) -> int | None:
        return self._retry.next_retry_ms

    def _event(self, kind: EventKind, severity: Severity, message: str, with_log: bool = False,
               **details: Any) -> None:
        self.runs.event(kind, severity, message, with_log, **details)

    # ------------------------------------------------------------------------------------- the action slot

    def _expected_s(self, name: str, profile: str | None) -> tuple[float, str]:
        """The longest `name` can take from now (its timeouts added up), and the sum in words."""
        a = self.cfg.agent
        parts: list[tuple[str, float]] = []
        run, prof = self.runs.run, self.runs.profile
        if name in ("stop", "restart", "switch") and run is not None and not run.finished:
            grace = prof.stop_grace_s if prof else FALLBACK_GRACE_S
            parts += [("stop_grace_s", grace), ("kill wait", self.runs.timing.stop_kill_wait_s),
                      ("gpu_release_timeout_s", a.gpu_release_timeout_s)]
        target = self.cfg.profile(profile) if profile and name != "stop" else None
        if target is not None:
            parts.append(("readiness_timeout_s", target.readiness_timeout_s))
        total = sum(v for _, v in parts)
        words = " + ".join(f"{k} {v:g} s" for k, v in parts) or "no timeout applies"
        if target is not None and self.cluster is not None and target.uses_ray:
            words += ", after Ray reports the GPUs"
        return total, words

    def check_seen(self, expect_run: ExpectRun) -> None:
        """Refuse (409 run_changed) an action confirmed against another run than the current one: another
        operator's switch, a retry or a restart came between the caller's look and its request."""
        now = self.runs.run_id
        if expect_run is ANY_RUN or expect_run == now:
            return
        saw = f"run {expect_run}" if expect_run is not None else "no run"
        cur = (f"run {now} (profile {self.runs.profile_name or '-'}, {self.runs.state})" if now is not None
               else f"no run ({self.runs.state})")
        raise ActionError("run_changed", f"the run changed since you looked: you saw {saw}, now {cur}; nothing done",
                          409, details={"expected_run": expect_run, "run_id": now,
                                        "profile": self.runs.profile_name, "state": str(self.runs.state)})

    def _begin(self, name: str, by: str, profile: str | None, seen: ExpectRun = ANY_RUN) -> None:
        """Take the action slot; the run the caller saw is checked here, with no await before the slot is taken."""
        self.check_seen(seen)
        if self._slot.current is not None:
            raise self._slot.busy()
        self._retry.clear_crash_loop()  # someone acted: the crash loop is acknowledged
        self._slot.begin(name, by, profile)
        if name != "stop":
            self._stops.note.clear()  # serving is wanted again: an operator's stop no longer holds autostart

    def _action_failed(self, name: str | None, exc: Exception) -> None:
        self._event(EventKind.ACTION_FAILED, Severity.ERROR, f"{name} failed: {exc}")

    def _resolve_profile(self, name: str | None) -> Profile:
        name = name or self.runs.profile_name or self.cfg.agent.default_profile or None
        if name is None:
            raise ActionError("no_profile", "no profile given and no current or default profile "
                                            "(name one: lynxtop start PROFILE)", 400)
        try:
            cfg = self.config.reload()  # the profile as the file says now: an edit is picked up by the next start
        except ConfigError as exc:
            raise ActionError("preflight", "the config file has errors; nothing was changed:\n"
                              + "\n".join(exc.problems), 422, details={"reasons": exc.problems}) from None
        prof = cfg.profile(name)
        if prof is None:
            known = ", ".join(p.name for p in cfg.profiles) or "none configured"
            raise ActionError("unknown_profile", f"unknown profile {name!r} (known: {known})", 404)
        return prof

    def _preflight_or_raise(self, profile: Profile) -> list[str]:
        problems, warnings = preflight(profile, self.gpus.gpu_info(), self.cfg.models)
        if problems:
            raise ActionError("preflight", f"preflight of profile {profile.name!r} failed: " + "; ".join(problems),
                              422, details={"reasons": problems, "warnings": warnings})
        for w in warnings:
            self._event(EventKind.PREFLIGHT_WARNING, Severity.WARNING, f"profile {profile.name}: {w}")
        return warnings

    # ------------------------------------------------------------------------------------- actions

    async def start(self, profile: str | None, by: str, expect_run: ExpectRun = ANY_RUN, *,
                    autostart: bool = False) -> str:
        """`autostart`: the agent's own start, which waits for GPUs other processes hold rather than refuse.

        What serving does now is checked before the checks that await and again with no await before the slot is
        taken: the backoff's retry may have spawned its run meanwhile (a start let through then spawned a second
        server beside it, and `stop` left one of them running unsupervised)."""
        self.check_seen(expect_run)
        refuse_start_now(self.runs, self._slot, profile)
        prof = self._resolve_profile(profile)
        warnings = self._preflight_or_raise(prof)
        try:
            if not autostart:  # an autostart waits for room instead (diskspace.DiskGate)
                await diskspace.refuse_if_short(self.cfg.agent, f"start profile {prof.name}")
            await refuse_if_crowded(prof, self.cfg.agent.run_log_dir, guard=None if autostart else self._gpu_guard)
        except ActionError:
            refuse_start_now(self.runs, self._slot, prof.name)  # the retry's run, spawned meanwhile, they found
            raise
        refuse_start_now(self.runs, self._slot, prof.name)
        self._begin("start", by, prof.name, expect_run)
        self._event(EventKind.ACTION_START, Severity.INFO, f"start of profile {prof.name} requested by {by}", by=by,
                    about_run=None)  # the run it starts has no id yet: not the last run's
        self._slot.run(self._do_start(prof, f"started by {by}", autostart))
        return f"starting profile {prof.name}" + "".join(f" (warning: {w})" for w in warnings)

    async def stop(self, by: str, expect_run: ExpectRun = ANY_RUN) -> str:
        """`lynxtop stop`; with nothing supervised, a run alive that nobody supervises is stopped (heldaction.py)."""
        self.check_seen(expect_run)  # before anything, the crash loop's clearing included
        held = await self._held.look() if self._held.nothing_supervised() else heldstop.HeldRuns()
        self.check_seen(expect_run)  # again: the look awaited a thread
        if self._held.nothing_supervised():
            if held:
                return self._held.stop(by, expect_run, held)
            if self.runs.state == S.CRASH_LOOP:
                self._retry.clear_crash_loop()
                self._stops.note.stopping(by, None, None)  # stopped by an operator: no autostart at the next start
                self.runs.set_state(S.STOPPED, f"stopped by {by} (was crash-loop)")
                self._event(EventKind.SERVING_STOPPED, Severity.INFO, f"crash loop acknowledged and cleared by {by}")
                return "serving was in crash-loop; now stopped"
            raise ActionError("already_stopped", "serving is already stopped", 409)  # the ask met: CLI exit 0
        if not self._slot.stop_may_preempt():
            raise self._slot.busy()
        # a start/switch only waiting for readiness, or a start or retry waiting for the cluster: abort it
        await self._slot.cancel()
        await self.runs.cancel_gate()
        self._intent.clear()  # a switch or restart this stop preempted is not to be finished by a later agent
        self._begin("stop", by, self.runs.profile_name, expect_run)
        run = self.runs.run
        # before the SIGTERM: an agent that dies while vLLM drains is followed by one that finishes the stop
        self._stops.note.stopping(by, run.run_id if run is not None and not run.finished else None,
                                  self.runs.profile.stop_grace_s if self.runs.profile else FALLBACK_GRACE_S)
        self._event(EventKind.ACTION_STOP, Severity.INFO, f"stop requested by {by}", by=by)
        self._slot.run(self._do_stop(f"stopped by {by}", "stopped by operator"))
        return "stopping serving"

    async def restart(self, by: str, expect_run: ExpectRun = ANY_RUN, *, profile: str | None = None) -> str:
        """Restart the current profile (`profile`: an interrupted restart's, finished by the next agent)."""
        self.check_seen(expect_run)
        if self._slot.current is not None and not retry_replaceable(self._slot):
            raise self._slot.busy()
        prof = self._resolve_profile(profile)
        warnings = self._preflight_or_raise(prof)
        await diskspace.refuse_if_short(self.cfg.agent, f"restart profile {prof.name}")
        await refuse_if_crowded(prof, self.cfg.agent.run_log_dir, self.runs, self._gpu_guard)
        await replace_waiting_retry(self.runs, self._slot)
        self._begin("restart", by, prof.name, expect_run)
        self._intent.save("restart", prof.name, self.runs.profile_name, by, self.runs.run_id)  # as a switch's
        self._event(EventKind.ACTION_RESTART, Severity.INFO, f"restart of profile {prof.name} requested by {by}", by=by)
        self._slot.run(self._intent.carried(self._do_restart(prof, f"restarted by {by}")))
        return f"restarting profile {prof.name}" + "".join(f" (warning: {w})" for w in warnings)

    async def switch(self, profile: str, by: str, expect_run: ExpectRun = ANY_RUN) -> str:
        self.check_seen(expect_run)
        if self._slot.current is not None and not retry_replaceable(self._slot):
            raise self._slot.busy()
        prof = self._resolve_profile(profile)
        warnings = self._preflight_or_raise(prof)
        await diskspace.refuse_if_short(self.cfg.agent, f"switch to profile {prof.name}")
        await refuse_if_crowded(prof, self.cfg.agent.run_log_dir, self.runs, self._gpu_guard)
        await replace_waiting_retry(self.runs, self._slot)
        old = self.runs.profile_name
        self._begin("switch", by, prof.name, expect_run)
        # before anything is stopped: an agent killed mid-switch resumes it
        self._intent.save("switch", prof.name, old, by, self.runs.run_id)
        self._event(EventKind.ACTION_SWITCH, Severity.INFO, f"switch from {old} to {prof.name} requested by {by}",
                    by=by, old_profile=old, new_profile=prof.name)
        self._slot.run(self._intent.carried(self._switch_steps(prof, old, by)))
        return f"switching from {old or '(nothing)'} to {prof.name}" + "".join(f" (warning: {w})" for w in warnings)

    def _restart_after_hang(self, prof: Profile) -> None:
        """policy.restart_on_verdict said so (restart_on_hang, no action running): a restart of the agent's own."""
        by = "agent (hang detected, restart_on_hang)"
        self._begin("restart", by, prof.name)
        self._intent.save("restart", prof.name, self.runs.profile_name, by, self.runs.run_id)
        self._slot.run(self._intent.carried(self._do_restart(prof, "restart after hang (restart_on_hang)")))

    async def _do_start(self, prof: Profile, reason: str, autostart: bool = False) -> bool:
        self._retry.cancel()
        self._retry.failures.reset()
        return await self.runs.launch(prof, reason, autostart=autostart) and await self._await_outcome()

    async def _do_stop(self, reason: str, end_reason: str) -> None:
        self._retry.cancel()
        await self.runs.stop_current(reason, end_reason)
        self._stops.note.stopped()  # the run ended: kept, to hold autostart at the next agent start of this boot
        self.runs.set_state(S.STOPPED, reason)
        self._event(EventKind.SERVING_STOPPED, Severity.INFO, f"serving stopped ({reason})", with_log=True)

    async def _do_restart(self, prof: Profile, reason: str) -> bool:
        self._retry.cancel()
        await self.runs.stop_current(reason, "restarted")
        self._retry.failures.reset()
        return await self.runs.launch(prof, reason, restart=True) and await self._await_outcome()

    async def _switch_steps(self, prof: Profile, old: str | None, by: str) -> None:
        self._retry.cancel()
        await self.runs.stop_current(f"switching to {prof.name} (by {by})", f"switched to {prof.name}")
        self._retry.failures.reset()
        ok = await self.runs.launch(prof, f"switched from {old} by {by}")
        ok = ok and await self._await_outcome()
        if ok:
            self._event(EventKind.ACTION_SWITCH_DONE, Severity.INFO,
                        f"switch to {prof.name} done: run {self.runs.run_id} is ready")
        else:
            back = f"; switch back with `lynxtop switch {old}`" if old and old != prof.name else ""
            self._event(EventKind.ACTION_SWITCH_FAILED, Severity.ERROR,
                        f"switch to {prof.name} failed: the new run did not become ready ({self.runs.reason}){back}",
                        old_profile=old, new_profile=prof.name)

    async def _await_outcome(self) -> bool:
        """Hold the action slot until the run is ready or failed; a stop may preempt this wait."""
        run = self.runs.run
        if run is None:
            return False
        with self._slot.waiting():
            return bool(await asyncio.shield(run.outcome))

    # ------------------------------------------------------------------------------------- agent start and end

    async def take_over(self, autostart: str | None) -> None:
        """At agent start: adopt the server the previous agent left, finish its interrupted switch, hold its
        recorded crash loop, keep serving stopped that an operator stopped (this boot), or else autostart
        `autostart` (None: no autostart) unless strays of a run live."""
        self._stops.autostart = autostart
        stop = self._stops.at_start()
        adopted = await self.adopt_previous(stop)  # a stop under way is finished instead
        self._held.say_held()
        pending = self._retry.recorded_retry()  # a retry the previous agent left: resumed below if nothing holds
        await self.runs.sweep_tmp()  # before any start of this agent's: only runs that are gone are swept
        if await self.resume_switch():  # a switch the previous agent did not finish (killed mid-switch)
            return
        held = not adopted and self.restore_crash_loop()
        if not held and stop is not None and stop.this_boot() and self.runs.state in (S.STOPPED, S.STOPPING):
            self._stops.hold(stop)  # an operator's stop wins over a pending retry
            return
        if not adopted and not held and pending is not None and self.runs.resume_retry(pending):
            return
        if adopted or held or not autostart:
            return
        if (strays := await strays_hold(autostart, self.cfg.agent.run_log_dir)) is not None:
            self._sink.put(strays)
            return
        try:
            # GPUs other processes hold do not refuse it: it waits for them (gpu_holders.GpuGate)
            log.info("autostart: %s", await self.start(autostart, by="agent (autostart)", autostart=True))
        except ActionError as exc:
            self._sink.put(Event(EventKind.AGENT_AUTOSTART_FAILED, Severity.ERROR,
                                 f"autostart of {autostart} refused: {exc.message}"))

    async def adopt_previous(self, stop: OperatorStop | None = None) -> bool:
        """Adopt the server a previous agent left running (live restore), or clean up after it. Under `stop`, an
        operator's stop of that run the previous agent did not finish, the server is stopped instead."""
        stopping = stop.run if stop is not None and stop.stopping else None
        found = await self._adoption.find(stopping)
        if found is None:
            return False
        if stop is not None and stopping is not None and found.record.run_id == stopping:
            self._stops.take_over(found, stop)
            return True
        if stop is not None:  # serving ran again after that stop (its note outlived a start): it no longer holds
            self._stops.note.clear()
        self.runs.adopt(found)
        return True

    def restore_crash_loop(self) -> bool:
        """At agent start, with nothing adopted: resume a crash loop recorded by the previous agent."""
        recorded = self._retry.recorded_crash_loop()
        if recorded is None:
            return False
        self.runs.hold_crash_loop(*recorded)
        return True

    async def resume_switch(self) -> bool:
        """At agent start, after adoption: finish a switch or restart the previous agent began and did not end (it
        was killed or restarted), saying so in `action.switch.interrupted`. True when serving is taken care of."""
        left = self._intent.interrupted()
        if left is None:
            return False
        asked, run = left.describe(), self.runs.run
        details = {"action": left.action, "old_profile": left.old, "new_profile": left.target, "by": left.by}
        if run is not None and left.new_run_started(self.runs.profile_name, run.run_id, not run.finished):
            self._intent.clear()  # the new run had started: adopted, and watched until ready like any other
            self._event(EventKind.ACTION_SWITCH_INTERRUPTED, Severity.WARNING, f"{asked} was interrupted by the "
                        f"agent's end after its new run {run.run_id} started; that run was adopted", resumed=False,
                        **details)
            return True
        self._event(EventKind.ACTION_SWITCH_INTERRUPTED, Severity.WARNING, f"{asked} was interrupted by the "
                    "agent's end before its new run started; finishing it now", resumed=True, **details)
        by = f"agent (finishing the interrupted {left.action} asked by {left.by})"
        try:
            if left.action == "restart":
                await self.restart(by, profile=left.target)
            else:
                await self.switch(left.target, by)
        except ActionError as exc:
            self._intent.clear()
            self._event(EventKind.ACTION_SWITCH_FAILED if left.action == "switch" else EventKind.ACTION_FAILED,
                        Severity.ERROR, f"the interrupted {left.action} {'of' if left.action == 'restart' else 'to'} "
                        f"{left.target} cannot be finished: {exc.message}", old_profile=left.old,
                        new_profile=left.target)
            return False
        except Exception as exc:  # noqa: BLE001 - a bug here would end every agent start with the note still there
            log.exception("finishing the interrupted %s failed", left.action)
            self._intent.clear()
            self._event(EventKind.ACTION_FAILED, Severity.ERROR, f"the interrupted {left.action} of {left.target} "
                        f"cannot be finished: {type(exc).__name__}: {exc}", old_profile=left.old,
                        new_profile=left.target)
            return False
        return True

    async def shutdown(self, stop_serving: bool) -> None:
        """Agent exit: with live restore the server keeps running (and its record stays for the next agent), and a
        pending retry's note stays for the next agent too (an upgrade's restart during a backoff)."""
        self._retry.cancel(keep_note=not stop_serving)
        await self._slot.finish_stop()  # an operator's stop: finished rather than a half-stopped server left
        await self._slot.cancel()
        if stop_serving:
            self._intent.clear()  # serving stops with the agent: nothing is to be switched to or restarted
        await self.runs.close(stop_serving)
        if self._own_http:
            await self.http.close()

    # ------------------------------------------------------------------------------------- status

    def serving_status(self) -> ServingStatus:
        lc = self.runs
        run, proc = lc.run, lc.proc
        alive = lc.state.alive
        starting = run is not None and lc.state == S.STARTING
        deadline = lc.readiness_deadline()  # a slow load says how long it may still take before it is stopped
        return ServingStatus(
            state=lc.state, state_since_ms=lc.state_since_ms, reason=lc.reason,
            phase=run.tracker.phase if starting else None,  # type: ignore[union-attr]
            phase_since_ms=run.tracker.phase_since_ms if starting else None,  # type: ignore[union-attr]
            phases=tuple(PhaseMark(m.phase, m.ts_ms) for m in run.tracker.marks) if run is not None else (),
            profile=lc.profile_name, run_id=lc.run_id, pid=proc.pid if proc is not None and alive else None,
            model=lc.profile.model if lc.profile else None, vllm_version=run.vllm_version if run else None,
            started_ms=run.started_ms if run else None, ready_ms=run.ready_ms if run else None,
            next_retry_ms=self._retry.next_retry_ms, failures_in_window=len(self._retry.failures),
            adopted=run is not None and run.adopted, url=lc.url(),
            log_problem=run.log_problem[1] if run is not None and run.log_problem and alive else None,
            degraded=tuple(sorted(run.degraded)) if run is not None and lc.state == S.DEGRADED else (),
            ready_timeout_s=deadline[0] if deadline else None, ready_deadline_ms=deadline[1] if deadline else None,
            simulated=proc is not None and launcher.runs_simulator(proc.record.argv),
            load_progress=run.load_progress if starting else None,  # type: ignore[union-attr]
            # a server adopted ready has no load whose log could stall (an idle server writes nothing)
            log_grew_ms=run.tracker.grew_ms if starting and not run.was_ready else None,  # type: ignore[union-attr]
        )

    def action_status(self) -> ActionInfo | None:
        return self._slot.info()
