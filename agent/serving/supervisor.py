"""The serving state machine: start, readiness, crash, backoff, crash loop, hang, stop, switch, adoption.

States: stopped, starting, ready, degraded, stopping, backoff, crash-loop. Each run has one lifecycle task
(readiness -> watching -> crash handling); operator actions run one at a time in an action task. A stop may
preempt an action that is only waiting for readiness (an operator must be able to abort a wrong 20-minute
load); everything else in progress makes a second action fail with "busy".

Any exit the supervisor did not ask for is a crash, whatever the exit code: vLLM can exit 0 when its engine
dies. A model that took 20 minutes to load is never restarted by the agent except after a crash, a readiness
timeout, or a hang with `restart_on_hang` on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from lynxtop.agent.api.control import ActionError
from lynxtop.agent.events import EventSink
from lynxtop.agent.serving import check, launcher, procs
from lynxtop.agent.serving.backoff import FailureWindow
from lynxtop.agent.serving.health import Health, HealthProbe, HttpClient, Verdict, version_of
from lynxtop.agent.serving.launcher import ExitInfo, ServerProcess
from lynxtop.agent.serving.run import Run, now_ms
from lynxtop.agent.serving.startup import PhaseTracker, tail_lines
from lynxtop.contract.config import Config, ConfigError, Profile, load_config
from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.contract.files import atomic_write
from lynxtop.contract.models import ModelSpec, find_model
from lynxtop.contract.status import ActionInfo, PhaseMark, ServingStatus
from lynxtop.contract.status import ServingState as S  # noqa: N817 - read as a state name: S.READY

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 20
RUN_LOGS_KEPT = 200  # per-run vLLM logs kept in log_dir (the runs table keeps every run forever)
# An adopted server whose profile was removed from the config is stopped with these defaults.
_FALLBACK_GRACE_S = 60.0

class RunStore(Protocol):
    """The part of the store writer the supervisor uses for runs (`lynxtop.store.writer.StoreWriter`); events go
    through the agent's one event path (agent/events.py)."""

    def record(self, event: Event) -> None: ...

    def create_run(self, run_id: int | None = None, **fields: Any) -> int: ...

    def update_run(self, run_id: int, **fields: Any) -> None: ...


class GpuView(Protocol):
    """What the supervisor needs to know about the GPUs (node.py answers from the sampler's latest tick)."""

    def gpu_info(self) -> list[dict[str, Any]] | None:
        """[{index, name, cc_major, cc_minor, mem_total_bytes, nvlink_count, driver_version}] (the last three may
        be absent: then not checked), or None when the GPUs cannot be read (NVML down)."""
        ...

    def compute_pids(self) -> tuple[float, set[int]] | None:
        """(monotonic time of the latest sample, pids holding GPU memory), or None when unknown."""
        ...


class ClusterGate(Protocol):
    """On a head: whether Ray reports the GPUs a profile needs (agent/cluster/view.py), and where Ray's GCS is."""

    address: str

    def missing(self, prof: Profile) -> str | None: ...

    async def wait_change(self, timeout_s: float) -> None: ...


