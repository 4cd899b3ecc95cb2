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
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from lynxtop.agent import launcher, procs
from lynxtop.agent.control import ActionError
from lynxtop.agent.launcher import ExitInfo, ServerProcess
from lynxtop.agent.startup import PhaseTracker, tail_lines
from lynxtop.contract.config import Config, ConfigError, Profile, load_config

log = logging.getLogger(__name__)

STATES = ("stopped", "starting", "ready", "degraded", "stopping", "backoff", "crash-loop")
LOG_TAIL_LINES = 20
RUN_LOGS_KEPT = 200  # per-run vLLM logs kept in log_dir (the runs table keeps every run forever)
LOG_SPACE_MIN_BYTES = 1 << 20  # below this on the log's file system, the run's output is being lost
# An adopted server whose profile was removed from the config is stopped with these defaults.
_FALLBACK_GRACE_S = 60.0

# Attention backends and the compute capabilities (major) they run on.
_BACKEND_ARCH = {
    "FLASHMLA": ((9,), "dense FlashMLA runs on SM90 (Hopper: H100/H200/H800/H20) only"),
    "FLASHMLA_SPARSE": ((9, 10), "FlashMLA-sparse runs on SM90 and SM100 (B200/GB200/B300)"),
    "CUTLASS_MLA": ((10,), "CUTLASS MLA runs on SM100 (Blackwell) only"),
}


class EventSink(Protocol):
    """The part of the store writer the supervisor uses (`lynxtop.store.writer.StoreWriter`)."""

    def add_event(self, kind: str, severity: str, message: str, details: dict | None = None,
                  run_id: int | None = None, ts_ms: int | None = None) -> None: ...

    def create_run(self, run_id: int | None = None, **fields: Any) -> int: ...

    def update_run(self, run_id: int, **fields: Any) -> None: ...


class GpuView(Protocol):
    """What the supervisor needs to know about the GPUs (node.py answers from the sampler's latest tick)."""

    def gpu_info(self) -> list[dict[str, Any]] | None:
        """[{index, name, cc_major, cc_minor}], or None when the GPUs cannot be read (NVML down)."""
        ...

    def compute_pids(self) -> tuple[float, set[int]] | None:
        """(monotonic time of the latest sample, pids holding GPU memory), or None when unknown."""
        ...


def now_ms() -> int:
    return int(time.time() * 1000)


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


def preflight(profile: Profile, gpus: list[dict[str, Any]] | None) -> tuple[list[str], list[str]]:
    """(problems that forbid the start, warnings) for starting `profile` on this node."""
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
    needed = profile.tensor_parallel_size * profile.pipeline_parallel_size * profile.data_parallel_size
    if gpus is None:
        warnings.append("GPUs cannot be read (NVML unavailable): GPU count not checked")
    else:
        visible = len(gpus)
        cvd = profile.env.get("CUDA_VISIBLE_DEVICES")
        if cvd is not None:
            visible = min(visible, len([d for d in cvd.split(",") if d.strip()]))
        if visible < needed:
            msg = (f"profile {profile.name} needs {needed} GPUs (tensor {profile.tensor_parallel_size} x "
                   f"pipeline {profile.pipeline_parallel_size} x data {profile.data_parallel_size}); "
                   f"{visible} visible on this node")
            if profile.distributed_executor_backend == "ray":
                warnings.append(msg + "; the rest must come from the Ray cluster")
            else:
                problems.append(msg)
        backend = profile.attention_backend
        if backend in _BACKEND_ARCH and gpus:
            majors, fact = _BACKEND_ARCH[backend]
            bad = sorted({f"{g.get('name', '?')} (SM{g.get('cc_major')}{g.get('cc_minor', 0)})" for g in gpus
                          if g.get("cc_major") is not None and g["cc_major"] not in majors})
            if bad:
                warnings.append(f"attention backend {backend} does not fit {', '.join(bad)}: {fact}")
    return problems, warnings