def _clock(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M:%S UTC")


def server_url(profile: Profile) -> str:
    host = profile.host
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{profile.port}"


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


_DEGRADED = {"hang": EventKind.SERVING_DEGRADED_HANG, "health": EventKind.SERVING_DEGRADED_HEALTH}
_RECOVERED = {"hang": EventKind.SERVING_RECOVERED_HANG, "health": EventKind.SERVING_RECOVERED_HEALTH}


def _files_text(res: launcher.StopResult) -> str:
    """'; removed ...; not removed ...' for an event message ('' when the run left no files behind)."""
    text = ""
    if res.removed:
        text += f"; removed the run's leftover files: {', '.join(res.removed)}"
    if res.not_removed:
        text += f"; NOT removed: {', '.join(res.not_removed)}"
    return text


def _port_taken(prof: Profile, holders: list[procs.PortHolder]) -> str:
    """Why `prof` cannot start while `holders` listen where it would bind."""
    return (f"port {prof.port} is already in use: {'; '.join(h.describe() for h in holders)}; a second server "
            f"there would fail to bind while the one answering /health is not this agent's (ps -fp PID; stop it, "
            f"or give profile {prof.name} another port)")


def _with_address_of(prof: Profile, argv: list[str]) -> Profile:
    """`prof` with the host and port the recorded argv really used (the config may have changed since)."""
    changes: dict[str, Any] = {}
    for flag, key in (("--host", "host"), ("--port", "port")):
        if flag in argv[:-1]:
            value = argv[argv.index(flag) + 1]
            if key == "port":
                if not value.isdigit():
                    continue
                changes[key] = int(value)
            else:
                changes[key] = value
    return dataclasses.replace(prof, **changes) if changes else prof


class Supervisor:
    """The serving state machine over the current `Run` (None before the first start or adoption).

    The supervisor keeps what spans runs: the state, the current profile, the failure window and backoff, and the
    operator action; everything of one server start is in `self.run` (agent/serving/run.py), made new by each start.
    """

    def __init__(self, cfg: Config, store: RunStore, gpus: GpuView, *, state_path: Path, host: str,
                 simulated: bool = False, health_poll_s: float = 1.0, health_fail_threshold: int = 3,
                 stop_kill_wait_s: float = 15.0, rng: random.Random | None = None,
                 on_change: Callable[[], None] | None = None, http: HttpClient | None = None,
                 cluster: ClusterGate | None = None, events: EventSink | None = None):
        self.cfg = cfg
        self.store = store
        self.events = events or EventSink(store)  # the agent's one event path (node.py passes its own)
        self.gpus = gpus
        self.state_path = state_path
        self.host = host
        self.simulated = simulated
        self.health_poll_s = health_poll_s
        self.health_fail_threshold = health_fail_threshold
        self.stop_kill_wait_s = stop_kill_wait_s
        self.rng = rng or random.Random()
        self.on_change = on_change
        self.http = http or HttpClient()  # the agent's session to vLLM (shared with the scraper under node.py)
        self._own_http = http is None
        self.cluster = cluster  # a head's Ray cluster: Ray profiles start once it has their GPUs
        self._gate_task: asyncio.Task | None = None  # the start or retry waiting at that gate

        self.state: S = S.STOPPED
        self.state_since_ms = now_ms()
        self.reason = "agent started"
        self.profile: Profile | None = None
        self.profile_name: str | None = None
        self.run: Run | None = None  # the current run, or the last one once it ended
        self.next_retry_ms: int | None = None
        self.crashes = 0
        self.restarts = 0
        self._failures = FailureWindow(cfg.agent, self.rng)

        self.action: dict[str, Any] | None = None
        self._action_preemptible = False
        self._action_task: asyncio.Task | None = None
        self._lifecycle: asyncio.Task | None = None
        self._retry_task: asyncio.Task | None = None
        self._closing = False
        self._record_unsaved = False  # the last write of the state file failed: retried while the run lives

    # ------------------------------------------------------------------------------------- the current run

    @property
    def proc(self) -> ServerProcess | None:
        return self.run.proc if self.run is not None else None

    @property
    def run_id(self) -> int | None:
        return self.run.run_id if self.run is not None else None

    @property
    def adopted(self) -> bool:
        return self.run is not None and self.run.adopted

    @property
    def started_ms(self) -> int | None:
        return self.run.started_ms if self.run is not None else None

    @property
    def ready_ms(self) -> int | None:
        return self.run.ready_ms if self.run is not None else None

    @property
    def vllm_version(self) -> str | None:
        return self.run.vllm_version if self.run is not None else None

    @property
    def tracker(self) -> PhaseTracker | None:
        return self.run.tracker if self.run is not None else None

    # ------------------------------------------------------------------------------------- helpers

    def _set_state(self, state: S, reason: str) -> None:
        if state != self.state or reason != self.reason:
            log.info("serving: %s -> %s (%s)", self.state, state, reason)
        if state != self.state:
            self.state_since_ms = now_ms()
        self.state = state
        self.reason = reason
        if self.on_change:
            self.on_change()

    def _event(self, kind: EventKind, severity: Severity, message: str, with_log: bool = False,
               **details: Any) -> None:
        details.setdefault("state", self.state)
        if with_log and self.proc is not None:
            details["log_tail"] = tail_lines(self.proc.record.log_path, LOG_TAIL_LINES)
            details["log_path"] = self.proc.record.log_path
        self._record(Event(kind, severity, message, details=details, run_id=self.run_id))

    def _record(self, ev: Event) -> None:
        self.events.put(ev)

    async def _store_call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - serving does not depend on the history store
            log.error("history store call %s failed: %s", getattr(fn, "__name__", fn), exc)
            return None

    def url(self) -> str | None:
        return server_url(self.profile) if self.profile else None

    def _busy(self) -> ActionError:
        """The 409 for a second action: what runs, since when, and when it ends at the latest."""
        a = self.action or {}
        what = a.get("action", "?") + (f" to {a['profile']!r}" if a.get("profile") else "")
        now = now_ms()
        since = a.get("since_ms", now)
        if a.get("deadline_ms") is None:  # an action the agent began itself (a retry): bounded the same way
            expected_s, why = self._expected_s(a.get("action", "?"), a.get("profile"))
            deadline = since + int(expected_s * 1000)
        else:
            deadline, why = a["deadline_ms"], a.get("deadline_from", "")
        elapsed_s = max(0.0, (now - since) / 1000)
        left_s = max(0.0, (deadline - now) / 1000)
        return ActionError("busy", f"busy: {what} in progress since {_clock(since)} (by {a.get('by', '?')}), "
                                   f"{elapsed_s:.0f} s so far; it ends by {_clock(deadline)} at the latest "
                                   f"({left_s:.0f} s from now: {why}); try again then or watch `lynxtop status`",
                           409, details={"action": a, "elapsed_s": round(elapsed_s, 1), "deadline_ms": deadline,
                                         "retry_after_s": round(left_s, 1)})

    def _expected_s(self, name: str, profile: str | None) -> tuple[float, str]:
        """The longest `name` can take from now (its timeouts added up), and the sum in words."""
        a = self.cfg.agent
        parts: list[tuple[str, float]] = []
        if name in ("stop", "restart", "switch") and self.run is not None and not self.run.finished:
            grace = self.profile.stop_grace_s if self.profile else _FALLBACK_GRACE_S
            parts += [("stop_grace_s", grace), ("kill wait", self.stop_kill_wait_s),
                      ("gpu_release_timeout_s", a.gpu_release_timeout_s)]
        target = self.cfg.profile(profile) if profile and name != "stop" else None
        if target is not None:
            parts.append(("readiness_timeout_s", target.readiness_timeout_s))
        total = sum(v for _, v in parts)
        words = " + ".join(f"{k} {v:g} s" for k, v in parts) or "no timeout applies"
        if target is not None and self.cluster is not None and target.uses_ray:
            words += ", after Ray reports the GPUs"
        return total, words

    def _begin(self, name: str, by: str, profile: str | None) -> None:
        if self.action is not None:
            raise self._busy()
        self._clear_crash_loop()  # someone acted: the crash loop is acknowledged
        since = now_ms()
        expected_s, why = self._expected_s(name, profile)
        self.action = {"action": name, "profile": profile, "since_ms": since, "by": by,
                       "deadline_ms": since + int(expected_s * 1000), "deadline_from": why}
        self._action_preemptible = False

    def _run_action(self, coro: Any) -> None:
        async def wrapper() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - report, never kill the agent
                log.exception("action failed")
                self._event(EventKind.ACTION_FAILED, Severity.ERROR,
                            f"{(self.action or {}).get('action')} failed: {exc}")
            finally:
                if asyncio.current_task() is self._action_task:
                    self.action = None
                    self._action_preemptible = False
                    self._action_task = None
                    if self.on_change:
                        self.on_change()

        self._action_task = asyncio.get_running_loop().create_task(wrapper(), name="supervisor-action")

    def _resolve_profile(self, name: str | None) -> Profile:
        name = name or self.profile_name or self.cfg.agent.default_profile or None
        if name is None:
            raise ActionError("no_profile", "no profile given and no current or default profile "
                                            "(name one: lynxtop start PROFILE)", 400)
        prof = self._fresh_profile(name)
        if prof is None:
            known = ", ".join(p.name for p in self.cfg.profiles) or "none configured"
            raise ActionError("unknown_profile", f"unknown profile {name!r} (known: {known})", 404)
        return prof

    def _fresh_profile(self, name: str) -> Profile | None:
        """The profile as the config file says now, so an edit is picked up by the next start or switch."""
        if self.cfg.path is not None:
            try:
                fresh = load_config(str(self.cfg.path), secrets=True)  # the env_file and credentials as now
            except ConfigError as exc:
                raise ActionError("preflight", "the config file has errors; nothing was changed:\n"
                                  + "\n".join(exc.problems), 422, details={"reasons": exc.problems}) from None
            # only the profiles: [agent] settings (socket, database, policy) take effect on an agent restart
            self.cfg = dataclasses.replace(self.cfg, profiles=fresh.profiles, models=fresh.models)
        return self.cfg.profile(name)

    def _preflight_or_raise(self, profile: Profile) -> list[str]:
        problems, warnings = preflight(profile, self.gpus.gpu_info(), self.cfg.models)
        if problems:
            raise ActionError("preflight", f"preflight of profile {profile.name!r} failed: " + "; ".join(problems),
                              422, details={"reasons": problems, "warnings": warnings})
        for w in warnings:
            self._event(EventKind.PREFLIGHT_WARNING, Severity.WARNING, f"profile {profile.name}: {w}")
        return warnings

    # ------------------------------------------------------------------------------------- actions

    async def start(self, profile: str | None, by: str) -> str:
        if self.state in (S.STARTING, S.READY, S.DEGRADED):
            raise ActionError("state", f"serving is already {self.state} (profile {self.profile_name}); "
                                       "use restart or switch", 409)
        if self.state == S.STOPPING or self.action is not None:
            raise self._busy() if self.action else ActionError("state", "serving is stopping; try again", 409)
        prof = self._resolve_profile(profile)
        warnings = self._preflight_or_raise(prof)
        strays = await asyncio.to_thread(procs.runs_started_in, os.path.realpath(self.cfg.agent.run_log_dir))
        if strays:  # a server nobody could adopt still holds the GPUs: a second one would fail or crowd it
            raise ActionError("strays", f"processes of an earlier run are still alive (pids {strays}) and could not "
                                        "be adopted; check them (ps -fp PID) and stop them before starting serving",
                              409, details={"pids": strays})
        taken = await asyncio.to_thread(procs.port_holders, prof.host, prof.port)
        if taken:  # an orphan of a lost state dir, say: refused here, with its pid, not found out at readiness
            raise ActionError("port_in_use", _port_taken(prof, taken), 409,
                              details={"pids": sorted({p for h in taken for p in h.pids}), "port": prof.port})
        self._begin("start", by, prof.name)
        self._event(EventKind.ACTION_START, Severity.INFO, f"start of profile {prof.name} requested by {by}", by=by)
        self._run_action(self._do_start(prof, f"started by {by}", reset_failures=True))
        return f"starting profile {prof.name}" + "".join(f" (warning: {w})" for w in warnings)

    async def stop(self, by: str) -> str:
        if self.state in (S.STOPPED, S.CRASH_LOOP) and self.action is None:
            if self.state == S.CRASH_LOOP:
                self._clear_crash_loop()
                self._set_state(S.STOPPED, f"stopped by {by} (was crash-loop)")
                self._event(EventKind.SERVING_STOPPED, Severity.INFO, f"crash loop acknowledged and cleared by {by}")
                return "serving was in crash-loop; now stopped"
            raise ActionError("state", "serving is already stopped", 409)
        if self.action is not None and (self.action.get("action") == "stop" or not self._action_preemptible):
            raise self._busy()
        # a start/switch only waiting for readiness, or a start or retry waiting for the cluster: abort it
        for old in {t for t in (self._action_task, self._gate_task) if t is not None}:
            old.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await old
        self._clear_switch()  # a switch this stop preempted is not to be finished by a later agent
        self._begin("stop", by, self.profile_name)
        self._event(EventKind.ACTION_STOP, Severity.INFO, f"stop requested by {by}", by=by)
        self._run_action(self._do_stop(f"stopped by {by}", "stopped by operator"))
        return "stopping serving"

    async def restart(self, by: str) -> str:
        if self.action is not None:
            raise self._busy()
        prof = self._resolve_profile(None)
        warnings = self._preflight_or_raise(prof)
        self._begin("restart", by, prof.name)
        self._event(EventKind.ACTION_RESTART, Severity.INFO, f"restart of profile {prof.name} requested by {by}", by=by)
        self._run_action(self._do_restart(prof, f"restarted by {by}"))
        return f"restarting profile {prof.name}" + "".join(f" (warning: {w})" for w in warnings)

    async def switch(self, profile: str, by: str) -> str:
        if self.action is not None:
            raise self._busy()
        prof = self._resolve_profile(profile)
        warnings = self._preflight_or_raise(prof)
        old = self.profile_name
        self._begin("switch", by, prof.name)
        self._save_switch(prof.name, old, by)  # before anything is stopped: an agent killed mid-switch resumes it
        self._event(EventKind.ACTION_SWITCH, Severity.INFO, f"switch from {old} to {prof.name} requested by {by}",
                    by=by, old_profile=old, new_profile=prof.name)
        self._run_action(self._do_switch(prof, old, by))
        return f"switching from {old or '(nothing)'} to {prof.name}" + "".join(f" (warning: {w})" for w in warnings)

    async def _do_start(self, prof: Profile, reason: str, reset_failures: bool) -> bool:
        self._cancel_retry()
        if reset_failures:
            self._failures.reset()
        ok = await self._launch(prof, reason)
        if not ok:
            return False
        return await self._await_outcome()

    async def _do_stop(self, reason: str, end_reason: str) -> None:
        self._cancel_retry()
        await self._stop_current(reason, end_reason)
        self._set_state(S.STOPPED, reason)
        self._event(EventKind.SERVING_STOPPED, Severity.INFO, f"serving stopped ({reason})", with_log=True)

    async def _do_restart(self, prof: Profile, reason: str) -> bool:
        self._cancel_retry()
        await self._stop_current(reason, "restarted")
        self._failures.reset()
        self.restarts += 1
        if not await self._launch(prof, reason):
            return False
        return await self._await_outcome()

    async def _do_switch(self, prof: Profile, old: str | None, by: str) -> None:
        try:
            await self._switch_steps(prof, old, by)
        except asyncio.CancelledError:
            raise  # a stop preempting it drops the intent itself; the agent stopping leaves it for the next one
        except BaseException:
            self._clear_switch()
            raise
        self._clear_switch()

    async def _switch_steps(self, prof: Profile, old: str | None, by: str) -> None:
        self._cancel_retry()
        await self._stop_current(f"switching to {prof.name} (by {by})", f"switched to {prof.name}")
        self._failures.reset()
        ok = await self._launch(prof, f"switched from {old} by {by}")
        ok = ok and await self._await_outcome()
        if ok:
            self._event(EventKind.ACTION_SWITCH_DONE, Severity.INFO,
                        f"switch to {prof.name} done: run {self.run_id} is ready")
        else:
            back = f"; switch back with `lynxtop switch {old}`" if old and old != prof.name else ""
            self._event(EventKind.ACTION_SWITCH_FAILED, Severity.ERROR,
                        f"switch to {prof.name} failed: the new run did not become ready ({self.reason}){back}",
                        old_profile=old, new_profile=prof.name)

    async def _await_outcome(self) -> bool:
        """Hold the action slot until the run is ready or failed; a stop may preempt this wait."""
        if self.run is None:
            return False
        self._action_preemptible = True
        try:
            return bool(await asyncio.shield(self.run.outcome))
        finally:
            self._action_preemptible = False

    # ------------------------------------------------------------------------------------- runs

    async def _await_cluster(self, prof: Profile) -> None:
        """A head starts a Ray profile only once Ray reports the GPUs it needs, saying what is missing meanwhile.

        The wait is not a failure (no backoff, no crash-loop count) and a stop ends it."""
        missing = self.cluster.missing(prof) if self.cluster is not None and prof.uses_ray else None
        if missing is None or self.cluster is None:
            return
        self.profile, self.profile_name = prof, prof.name
        self.next_retry_ms = None
        self._set_state(S.WAITING, missing)
        self._event(EventKind.CLUSTER_WAITING, Severity.WARNING, f"profile {prof.name}: {missing}",
                    gpus_needed=prof.gpus_needed)
        preemptible, self._action_preemptible = self._action_preemptible, True
        self._gate_task = asyncio.current_task()
        try:
            while missing is not None:
                await self.cluster.wait_change(5.0)
                missing = self.cluster.missing(prof)
                if missing is not None and missing != self.reason:
                    self._set_state(S.WAITING, missing)
        finally:
            self._action_preemptible = preemptible
            self._gate_task = None
        self._event(EventKind.CLUSTER_WHOLE, Severity.INFO, f"profile {prof.name}: Ray reports the "
                    f"{prof.gpus_needed} GPUs it needs; starting vLLM")

    async def _launch(self, prof: Profile, reason: str) -> bool:
        """Spawn a new run of `prof` (the GPUs were freed by whoever stopped the previous run)."""
        await self._await_cluster(prof)
        protect = {self.proc.record.log_path} if self.proc is not None else set()
        for old in launcher.prune_logs(self.cfg.agent.run_log_dir, RUN_LOGS_KEPT, protect):
            log.info("removed old run log %s (keeping the newest %d)", old, RUN_LOGS_KEPT)
        spawned = prof
        if self.cluster is not None and prof.uses_ray and "RAY_ADDRESS" not in prof.env:
            # the cluster this agent runs, by name: ray.init("auto") takes whichever Ray started last on the host
            spawned = dataclasses.replace(prof, env={**prof.env, "RAY_ADDRESS": self.cluster.address})
        taken = await asyncio.to_thread(procs.port_holders, prof.host, prof.port)
        if taken:  # every start (restart, switch, retry) checks the port once the previous run is gone
            self.profile, self.profile_name = prof, prof.name
            why = _port_taken(prof, taken)
            self._set_state(S.STOPPED, why)
            self._event(EventKind.SERVING_PORT_IN_USE, Severity.ERROR, f"could not start profile {prof.name}: {why}",
                        pids=sorted({p for h in taken for p in h.pids}), port=prof.port)
            self._resolve_outcome(False)
            return False
        try:
            run = Run.launch(spawned, self.cfg.agent.run_log_dir)
        except OSError as exc:
            argv = prof.argv()
            self.profile, self.profile_name = prof, prof.name
            self._set_state(S.STOPPED, f"could not start {argv[0]}: {exc}")
            self._event(EventKind.SERVING_START_FAILED, Severity.ERROR, f"could not start profile {prof.name}: {exc}",
                        argv=argv)
            self._resolve_outcome(False)
            return False
        proc = run.proc
        self.run = run
        self.profile, self.profile_name = prof, prof.name
        self.next_retry_ms = None
        self._save_record()  # before any await: an agent killed now must still find this server
        # Returns at once: the row waits in the writer's queue while the disk is full (a full disk once held a
        # restart 30 s in "stopping" here and the run was never recorded).
        run.run_id = await self._store_call(
            self.store.create_run, profile=prof.name, argv=proc.record.argv, model=prof.model, host=self.host,
            started_ms=run.started_ms, pid=proc.pid, pid_start_time=proc.record.start_ticks, log_path=run.log_path,
            simulated=self.simulated, flags=prof.flags())
        proc.record.run_id = run.run_id
        self._save_record()
        self._set_state(S.STARTING, reason)
        self._event(EventKind.SERVING_STARTING, Severity.INFO, f"run {run.run_id}: started profile {prof.name} "
                    f"(pid {proc.pid}): {reason}", pid=proc.pid, argv=proc.record.argv, log_path=run.log_path)
        self._check_log()
        self._lifecycle = asyncio.get_running_loop().create_task(self._run_lifecycle(run, prof),
                                                                 name=f"run-{run.run_id}")
        return True

    def _save_record(self) -> None:
        if self.proc is None:
            return
        try:
            launcher.write_record(self.state_path, self.proc.record)
        except OSError as exc:
            if not self._record_unsaved:  # retried until written (a full disk): one event per episode
                self._event(EventKind.AGENT_STATE_FILE, Severity.WARNING, f"cannot write {self.state_path}: {exc}; "
                            "a restarted agent will not be able to adopt this run; retrying until it is written")
            self._record_unsaved = True
            return
        if self._record_unsaved:
            self._record_unsaved = False
            self._event(EventKind.AGENT_STATE_FILE, Severity.INFO, f"{self.state_path} written again: a restarted "
                        "agent can adopt this run")

    def _resave_record(self) -> None:
        """The state file a failed write left stale or missing, written again once the disk takes it."""
        if self._record_unsaved:
            self._save_record()

    async def _run_lifecycle(self, run: Run, prof: Profile) -> None:
        proc = run.proc
        readiness = await self._wait_ready(run, prof)
        if readiness == "ready":
            await self._watch_ready(run)
        if proc.exited and not self._closing:
            await self._on_failure(run, prof, proc.exit or ExitInfo(None, None, known=False), readiness)

    async def _wait_ready(self, run: Run, prof: Profile) -> str:
        proc = run.proc
        # from the run's start, not from now: an adopted server mid-load has already used part of it
        elapsed = max(0.0, (now_ms() - (run.started_ms or now_ms())) / 1000)
        deadline = time.monotonic() + prof.readiness_timeout_s - elapsed
        if run.was_ready:
            # it was ready under the previous agent: its load time is long past the timeout, so one slow or
            # failed /health right after an agent restart would otherwise kill a healthy server
            deadline = float("inf")
        url = server_url(prof)
        probe = HealthProbe(self.http, url, self.health_fail_threshold)
        exit_wait = asyncio.ensure_future(proc.wait())
        told = False
        try:
            while not proc.exited:
                self._poll_phases()
                self._check_log()
                self._resave_record()
                if await probe.ok() and not proc.exited:
                    # inline, once per answered probe (a few ms of /proc reads): in a worker thread each of its
                    # syscalls waited for the GIL behind a busy loop, and readiness came seconds late
                    others = self._others_listening(proc, prof)
                    if not others:
                        await self._on_ready(run, url)
                        return "ready"
                    if not told:  # once per run: it may answer for the whole readiness timeout
                        told = True
                        self._event(EventKind.SERVING_PORT_IN_USE, Severity.ERROR,
                                    f"run {run.run_id}: GET /health on {url} answered, but not from this run: "
                                    f"{'; '.join(h.describe() for h in others)}; not ready until the run's own "
                                    "server answers", pids=sorted({p for h in others for p in h.pids}),
                                    port=prof.port)
                if time.monotonic() >= deadline:
                    await self._readiness_timeout(run, prof)
                    return "timeout"
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(exit_wait), self.health_poll_s)
            self._poll_phases()
            return "exited"
        finally:
            exit_wait.cancel()

    @staticmethod
    def _others_listening(proc: ServerProcess, prof: Profile) -> list[procs.PortHolder]:
        """Who listens on the profile's port when no process of the run does ([]: the run does, or /proc/net
        cannot say): a 200 from /health proves the run is ready only if its own process answered it."""
        ours, holders = procs.listener_is_ours(prof.port, proc.members())
        return holders if ours is False else []

    async def _readiness_timeout(self, run: Run, prof: Profile) -> None:
        why = f"not ready within {prof.readiness_timeout_s:g} s"
        self._event(EventKind.SERVING_READINESS_TIMEOUT, Severity.ERROR,
                    f"run {run.run_id}: {why} (phase: {run.tracker.phase}); stopping it", with_log=True)
        self._set_state(S.STOPPING, why)
        res = await run.proc.stop(prof.stop_grace_s, self.stop_kill_wait_s)
        self._report_stop(run.proc, res, files_in_caller_event=False)
        await self._wait_gpus_released(res.pids, time.monotonic())
        await self._finish_run(run, why)
        await self._count_failure(prof, why)

    def _check_log(self) -> None:
        """A run whose output cannot be written is an event (once per episode), never a reason to stop it."""
        run = self.run
        if run is None:
            return
        problem, was = run.check_log()
        if problem is not None and (was is None or was[0] != problem[0]):
            self._event(EventKind.SERVING_LOG_UNWRITABLE, Severity.WARNING,
                        f"run {run.run_id}: {problem[1]}; serving goes on, its output is lost until this is fixed",
                        log_path=run.log_path)
        elif problem is None and was is not None:
            self._event(EventKind.SERVING_LOG_WRITABLE, Severity.INFO,
                        f"run {run.run_id}: its log {run.log_path} can be written again", log_path=run.log_path)

    def _poll_phases(self) -> None:
        run = self.run
        if run is None:
            return
        for mark in run.new_phases():
            elapsed = (mark.ts_ms - (run.started_ms or mark.ts_ms)) / 1000
            self._event(EventKind.SERVING_PHASE, Severity.INFO,
                        f"run {run.run_id}: {mark.phase} ({elapsed:.0f} s after start)", phase=mark.phase)
            if self.on_change:
                self.on_change()

    async def _on_ready(self, run: Run, url: str) -> None:
        proc = run.proc
        proc.note_files()  # the run's /dev/shm segments exist by now; a later kill of the whole run hides them
        was_ready = run.was_ready
        ready_ms = proc.record.ready_ms if was_ready else now_ms()
        assert ready_ms is not None
        run.ready_ms = ready_ms
        _, body = await self.http.get(url + "/version")  # capped in size (agent/serving/health.py)
        run.vllm_version = version_of(body) or run.vllm_version
        if was_ready:
            self._save_record()  # with the segments seen now
            self._set_state(S.READY, f"adopted run {run.run_id} answers GET /health 200")
            self._event(EventKind.SERVING_READY, Severity.INFO, f"run {run.run_id}: adopted and serving (ready since "
                        f"{_clock(ready_ms)})", adopted=True)
            self._resolve_outcome(True)
            return
        load_s = (ready_ms - (run.started_ms or ready_ms)) / 1000
        gpus = self.gpus.gpu_info() or []
        if run.run_id is not None:
            await self._store_call(self.store.update_run, run.run_id, ready_ms=ready_ms,
                                   vllm_version=run.vllm_version,
                                   gpu_names=sorted({str(g.get("name")) for g in gpus}) or None,
                                   gpu_count=len(gpus) or None)
        proc.record.ready_ms = ready_ms
        self._save_record()
        self._set_state(S.READY, f"GET /health answered 200 after {load_s:.1f} s")
        self._event(EventKind.SERVING_READY, Severity.INFO, f"run {run.run_id}: ready after {load_s:.1f} s "
                    f"(vLLM {run.vllm_version or 'version unknown'})", with_log=True, load_s=load_s)
        self._resolve_outcome(True)

    def _resolve_outcome(self, ok: bool) -> None:
        if self.run is not None:
            self.run.resolve(ok)
        if self._action_preemptible:
            # the action was only waiting for this: free the slot now, so a status that says "ready" never
            # comes with "busy" for the next request (the action task finishes its bookkeeping on its own)
            self.action = None
            self._action_preemptible = False
            if self.on_change:
                self.on_change()

    async def _watch_ready(self, run: Run) -> None:
        """While serving: wait for the exit, probe /health now and then, reset failures after a stable period."""
        proc = run.proc
        probe = HealthProbe(self.http, self.url() or "", self.health_fail_threshold,
                            hang_timeout_s=self.cfg.agent.hang_timeout_s)  # a frozen server is hung too
        stable_at: float | None = time.monotonic() + self.cfg.agent.stable_after_s
        period = max(self.health_poll_s * 5, 1.0)
        exit_wait = asyncio.ensure_future(proc.wait())
        try:
            while not proc.exited:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(exit_wait), period)
                if proc.exited:
                    break
                self._check_log()
                self._resave_record()
                if stable_at is not None and time.monotonic() >= stable_at:
                    self._stable()
                    stable_at = None
                verdict = await probe.probe()
                if verdict is not None and not (verdict.bad and proc.exited):
                    self.on_verdict(verdict)
        finally:
            exit_wait.cancel()

    def _stable(self) -> None:
        if self._failures:
            log.info("run %s stable for %.0f s: failure count reset", self.run_id, self.cfg.agent.stable_after_s)
        self._failures.reset()

    # ------------------------------------------------------------------------------------- health verdicts

    def on_verdict(self, verdict: Verdict) -> None:
        """A verdict on the current run from agent/serving/health.py: hung or unhealthy marks it degraded (and a hang
        restarts it with `restart_on_hang`), healthy again clears that condition."""
        if self.run is None:
            return
        if verdict.condition == "hang" and self.state not in (S.READY, S.DEGRADED):
            return  # counters of a run that is no longer serving (stopping, crashed) say nothing
        if not verdict.bad:
            self._clear_degraded(verdict.condition, verdict.reason)
            return
        self._mark_degraded(verdict.condition, verdict.reason)
        if verdict.health is Health.HUNG and self.cfg.agent.restart_on_hang and self.action is None \
                and self.profile is not None:
            self._begin("restart", "agent (hang detected, restart_on_hang)", self.profile.name)
            self._run_action(self._do_restart(self.profile, "restart after hang (restart_on_hang)"))

    def _mark_degraded(self, key: str, reason: str) -> None:
        assert self.run is not None
        new = self.run.mark_degraded(key, reason)
        if self.state in (S.READY, S.DEGRADED):
            self._set_state(S.DEGRADED, self.run.degraded_reason())
            if new:
                self._event(_DEGRADED[key], Severity.ERROR, f"run {self.run_id}: degraded: {reason}", with_log=True)

    def _clear_degraded(self, key: str, reason: str) -> None:
        assert self.run is not None
        if not self.run.clear_degraded(key):
            return
        if self.state == S.DEGRADED:
            if self.run.degraded:
                self._set_state(S.DEGRADED, self.run.degraded_reason())
            else:
                self._set_state(S.READY, reason)
            self._event(_RECOVERED[key], Severity.INFO, f"run {self.run_id}: {reason}", with_log=True)

    async def _finish_run(self, run: Run, end_reason: str) -> None:
        if run.finished:
            return
        run.finished = True
        ex = run.proc.exit
        if run.run_id is not None:
            await self._store_call(self.store.update_run, run.run_id, ended_ms=now_ms(),
                                   exit_code=ex.exit_code if ex else None, exit_signal=ex.exit_signal if ex else None,
                                   end_reason=end_reason)
        launcher.remove_record(self.state_path)
        run.proc.close()

    async def _on_failure(self, run: Run, prof: Profile, ex: ExitInfo, readiness: str) -> None:
        """An exit nobody asked for: clean up the rest of the tree, then back off or give up."""
        if readiness == "timeout":
            return  # already counted
        when = "before becoming ready" if readiness != "ready" else "while serving"
        reason = f"vLLM {ex.describe()} {when} (not requested by anyone)"
        self.crashes += 1
        run.crash_reason = f"crashed: {reason}"
        self._resolve_outcome(False)
        self._event(EventKind.SERVING_CRASH, Severity.ERROR, f"run {run.run_id}: {reason}", with_log=True,
                    exit_code=ex.exit_code, exit_signal=ex.exit_signal)
        self._set_state(S.STOPPING, f"cleaning up after crash: {reason}")
        res = await run.proc.stop(min(prof.stop_grace_s, 5.0), self.stop_kill_wait_s)
        self._report_stop(run.proc, res, files_in_caller_event=False)
        await self._wait_gpus_released(res.pids, time.monotonic())
        await self._finish_run(run, f"crashed: {reason}")
        await self._count_failure(prof, reason)

    async def _count_failure(self, prof: Profile, reason: str) -> None:
        self._resolve_outcome(False)
        window = self.cfg.agent.crash_loop_window_s
        delay = self._failures.fail()
        if delay is None:
            self.next_retry_ms = None
            msg = (f"crash loop: {len(self._failures)} failures within {window:g} s; not retrying until an "
                   f"operator acts (lynxtop start / restart / switch). Last: {reason}")
            self._set_state(S.CRASH_LOOP, msg)
            self._save_crash_loop(prof.name, msg)
            self._event(EventKind.SERVING_CRASH_LOOP, Severity.CRITICAL, f"profile {prof.name}: {msg}", with_log=True,
                        failures=len(self._failures))
            return
        a = self.cfg.agent
        self.next_retry_ms = now_ms() + int(delay * 1000)
        self._set_state(S.BACKOFF, f"{reason}; retry {self._failures.consecutive} in {delay:.1f} s")
        self._event(EventKind.SERVING_BACKOFF, Severity.WARNING, f"profile {prof.name}: retry in {delay:.1f} s "
                    f"(failure {len(self._failures)} of {a.crash_loop_failures} allowed in {window:g} s)",
                    with_log=True, delay_s=delay, failures=len(self._failures))
        self._retry_task = asyncio.get_running_loop().create_task(self._retry_after(prof, delay), name="retry")

    async def _retry_after(self, prof: Profile, delay: float) -> None:
        await asyncio.sleep(delay)
        if self.action is not None or self.state != S.BACKOFF:
            return
        self._retry_task = None
        # the profile as configured now (an adopted run may have been started with older flags)
        current = self.cfg.profile(prof.name)
        if current is None:
            self.next_retry_ms = None
            self._set_state(S.STOPPED, f"profile {prof.name} is no longer in the config; not restarted")
            self._event(EventKind.SERVING_STOPPED, Severity.ERROR,
                        f"not retrying: profile {prof.name} is no longer in the config")
            return
        self.action = {"action": "retry", "profile": prof.name, "since_ms": now_ms(), "by": "agent (backoff)"}
        try:
            await self._launch(current, f"retry {self._failures.consecutive} after failure")
        finally:
            if self.action and self.action.get("action") == "retry":
                self.action = None

    def _cancel_retry(self) -> None:
        if self._retry_task is not None and self._retry_task is not asyncio.current_task():
            self._retry_task.cancel()
        self._retry_task = None
        self.next_retry_ms = None

    async def _stop_current(self, reason: str, end_reason: str) -> None:
        """Stop the current run, if any, and wait for its GPU memory to be released."""
        run = self.run
        if self._lifecycle is not None and self._lifecycle is not asyncio.current_task():
            self._lifecycle.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._lifecycle
        self._lifecycle = None
        self._resolve_outcome(False)
        if run is None:
            return
        proc = run.proc
        if proc.exited and not proc.members() and run.finished:
            return
        if run.crash_reason and proc.exited:
            end_reason = run.crash_reason  # it crashed before this stop reached it
        grace = self.profile.stop_grace_s if self.profile else _FALLBACK_GRACE_S
        self._set_state(S.STOPPING, reason)
        t0 = time.monotonic()
        res = await proc.stop(grace, self.stop_kill_wait_s)
        files = self._report_stop(proc, res, files_in_caller_event=True)
        self._event(EventKind.SERVING_EXITED, Severity.INFO, f"run {run.run_id}: stopped in "
                    f"{time.monotonic() - t0:.1f} s ({proc.exit.describe() if proc.exit else 'exit unknown'}){files}",
                    with_log=True, pids=res.pids, removed=res.removed, not_removed=res.not_removed)
        await self._wait_gpus_released(res.pids, time.monotonic())
        await self._finish_run(run, end_reason)

    def _report_stop(self, proc: ServerProcess, res: launcher.StopResult, files_in_caller_event: bool) -> str:
        """Events for what a stop met: orphans (named, with the signal each needed), survivors, removed files.

        Returns the sentence about leftover files when the caller puts it in its own event, else ''.
        """
        files = _files_text(res)
        if res.survivors:
            self._event(EventKind.SERVING_UNKILLABLE, Severity.CRITICAL,
                        f"run {self.run_id}: process(es) still alive after SIGKILL: {res.survivors} (uninterruptible "
                        "sleep, e.g. stuck in the GPU driver); their memory stays held until they end",
                        pids=res.survivors)
        if res.orphans:
            how = "was already gone" if res.leader_was_dead else "exited"
            self._event(EventKind.SERVING_ORPHANS, Severity.WARNING,
                        f"run {self.run_id}: the API server (pid {proc.pid}) {how} and left {len(res.orphans)} "
                        f"process(es) of the run behind; stopped: "
                        + ", ".join(o.describe() for o in res.orphans) + files,
                        pids=[o.pid for o in res.orphans], orphans=[dataclasses.asdict(o) for o in res.orphans],
                        removed=res.removed, not_removed=res.not_removed)
            return ""
        if files_in_caller_event or not files:
            return files
        self._event(EventKind.SERVING_CLEANUP, Severity.WARNING if res.not_removed else Severity.INFO,
                    f"run {self.run_id}: leftover files of the run{files}", removed=res.removed,
                    not_removed=res.not_removed)
        return ""

    async def _wait_gpus_released(self, pids: list[int], since: float) -> list[int]:
        """Wait until a GPU sample taken after `since` shows none of `pids`; the event names any that remain."""
        timeout = self.cfg.agent.gpu_release_timeout_s
        deadline = time.monotonic() + timeout
        wanted = set(pids)
        holding: set[int] = set()
        while True:
            view = self.gpus.compute_pids()
            if view is None:
                self._event(EventKind.SERVING_GPU_RELEASE_UNKNOWN, Severity.WARNING,
                            "GPU processes cannot be read (NVML unavailable): GPU memory release not confirmed")
                return []
            ts, on_gpu = view
            holding = wanted & on_gpu
            if ts >= since and not holding:
                return []
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.1)
        if holding:
            self._event(EventKind.SERVING_GPU_RELEASE_TIMEOUT, Severity.ERROR,
                        f"run {self.run_id}: GPU memory still held after {timeout:g} s by pids "
                        f"{sorted(holding)}", pids=sorted(holding))
        return sorted(holding)

    # ------------------------------------------------------------------------------------- crash loop marker

    @property
    def _crash_loop_path(self) -> Path:
        return self.state_path.with_name("crash-loop.json")

    def _save_crash_loop(self, profile: str, reason: str) -> None:
        """A crash loop outlives an agent restart: a new agent must not autostart the same failure again."""
        try:
            marker = {"profile": profile, "reason": reason, "since_ms": now_ms()}
            atomic_write(self._crash_loop_path, json.dumps(marker))
        except OSError as exc:
            log.warning("cannot record the crash loop in %s: %s", self._crash_loop_path, exc)

    def _clear_crash_loop(self) -> None:
        with contextlib.suppress(OSError):
            self._crash_loop_path.unlink()

    def restore_crash_loop(self) -> bool:
        """At agent start, with nothing adopted: resume a crash loop recorded by the previous agent."""
        try:
            data = json.loads(self._crash_loop_path.read_text())
            profile, reason = str(data["profile"]), str(data["reason"])
        except FileNotFoundError:
            return False
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable %s: %s", self._crash_loop_path, exc)
            return False
        self.profile_name = profile
        self.profile = self.cfg.profile(profile)
        self._set_state(S.CRASH_LOOP, f"{reason} (recorded before the agent restarted)")
        self._event(EventKind.SERVING_CRASH_LOOP, Severity.WARNING, f"profile {profile} is still in crash-loop from "
                    "before the agent restarted; not starting it (lynxtop start / restart / switch / stop to act)")
        return True

    # ------------------------------------------------------------------------------------- switch intent

    @property
    def _switch_path(self) -> Path:
        return self.state_path.with_name("switch.json")

    def _save_switch(self, profile: str, old: str | None, by: str) -> None:
        """The target of a switch, on disk until the switch ends: SIGKILL of the agent between stopping the old
        run and starting the new one once lost it (the next agent adopted nothing and autostarted the default)."""
        try:
            atomic_write(self._switch_path, json.dumps({"profile": profile, "from": old, "by": by,
                                                        "since_ms": now_ms()}))
        except OSError as exc:
            self._event(EventKind.AGENT_STATE_FILE, Severity.WARNING, f"cannot write {self._switch_path}: {exc}; "
                        "if the agent dies during this switch, a restarted agent will not finish it")

    def _clear_switch(self) -> None:
        with contextlib.suppress(OSError):
            self._switch_path.unlink()

    async def resume_switch(self) -> bool:
        """At agent start, after adoption: finish a switch the previous agent began and did not end (it was
        killed), saying so in `action.switch.interrupted`. True when serving is taken care of (no autostart)."""
        try:
            data = json.loads(self._switch_path.read_text())
            target, old, by = str(data["profile"]), data.get("from"), str(data.get("by", "?"))
            since = _clock(int(data.get("since_ms") or now_ms()))
        except FileNotFoundError:
            return False
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self._event(EventKind.AGENT_STATE_FILE, Severity.WARNING, f"ignoring unreadable {self._switch_path}: "
                        f"{exc}; an interrupted switch (if any) is not finished")
            self._clear_switch()
            return False
        asked = f"the switch from {old or '(nothing)'} to {target} asked by {by} at {since}"
        details = {"old_profile": old, "new_profile": target, "by": by}
        if self.profile_name == target and self.run is not None and not self.run.finished:
            self._clear_switch()  # the new run had started: adopted, and watched until ready like any other
            self._event(EventKind.ACTION_SWITCH_INTERRUPTED, Severity.WARNING, f"{asked} was interrupted by the "
                        f"agent's end after its new run {self.run_id} started; that run was adopted", resumed=False,
                        **details)
            return True
        self._event(EventKind.ACTION_SWITCH_INTERRUPTED, Severity.WARNING, f"{asked} was interrupted by the "
                    "agent's end before its new run started; finishing it now", resumed=True, **details)
        try:
            await self.switch(target, f"agent (finishing the interrupted switch asked by {by})")
        except ActionError as exc:
            self._clear_switch()
            self._event(EventKind.ACTION_SWITCH_FAILED, Severity.ERROR, f"the interrupted switch to {target} cannot "
                        f"be finished: {exc.message}", old_profile=old, new_profile=target)
            return False
        return True

    # ------------------------------------------------------------------------------------- adoption

    async def adopt_previous(self) -> bool:
        """Adopt the server a previous agent left running (live restore), or clean up after it."""
        record, err = launcher.read_record(self.state_path)
        if err:
            self._event(EventKind.AGENT_STATE_FILE, Severity.WARNING, err)
        if record is None:
            return False
        proc, why = launcher.adopt(record)
        if proc is None:
            await self._not_adopted(record, why or "?")
            return False
        prof = self._adopted_profile(record)
        if record.run_id is not None:
            await self._restore_run_row(record)
        run = self.run = Run.adopt(proc, record)
        self.profile, self.profile_name = prof, record.profile
        self._set_state(S.STARTING, f"adopted run {record.run_id} (pid {record.pid}) from the previous agent")
        self._event(EventKind.SERVING_ADOPTED, Severity.INFO, f"adopted run {record.run_id} (profile "
                    f"{record.profile}, pid {record.pid}) left running by the previous agent: no restart",
                    pid=record.pid)
        self._lifecycle = asyncio.get_running_loop().create_task(self._run_lifecycle(run, prof),
                                                                 name=f"run-{record.run_id}")
        return True

    async def _not_adopted(self, record: launcher.ServerRecord, why: str) -> None:
        """The recorded server is gone or not ours any more: kill what is left of its run and close its row."""
        res = await launcher.kill_leftovers(record)
        extra = (f"; killed {len(res.pids)} leftover process(es) of that run: "
                 + ", ".join(o.describe() for o in res.orphans)) if res.pids else ""
        self._event(EventKind.SERVING_NOT_ADOPTED, Severity.WARNING,
                    f"previous run {record.run_id} (profile {record.profile}) not adopted: {why}{extra}"
                    f"{_files_text(res)}", run_id_prev=record.run_id, pids=res.pids,
                    orphans=[dataclasses.asdict(o) for o in res.orphans], removed=res.removed,
                    not_removed=res.not_removed)
        if res.survivors:
            self._event(EventKind.SERVING_UNKILLABLE, Severity.CRITICAL, f"previous run {record.run_id}: "
                        f"process(es) still alive after SIGKILL: {res.survivors}", pids=res.survivors)
        if record.run_id is not None:
            await self._restore_run_row(record)
            await self._store_call(self.store.update_run, record.run_id, ended_ms=now_ms(),
                                   end_reason=f"lost while the agent was down: {why}")
        launcher.remove_record(self.state_path)

    def _adopted_profile(self, record: launcher.ServerRecord) -> Profile:
        """The profile an adopted server is supervised with: the config's, on the address and readiness timeout
        the server was really started with (a fallback when the profile was removed)."""
        prof = self.cfg.profile(record.profile)
        if prof is None:
            # keep serving; stop and readiness use the recorded argv's host/port defaults
            prof = Profile(name=record.profile, executable=record.argv[0] if record.argv else "?",
                           model=record.argv[2] if len(record.argv) > 2 else "?",
                           stop_grace_s=_FALLBACK_GRACE_S)
            self._event(EventKind.SERVING_ADOPTED_UNKNOWN_PROFILE, Severity.WARNING,
                        f"adopted run {record.run_id} uses profile {record.profile!r}, which is no longer in the "
                        "config; it keeps running")
        elif prof.argv() != record.argv:
            self._event(EventKind.SERVING_ADOPTED_PROFILE_CHANGED, Severity.WARNING,
                        f"profile {record.profile} changed in the config since run {record.run_id} started; the "
                        "adopted server keeps its old flags until it is restarted")
        prof = _with_address_of(prof, record.argv)
        if isinstance(record.readiness_timeout_s, (int, float)) and record.readiness_timeout_s > 0:
            prof = dataclasses.replace(prof, readiness_timeout_s=float(record.readiness_timeout_s))
        return prof

    async def _restore_run_row(self, record: launcher.ServerRecord) -> None:
        """The run's row from serving.json when the history lacks it (the previous agent ended while the disk
        was full, its queued row unwritten); an existing row is left as it is."""
        await self._store_call(
            self.store.create_run, run_id=record.run_id, profile=record.profile, argv=record.argv,
            model=record.argv[2] if len(record.argv) > 2 else None, host=self.host, started_ms=record.started_ms,
            pid=record.pid, pid_start_time=record.start_ticks, log_path=record.log_path, simulated=self.simulated,
            ready_ms=record.ready_ms)

    # ------------------------------------------------------------------------------------- shutdown

    async def shutdown(self, stop_serving: bool) -> None:
        """Agent exit: with live restore the server keeps running (and its record stays for the next agent)."""
        self._cancel_retry()
        if self.action is not None and self.action.get("action") == "stop" and self._action_task is not None:
            # an operator asked to stop serving: finish that rather than leave a half-stopped server behind
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.shield(self._action_task)
        for task in (self._action_task, self._lifecycle if not stop_serving else None):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if stop_serving:
            self._clear_switch()  # serving stops with the agent: nothing is to be switched to
        if stop_serving and self.run is not None and not self.run.finished:
            await self._stop_current("agent shutting down (live_restore off)", "stopped with the agent")
            self._set_state(S.STOPPED, "agent shut down")
        self._closing = True
        if self._lifecycle is not None:
            self._lifecycle.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._lifecycle
        if self.proc is not None:
            self.proc.close()
        if self._own_http:
            await self.http.close()

    # ------------------------------------------------------------------------------------- status

    def vllm_root_pid(self) -> int | None:
        if self.proc is not None and not self.proc.exited:
            return self.proc.pid
        return None

    def serving_status(self) -> ServingStatus:
        run, proc = self.run, self.proc
        alive = self.state.alive
        starting = run is not None and self.state == S.STARTING
        return ServingStatus(
            state=self.state, state_since_ms=self.state_since_ms, reason=self.reason,
            phase=run.tracker.phase if starting else None,  # type: ignore[union-attr]
            phase_since_ms=run.tracker.phase_since_ms if starting else None,  # type: ignore[union-attr]
            phases=tuple(PhaseMark(m.phase, m.ts_ms) for m in run.tracker.marks) if run is not None else (),
            profile=self.profile_name, run_id=self.run_id, pid=proc.pid if proc is not None and alive else None,
            model=self.profile.model if self.profile else None, vllm_version=self.vllm_version,
            started_ms=self.started_ms, ready_ms=self.ready_ms, next_retry_ms=self.next_retry_ms,
            failures_in_window=len(self._failures), adopted=self.adopted, url=self.url(),
            log_problem=run.log_problem[1] if run is not None and run.log_problem and alive else None,
            degraded=tuple(sorted(run.degraded)) if run is not None and self.state == S.DEGRADED else (),
        )

    def action_status(self) -> ActionInfo | None:
        a = self.action
        return ActionInfo(a["action"], a.get("profile"), a.get("since_ms"), a.get("by")) if a else None