def _files_text(res: launcher.StopResult) -> str:
    """'; removed ...; not removed ...' for an event message ('' when the run left no files behind)."""
    text = ""
    if res.removed:
        text += f"; removed the run's leftover files: {', '.join(res.removed)}"
    if res.not_removed:
        text += f"; NOT removed: {', '.join(res.not_removed)}"
    return text


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
    def __init__(self, cfg: Config, store: EventSink, gpus: GpuView, *, state_path: Path, host: str,
                 simulated: bool = False, health_poll_s: float = 1.0, health_fail_threshold: int = 3,
                 stop_kill_wait_s: float = 15.0, rng: random.Random | None = None,
                 on_change: Callable[[], None] | None = None):
        self.cfg = cfg
        self.store = store
        self.gpus = gpus
        self.state_path = state_path
        self.host = host
        self.simulated = simulated
        self.health_poll_s = health_poll_s
        self.health_fail_threshold = health_fail_threshold
        self.stop_kill_wait_s = stop_kill_wait_s
        self.rng = rng or random.Random()
        self.on_change = on_change

        self.state = "stopped"
        self.state_since_ms = now_ms()
        self.reason = "agent started"
        self.profile: Profile | None = None
        self.profile_name: str | None = None
        self.proc: ServerProcess | None = None
        self.run_id: int | None = None
        self.tracker: PhaseTracker | None = None
        self.started_ms: int | None = None
        self.ready_ms: int | None = None
        self.vllm_version: str | None = None
        self.adopted = False
        self.next_retry_ms: int | None = None
        self.crashes = 0
        self.restarts = 0
        self._failures: deque[float] = deque()
        self._consecutive = 0
        self._run_finished = True
        self._crash_reason: str | None = None
        self._degraded: dict[str, str] = {}
        self._last_tokens: float | None = None
        self._last_progress: float | None = None
        self._log_problem: tuple[str, str] | None = None  # (kind, message) while the run's log cannot be written

        self.action: dict[str, Any] | None = None
        self._action_preemptible = False
        self._action_task: asyncio.Task | None = None
        self._lifecycle: asyncio.Task | None = None
        self._retry_task: asyncio.Task | None = None
        self._outcome: asyncio.Future | None = None
        self._session: aiohttp.ClientSession | None = None
        self._closing = False

    # ------------------------------------------------------------------------------------- helpers

    def _set_state(self, state: str, reason: str) -> None:
        assert state in STATES, state
        if state != self.state or reason != self.reason:
            log.info("serving: %s -> %s (%s)", self.state, state, reason)
        if state != self.state:
            self.state_since_ms = now_ms()
        self.state = state
        self.reason = reason
        if self.on_change:
            self.on_change()

    def _event(self, kind: str, severity: str, message: str, with_log: bool = False, **details: Any) -> None:
        details.setdefault("state", self.state)
        if with_log and self.proc is not None:
            details["log_tail"] = tail_lines(self.proc.record.log_path, LOG_TAIL_LINES)
            details["log_path"] = self.proc.record.log_path
        try:
            self.store.add_event(kind, severity, message, details=details, run_id=self.run_id)
        except Exception:  # noqa: BLE001 - the history store failing must not stop supervision
            log.exception("could not record event %s: %s", kind, message)
        log.log(logging.ERROR if severity in ("error", "critical") else logging.INFO, "%s: %s", kind, message)

    async def _store_call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - serving does not depend on the history store
            log.error("history store call %s failed: %s", getattr(fn, "__name__", fn), exc)
            return None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3.0))
        return self._session

    async def _get(self, url: str) -> tuple[int | None, Any]:
        try:
            async with self._http().get(url) as resp:
                body: Any = None
                if resp.content_type == "application/json":
                    with contextlib.suppress(ValueError, aiohttp.ContentTypeError):
                        body = await resp.json()
                return resp.status, body
        except (TimeoutError, aiohttp.ClientError, OSError):
            return None, None

    def url(self) -> str | None:
        return server_url(self.profile) if self.profile else None

    def _busy(self) -> ActionError:
        a = self.action or {}
        what = a.get("action", "?") + (f" to {a['profile']!r}" if a.get("profile") else "")
        return ActionError("busy", f"busy: {what} in progress since {_clock(a.get('since_ms', now_ms()))} "
                                   f"(by {a.get('by', '?')})", 409, details={"action": a})

    def _begin(self, name: str, by: str, profile: str | None) -> None:
        if self.action is not None:
            raise self._busy()
        self._clear_crash_loop()  # someone acted: the crash loop is acknowledged
        self.action = {"action": name, "profile": profile, "since_ms": now_ms(), "by": by}
        self._action_preemptible = False

    def _run_action(self, coro: Any) -> None:
        async def wrapper() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - report, never kill the agent
                log.exception("action failed")
                self._event("action.failed", "error", f"{(self.action or {}).get('action')} failed: {exc}")
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
                fresh = load_config(str(self.cfg.path))
            except ConfigError as exc:
                raise ActionError("preflight", "the config file has errors; nothing was changed:\n"
                                  + "\n".join(exc.problems), 422, details={"reasons": exc.problems}) from None
            # only the profiles: [agent] settings (socket, database, policy) take effect on an agent restart
            self.cfg = dataclasses.replace(self.cfg, profiles=fresh.profiles)
        return self.cfg.profile(name)

    def _preflight_or_raise(self, profile: Profile) -> list[str]:
        problems, warnings = preflight(profile, self.gpus.gpu_info())
        if problems:
            raise ActionError("preflight", f"preflight of profile {profile.name!r} failed: " + "; ".join(problems),
                              422, details={"reasons": problems, "warnings": warnings})
        for w in warnings:
            self._event("preflight.warning", "warning", f"profile {profile.name}: {w}")
        return warnings

    # ------------------------------------------------------------------------------------- actions

    async def start(self, profile: str | None, by: str) -> str:
        if self.state in ("starting", "ready", "degraded"):
            raise ActionError("state", f"serving is already {self.state} (profile {self.profile_name}); "
                                       "use restart or switch", 409)
        if self.state == "stopping" or self.action is not None:
            raise self._busy() if self.action else ActionError("state", "serving is stopping; try again", 409)
        prof = self._resolve_profile(profile)
        warnings = self._preflight_or_raise(prof)
        strays = await asyncio.to_thread(procs.runs_started_in, os.path.realpath(self.cfg.agent.run_log_dir))
        if strays:  # a server nobody could adopt still holds the GPUs: a second one would fail or crowd it
            raise ActionError("strays", f"processes of an earlier run are still alive (pids {strays}) and could not "
                                        "be adopted; check them (ps -fp PID) and stop them before starting serving",
                              409, details={"pids": strays})
        self._begin("start", by, prof.name)
        self._event("action.start", "info", f"start of profile {prof.name} requested by {by}", by=by)
        self._run_action(self._do_start(prof, f"started by {by}", reset_failures=True))
        return f"starting profile {prof.name}" + "".join(f" (warning: {w})" for w in warnings)

    async def stop(self, by: str) -> str:
        if self.state in ("stopped", "crash-loop") and self.action is None:
            if self.state == "crash-loop":
                self._clear_crash_loop()
                self._set_state("stopped", f"stopped by {by} (was crash-loop)")
                self._event("serving.stopped", "info", f"crash loop acknowledged and cleared by {by}")
                return "serving was in crash-loop; now stopped"
            raise ActionError("state", "serving is already stopped", 409)
        if self.action is not None and (self.action.get("action") == "stop" or not self._action_preemptible):
            raise self._busy()
        old = self._action_task
        if old is not None:  # a start/switch that was only waiting for readiness: abort it
            old.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await old
        self._begin("stop", by, self.profile_name)
        self._event("action.stop", "info", f"stop requested by {by}", by=by)
        self._run_action(self._do_stop(f"stopped by {by}", "stopped by operator"))
        return "stopping serving"

    async def restart(self, by: str) -> str:
        if self.action is not None:
            raise self._busy()
        prof = self._resolve_profile(None)
        warnings = self._preflight_or_raise(prof)
        self._begin("restart", by, prof.name)
        self._event("action.restart", "info", f"restart of profile {prof.name} requested by {by}", by=by)
        self._run_action(self._do_restart(prof, f"restarted by {by}"))
        return f"restarting profile {prof.name}" + "".join(f" (warning: {w})" for w in warnings)

    async def switch(self, profile: str, by: str) -> str:
        if self.action is not None:
            raise self._busy()
        prof = self._resolve_profile(profile)
        warnings = self._preflight_or_raise(prof)
        old = self.profile_name
        self._begin("switch", by, prof.name)
        self._event("action.switch", "info", f"switch from {old} to {prof.name} requested by {by}", by=by,
                    old_profile=old, new_profile=prof.name)
        self._run_action(self._do_switch(prof, old, by))
        return f"switching from {old or '(nothing)'} to {prof.name}" + "".join(f" (warning: {w})" for w in warnings)

    async def _do_start(self, prof: Profile, reason: str, reset_failures: bool) -> bool:
        self._cancel_retry()
        if reset_failures:
            self._failures.clear()
            self._consecutive = 0
        ok = await self._launch(prof, reason)
        if not ok:
            return False
        return await self._await_outcome()

    async def _do_stop(self, reason: str, end_reason: str) -> None:
        self._cancel_retry()
        await self._stop_current(reason, end_reason)
        self._set_state("stopped", reason)
        self._event("serving.stopped", "info", f"serving stopped ({reason})", with_log=True)

    async def _do_restart(self, prof: Profile, reason: str) -> bool:
        self._cancel_retry()
        await self._stop_current(reason, "restarted")
        self._failures.clear()
        self._consecutive = 0
        self.restarts += 1
        if not await self._launch(prof, reason):
            return False
        return await self._await_outcome()

    async def _do_switch(self, prof: Profile, old: str | None, by: str) -> None:
        self._cancel_retry()
        await self._stop_current(f"switching to {prof.name} (by {by})", f"switched to {prof.name}")
        self._failures.clear()
        self._consecutive = 0
        ok = await self._launch(prof, f"switched from {old} by {by}")
        ok = ok and await self._await_outcome()
        if ok:
            self._event("action.switch.done", "info", f"switch to {prof.name} done: run {self.run_id} is ready")
        else:
            back = f"; switch back with `lynxtop switch {old}`" if old and old != prof.name else ""
            self._event("action.switch.failed", "error",
                        f"switch to {prof.name} failed: the new run did not become ready ({self.reason}){back}",
                        old_profile=old, new_profile=prof.name)

    async def _await_outcome(self) -> bool:
        """Hold the action slot until the run is ready or failed; a stop may preempt this wait."""
        fut = self._outcome
        if fut is None:
            return False
        self._action_preemptible = True
        try:
            return bool(await asyncio.shield(fut))
        finally:
            self._action_preemptible = False

    # ------------------------------------------------------------------------------------- runs

    async def _launch(self, prof: Profile, reason: str) -> bool:
        """Spawn a new run of `prof` (the GPUs were freed by whoever stopped the previous run)."""
        loop = asyncio.get_running_loop()
        started = now_ms()
        token = launcher.new_token()
        stamp = datetime.fromtimestamp(started / 1000, UTC).strftime("%Y%m%dT%H%M%SZ")
        log_path = self.cfg.agent.run_log_dir / f"{stamp}_{prof.name}_{token[:8]}.log"
        argv = prof.argv()
        protect = {self.proc.record.log_path} if self.proc is not None else set()
        for old in launcher.prune_logs(self.cfg.agent.run_log_dir, RUN_LOGS_KEPT, protect):
            log.info("removed old run log %s (keeping the newest %d)", old, RUN_LOGS_KEPT)
        try:
            proc = launcher.spawn(argv, log_path, prof.env, prof.name, token=token, started_ms=started)
        except OSError as exc:
            self.profile, self.profile_name = prof, prof.name
            self._set_state("stopped", f"could not start {argv[0]}: {exc}")
            self._event("serving.start_failed", "error", f"could not start profile {prof.name}: {exc}",
                        argv=argv)
            self._resolve_outcome(False)
            return False
        self.proc = proc
        self.profile, self.profile_name = prof, prof.name
        self.started_ms, self.ready_ms, self.vllm_version = started, None, None
        self.adopted = False
        self.next_retry_ms = None
        self._degraded.clear()
        self._last_tokens = self._last_progress = None
        self._run_finished = False
        self._crash_reason = None
        self.tracker = PhaseTracker(log_path, started)
        self._outcome = loop.create_future()
        proc.watch(loop)
        self.run_id = None
        proc.record.readiness_timeout_s = prof.readiness_timeout_s
        self._save_record()  # before any await: an agent killed now must still find this server
        # Returns at once: the row waits in the writer's queue while the disk is full (a full disk once held a
        # restart 30 s in "stopping" here and the run was never recorded).
        run_id = await self._store_call(
            self.store.create_run, profile=prof.name, argv=argv, model=prof.model, host=self.host,
            started_ms=started, pid=proc.pid, pid_start_time=proc.record.start_ticks, log_path=str(log_path),
            simulated=self.simulated, flags=prof.flags())
        self.run_id = run_id
        proc.record.run_id = run_id
        self._save_record()
        self._set_state("starting", reason)
        self._event("serving.starting", "info", f"run {run_id}: started profile {prof.name} (pid {proc.pid}): "
                    f"{reason}", pid=proc.pid, argv=argv, log_path=str(log_path))
        self._log_problem = None
        self._check_log()
        self._lifecycle = loop.create_task(self._run_lifecycle(proc, prof), name=f"run-{run_id}")
        return True

    def _save_record(self) -> None:
        if self.proc is None:
            return
        try:
            launcher.write_record(self.state_path, self.proc.record)
        except OSError as exc:
            self._event("agent.state_file", "warning", f"cannot write {self.state_path}: {exc}; "
                        "a restarted agent will not be able to adopt this run")

    async def _run_lifecycle(self, proc: ServerProcess, prof: Profile) -> None:
        readiness = await self._wait_ready(proc, prof)
        if readiness == "ready":
            await self._watch_ready(proc)
        if proc.exited and not self._closing:
            await self._on_failure(proc, prof, proc.exit or ExitInfo(None, None, known=False), readiness)

    async def _wait_ready(self, proc: ServerProcess, prof: Profile) -> str:
        # from the run's start, not from now: an adopted server mid-load has already used part of it
        elapsed = max(0.0, (now_ms() - (self.started_ms or now_ms())) / 1000)
        deadline = time.monotonic() + prof.readiness_timeout_s - elapsed
        if self.adopted and proc.record.ready_ms is not None:
            # it was ready under the previous agent: its load time is long past the timeout, so one slow or
            # failed /health right after an agent restart would otherwise kill a healthy server
            deadline = float("inf")
        url = server_url(prof)
        exit_wait = asyncio.ensure_future(proc.wait())
        try:
            while not proc.exited:
                self._poll_phases()
                self._check_log()
                status, _ = await self._get(url + "/health")
                if status == 200 and not proc.exited:
                    await self._on_ready(proc, prof, url)
                    return "ready"
                if time.monotonic() >= deadline:
                    self._event("serving.readiness_timeout", "error",
                                f"run {self.run_id}: not ready within {prof.readiness_timeout_s:g} s "
                                f"(phase: {self.tracker.phase if self.tracker else '?'}); stopping it",
                                with_log=True)
                    self._set_state("stopping", f"not ready within {prof.readiness_timeout_s:g} s")
                    res = await proc.stop(prof.stop_grace_s, self.stop_kill_wait_s)
                    self._report_stop(proc, res, files_in_caller_event=False)
                    await self._wait_gpus_released(res.pids, time.monotonic())
                    await self._finish_run(proc, f"not ready within {prof.readiness_timeout_s:g} s")
                    await self._count_failure(prof, f"not ready within {prof.readiness_timeout_s:g} s")
                    return "timeout"
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(exit_wait), self.health_poll_s)
            self._poll_phases()
            return "exited"
        finally:
            exit_wait.cancel()

    def _check_log(self) -> None:
        """A run whose output cannot be written is an event (once per episode), never a reason to stop it."""
        proc = self.proc
        if proc is None:
            return
        problem: tuple[str, str] | None = None
        path = Path(proc.record.log_path)
        if proc.log_error:
            problem = ("create", proc.log_error)
        else:
            try:
                st = os.statvfs(path.parent)
                free = (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize
                if free < LOG_SPACE_MIN_BYTES:
                    problem = ("space", f"the file system of the run's log {path} is full ({free} bytes free)")
            except OSError as exc:
                problem = ("stat", f"cannot check the run's log {path}: {exc.strerror or exc}")
        was = self._log_problem
        if problem is not None and (was is None or was[0] != problem[0]):
            self._event("serving.log_unwritable", "warning",
                        f"run {self.run_id}: {problem[1]}; serving goes on, its output is lost until this is fixed",
                        log_path=str(path))
        elif problem is None and was is not None:
            self._event("serving.log_writable", "info", f"run {self.run_id}: its log {path} can be written again",
                        log_path=str(path))
        self._log_problem = problem

    def _poll_phases(self) -> None:
        if self.tracker is None:
            return
        for mark in self.tracker.poll(now_ms()):
            elapsed = (mark.ts_ms - (self.started_ms or mark.ts_ms)) / 1000
            self._event("serving.phase", "info", f"run {self.run_id}: {mark.phase} ({elapsed:.0f} s after start)",
                        phase=mark.phase)
            if self.on_change:
                self.on_change()

    async def _on_ready(self, proc: ServerProcess, prof: Profile, url: str) -> None:
        proc.note_files()  # the run's /dev/shm segments exist by now; a later kill of the whole run hides them
        was_ready = self.adopted and proc.record.ready_ms is not None
        self.ready_ms = proc.record.ready_ms if was_ready else now_ms()
        assert self.ready_ms is not None
        _, body = await self._get(url + "/version")
        if isinstance(body, dict) and isinstance(body.get("version"), str):
            self.vllm_version = body["version"]
        load_s = (self.ready_ms - (self.started_ms or self.ready_ms)) / 1000
        gpus = self.gpus.gpu_info() or []
        if was_ready:
            self._save_record()  # with the segments seen now
            self._set_state("ready", f"adopted run {self.run_id} answers GET /health 200")
            self._event("serving.ready", "info", f"run {self.run_id}: adopted and serving (ready since "
                        f"{_clock(self.ready_ms)})", adopted=True)
            self._resolve_outcome(True)
            return
        if self.run_id is not None:
            await self._store_call(self.store.update_run, self.run_id, ready_ms=self.ready_ms,
                                   vllm_version=self.vllm_version,
                                   gpu_names=sorted({str(g.get("name")) for g in gpus}) or None,
                                   gpu_count=len(gpus) or None)
        proc.record.ready_ms = self.ready_ms
        self._save_record()
        self._set_state("ready", f"GET /health answered 200 after {load_s:.1f} s")
        self._event("serving.ready", "info", f"run {self.run_id}: ready after {load_s:.1f} s "
                    f"(vLLM {self.vllm_version or 'version unknown'})", with_log=True, load_s=load_s)
        self._resolve_outcome(True)

    def _resolve_outcome(self, ok: bool) -> None:
        if self._outcome is not None and not self._outcome.done():
            self._outcome.set_result(ok)
        if self._action_preemptible:
            # the action was only waiting for this: free the slot now, so a status that says "ready" never
            # comes with "busy" for the next request (the action task finishes its bookkeeping on its own)
            self.action = None
            self._action_preemptible = False
            if self.on_change:
                self.on_change()

    async def _watch_ready(self, proc: ServerProcess) -> None:
        """While serving: wait for the exit, probe /health now and then, reset failures after a stable period."""
        url = self.url() or ""
        stable_at = time.monotonic() + self.cfg.agent.stable_after_s
        fails = 0
        period = max(self.health_poll_s * 5, 1.0)
        exit_wait = asyncio.ensure_future(proc.wait())
        try:
            while not proc.exited:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(exit_wait), period)
                if proc.exited:
                    break
                self._check_log()
                if stable_at is not None and time.monotonic() >= stable_at:
                    if self._consecutive or self._failures:
                        log.info("run %s stable for %.0f s: failure count reset", self.run_id,
                                 self.cfg.agent.stable_after_s)
                    self._failures.clear()
                    self._consecutive = 0
                    stable_at = None
                status, _ = await self._get(url + "/health")
                if status == 200:
                    fails = 0
                    self._clear_degraded("health", "GET /health answers 200 again")
                else:
                    fails += 1
                    if fails >= self.health_fail_threshold and not proc.exited:
                        what = f"HTTP {status}" if status else "no answer"
                        self._mark_degraded("health", f"GET /health failing ({what}, {fails} times in a row)")
        finally:
            exit_wait.cancel()

    def _mark_degraded(self, key: str, reason: str) -> None:
        new = key not in self._degraded
        self._degraded[key] = reason
        if self.state in ("ready", "degraded"):
            self._set_state("degraded", "; ".join(self._degraded.values()))
            if new:
                self._event(f"serving.degraded.{key}", "error", f"run {self.run_id}: degraded: {reason}",
                            with_log=True)

    def _clear_degraded(self, key: str, reason: str) -> None:
        if self._degraded.pop(key, None) is None:
            return
        if self.state == "degraded":
            if self._degraded:
                self._set_state("degraded", "; ".join(self._degraded.values()))
            else:
                self._set_state("ready", reason)
            self._event(f"serving.recovered.{key}", "info", f"run {self.run_id}: {reason}", with_log=True)

    async def _finish_run(self, proc: ServerProcess, end_reason: str) -> None:
        if self._run_finished:
            return
        self._run_finished = True
        ex = proc.exit
        if self.run_id is not None:
            await self._store_call(self.store.update_run, self.run_id, ended_ms=now_ms(),
                                   exit_code=ex.exit_code if ex else None, exit_signal=ex.exit_signal if ex else None,
                                   end_reason=end_reason)
        launcher.remove_record(self.state_path)
        proc.close()

    async def _on_failure(self, proc: ServerProcess, prof: Profile, ex: ExitInfo, readiness: str) -> None:
        """An exit nobody asked for: clean up the rest of the tree, then back off or give up."""
        if readiness == "timeout":
            return  # already counted
        when = "before becoming ready" if readiness != "ready" else "while serving"
        reason = f"vLLM {ex.describe()} {when} (not requested by anyone)"
        self.crashes += 1
        self._crash_reason = f"crashed: {reason}"
        self._resolve_outcome(False)
        self._event("serving.crash", "error", f"run {self.run_id}: {reason}", with_log=True,
                    exit_code=ex.exit_code, exit_signal=ex.exit_signal)
        self._set_state("stopping", f"cleaning up after crash: {reason}")
        res = await proc.stop(min(prof.stop_grace_s, 5.0), self.stop_kill_wait_s)
        self._report_stop(proc, res, files_in_caller_event=False)
        await self._wait_gpus_released(res.pids, time.monotonic())
        await self._finish_run(proc, f"crashed: {reason}")
        await self._count_failure(prof, reason)

    async def _count_failure(self, prof: Profile, reason: str) -> None:
        self._resolve_outcome(False)
        now = time.monotonic()
        window = self.cfg.agent.crash_loop_window_s
        self._failures.append(now)
        while self._failures and now - self._failures[0] > window:
            self._failures.popleft()
        self._consecutive += 1
        if len(self._failures) >= self.cfg.agent.crash_loop_failures:
            self.next_retry_ms = None
            msg = (f"crash loop: {len(self._failures)} failures within {window:g} s; not retrying until an "
                   f"operator acts (lynxtop start / restart / switch). Last: {reason}")
            self._set_state("crash-loop", msg)
            self._save_crash_loop(prof.name, msg)
            self._event("serving.crash_loop", "critical", f"profile {prof.name}: {msg}", with_log=True,
                        failures=len(self._failures))
            return
        a = self.cfg.agent
        base = min(a.backoff_initial_s * 2 ** (self._consecutive - 1), a.backoff_max_s)
        delay = min(base * self.rng.uniform(0.8, 1.2), a.backoff_max_s)
        self.next_retry_ms = now_ms() + int(delay * 1000)
        self._set_state("backoff", f"{reason}; retry {self._consecutive} in {delay:.1f} s")
        self._event("serving.backoff", "warning", f"profile {prof.name}: retry in {delay:.1f} s "
                    f"(failure {len(self._failures)} of {a.crash_loop_failures} allowed in {window:g} s)",
                    with_log=True, delay_s=delay, failures=len(self._failures))
        self._retry_task = asyncio.get_running_loop().create_task(self._retry_after(prof, delay), name="retry")

    async def _retry_after(self, prof: Profile, delay: float) -> None:
        await asyncio.sleep(delay)
        if self.action is not None or self.state != "backoff":
            return
        self._retry_task = None
        # the profile as configured now (an adopted run may have been started with older flags)
        current = self.cfg.profile(prof.name)
        if current is None:
            self.next_retry_ms = None
            self._set_state("stopped", f"profile {prof.name} is no longer in the config; not restarted")
            self._event("serving.stopped", "error", f"not retrying: profile {prof.name} is no longer in the config")
            return
        self.action = {"action": "retry", "profile": prof.name, "since_ms": now_ms(), "by": "agent (backoff)"}
        try:
            await self._launch(current, f"retry {self._consecutive} after failure")
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
        proc = self.proc
        if self._lifecycle is not None and self._lifecycle is not asyncio.current_task():
            self._lifecycle.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._lifecycle
        self._lifecycle = None
        self._resolve_outcome(False)
        if proc is None:
            return
        if proc.exited and not proc.members() and self._run_finished:
            return
        if self._crash_reason and proc.exited:
            end_reason = self._crash_reason  # it crashed before this stop reached it
        grace = self.profile.stop_grace_s if self.profile else _FALLBACK_GRACE_S
        self._set_state("stopping", reason)
        t0 = time.monotonic()
        res = await proc.stop(grace, self.stop_kill_wait_s)
        files = self._report_stop(proc, res, files_in_caller_event=True)
        self._event("serving.exited", "info", f"run {self.run_id}: stopped in {time.monotonic() - t0:.1f} s "
                    f"({proc.exit.describe() if proc.exit else 'exit unknown'}){files}", with_log=True,
                    pids=res.pids, removed=res.removed, not_removed=res.not_removed)
        await self._wait_gpus_released(res.pids, time.monotonic())
        await self._finish_run(proc, end_reason)

    def _report_stop(self, proc: ServerProcess, res: launcher.StopResult, files_in_caller_event: bool) -> str:
        """Events for what a stop met: orphans (named, with the signal each needed), survivors, removed files.

        Returns the sentence about leftover files when the caller puts it in its own event, else ''.
        """
        files = _files_text(res)
        if res.survivors:
            self._event("serving.unkillable", "critical",
                        f"run {self.run_id}: process(es) still alive after SIGKILL: {res.survivors} (uninterruptible "
                        "sleep, e.g. stuck in the GPU driver); their memory stays held until they end",
                        pids=res.survivors)
        if res.orphans:
            how = "was already gone" if res.leader_was_dead else "exited"
            self._event("serving.orphans", "warning",
                        f"run {self.run_id}: the API server (pid {proc.pid}) {how} and left {len(res.orphans)} "
                        f"process(es) of the run behind; stopped: "
                        + ", ".join(o.describe() for o in res.orphans) + files,
                        pids=[o.pid for o in res.orphans], orphans=[dataclasses.asdict(o) for o in res.orphans],
                        removed=res.removed, not_removed=res.not_removed)
            return ""
        if files_in_caller_event or not files:
            return files
        self._event("serving.cleanup", "warning" if res.not_removed else "info",
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
                self._event("serving.gpu_release_unknown", "warning",
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
            self._event("serving.gpu_release_timeout", "error",
                        f"run {self.run_id}: GPU memory still held after {timeout:g} s by pids "
                        f"{sorted(holding)}", pids=sorted(holding))
        return sorted(holding)

    # ------------------------------------------------------------------------------------- hang

    def observe_progress(self, requests_running: float | None, generation_tokens_total: float | None,
                         now: float | None = None) -> None:
        """Called every tick with the scraper's counters: running requests but no new token = hang."""
        if self.state not in ("ready", "degraded"):
            return
        if requests_running is None or generation_tokens_total is None:
            # a gap in the readings (/metrics down) is not a stall: the clock restarts when they come back, or
            # the first request after a long idle outage would look hung at once (and be restarted, if enabled)
            self._last_tokens = self._last_progress = None
            return
        now = time.monotonic() if now is None else now
        if self._last_tokens is None or generation_tokens_total != self._last_tokens or requests_running <= 0:
            self._last_tokens = generation_tokens_total
            self._last_progress = now
            self._clear_degraded("hang", "tokens are being generated again")
            return
        stalled = now - (self._last_progress if self._last_progress is not None else now)
        timeout = self.cfg.agent.hang_timeout_s
        if stalled >= timeout and "hang" not in self._degraded:
            self._mark_degraded("hang", f"hang: {requests_running:g} requests running and no token generated "
                                        f"for {stalled:.0f} s")
            if self.cfg.agent.restart_on_hang and self.action is None and self.profile is not None:
                self._begin("restart", "agent (hang detected, restart_on_hang)", self.profile.name)
                self._run_action(self._do_restart(self.profile, "restart after hang (restart_on_hang)"))

    # ------------------------------------------------------------------------------------- crash loop marker

    @property
    def _crash_loop_path(self) -> Path:
        return self.state_path.with_name("crash-loop.json")

    def _save_crash_loop(self, profile: str, reason: str) -> None:
        """A crash loop outlives an agent restart: a new agent must not autostart the same failure again."""
        try:
            tmp = self._crash_loop_path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"profile": profile, "reason": reason, "since_ms": now_ms()}))
            os.replace(tmp, self._crash_loop_path)
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
        self._set_state("crash-loop", f"{reason} (recorded before the agent restarted)")
        self._event("serving.crash_loop", "warning", f"profile {profile} is still in crash-loop from before the agent "
                    "restarted; not starting it (lynxtop start / restart / switch / stop to act)")
        return True

    # ------------------------------------------------------------------------------------- adoption

    async def adopt_previous(self) -> bool:
        """Adopt the server a previous agent left running (live restore), or clean up after it."""
        record, err = launcher.read_record(self.state_path)
        if err:
            self._event("agent.state_file", "warning", err)
        if record is None:
            return False
        proc, why = launcher.adopt(record)
        if proc is None:
            res = await launcher.kill_leftovers(record)
            extra = (f"; killed {len(res.pids)} leftover process(es) of that run: "
                     + ", ".join(o.describe() for o in res.orphans)) if res.pids else ""
            self._event("serving.not_adopted", "warning",
                        f"previous run {record.run_id} (profile {record.profile}) not adopted: {why}{extra}"
                        f"{_files_text(res)}", run_id_prev=record.run_id, pids=res.pids,
                        orphans=[dataclasses.asdict(o) for o in res.orphans], removed=res.removed,
                        not_removed=res.not_removed)
            if res.survivors:
                self._event("serving.unkillable", "critical", f"previous run {record.run_id}: process(es) still "
                            f"alive after SIGKILL: {res.survivors}", pids=res.survivors)
            if record.run_id is not None:
                await self._restore_run_row(record)
                await self._store_call(self.store.update_run, record.run_id, ended_ms=now_ms(),
                                       end_reason=f"lost while the agent was down: {why}")
            launcher.remove_record(self.state_path)
            return False
        loop = asyncio.get_running_loop()
        prof = self.cfg.profile(record.profile)
        if prof is None:
            # keep serving; stop and readiness use the recorded argv's host/port defaults
            prof = Profile(name=record.profile, executable=record.argv[0] if record.argv else "?",
                           model=record.argv[2] if len(record.argv) > 2 else "?",
                           stop_grace_s=_FALLBACK_GRACE_S)
            self._event("serving.adopted_unknown_profile", "warning",
                        f"adopted run {record.run_id} uses profile {record.profile!r}, which is no longer in the "
                        "config; it keeps running")
        elif prof.argv() != record.argv:
            self._event("serving.adopted_profile_changed", "warning",
                        f"profile {record.profile} changed in the config since run {record.run_id} started; the "
                        "adopted server keeps its old flags until it is restarted")
        prof = _with_address_of(prof, record.argv)
        if isinstance(record.readiness_timeout_s, (int, float)) and record.readiness_timeout_s > 0:
            prof = dataclasses.replace(prof, readiness_timeout_s=float(record.readiness_timeout_s))
        if record.run_id is not None:
            await self._restore_run_row(record)
        self.proc = proc
        self.profile, self.profile_name = prof, record.profile
        self.run_id = record.run_id
        self.started_ms = record.started_ms
        self.ready_ms = record.ready_ms
        self.adopted = True
        self._run_finished = False
        self._crash_reason = None
        self.tracker = PhaseTracker(record.log_path, record.started_ms)
        self.tracker.poll(now_ms())  # catch up silently: those phases were reported by the previous agent
        self._outcome = loop.create_future()
        proc.watch(loop)
        self._set_state("starting", f"adopted run {record.run_id} (pid {record.pid}) from the previous agent")
        self._event("serving.adopted", "info", f"adopted run {record.run_id} (profile {record.profile}, pid "
                    f"{record.pid}) left running by the previous agent: no restart", pid=record.pid)
        self._lifecycle = loop.create_task(self._run_lifecycle(proc, prof), name=f"run-{record.run_id}")
        return True

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
        if stop_serving and self.proc is not None and not self._run_finished:
            await self._stop_current("agent shutting down (live_restore off)", "stopped with the agent")
            self._set_state("stopped", "agent shut down")
        self._closing = True
        if self._lifecycle is not None:
            self._lifecycle.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._lifecycle
        if self.proc is not None:
            self.proc.close()
        if self._session is not None:
            await self._session.close()

    # ------------------------------------------------------------------------------------- status

    def vllm_root_pid(self) -> int | None:
        if self.proc is not None and not self.proc.exited:
            return self.proc.pid
        return None

    def serving_status(self) -> dict[str, Any]:
        t = self.tracker
        running = self.state in ("starting", "ready", "degraded", "stopping")
        return {
            "state": self.state,
            "state_since_ms": self.state_since_ms,
            "reason": self.reason,
            "phase": t.phase if t is not None and self.state == "starting" else None,
            "phase_since_ms": t.phase_since_ms if t is not None and self.state == "starting" else None,
            "phases": [{"phase": m.phase, "ts_ms": m.ts_ms} for m in t.marks] if t is not None else [],
            "profile": self.profile_name,
            "run_id": self.run_id,
            "pid": self.proc.pid if self.proc is not None and running else None,
            "model": self.profile.model if self.profile else None,
            "vllm_version": self.vllm_version,
            "started_ms": self.started_ms,
            "ready_ms": self.ready_ms,
            "next_retry_ms": self.next_retry_ms,
            "failures_in_window": len(self._failures),
            "adopted": self.adopted,
            "url": self.url(),
            "log_problem": self._log_problem[1] if self._log_problem and running else None,
        }

    def action_status(self) -> dict[str, Any] | None:
        return dict(self.action) if self.action else None
