"""This node's Ray, on the head and worker roles: `ray start --block`, supervised like vLLM is.

`--block` keeps one process in the foreground for as long as the node's Ray runs: it exits when any Ray process
of the node dies (a killed raylet ends it), and on SIGTERM it drains the node and stops every Ray process (measured
with Ray 2.60). So the agent spawns it as it spawns vLLM (own session, log file, pidfd; `launcher`), restarts it
with the same backoff and crash-loop rules (`backoff.FailureWindow`), and adopts it after an agent restart (live
restore) from its own record file. An operator's stop is remembered in a marker file, so a restarted agent does
not bring back a Ray that was stopped on purpose (`lynxtop stop --cluster` on the head stops workers this way).

Ray's processes inherit LYNXTOP_SOCKET: a task that Ray runs on this node can reach this agent (cluster stop).

Ray's temporary directory (its session: raylet and plasma sockets, logs) is `<database dir>/rt` (RAY_TMPDIR), not
Ray's default /tmp/ray: under systemd /tmp is the unit's private one (PrivateTmp=yes), removed when the unit stops
while Ray keeps running (KillMode=process, live restore), and new at each start; the next vLLM could not open the
socket paths the GCS hands it. The directory is made like a run's TMPDIR (runtmp: 0700, the agent's, never through
a symlink) but kept: every Ray of the node reuses it, and only session directories beyond the newest few, of Rays
that are gone, are removed before a start. `[ray] temp_dir`, or RAY_TMPDIR / TMPDIR in `[ray] env` (or RAY_TMPDIR
in the agent's own environment), keep Ray's own choice. On a worker Ray uses the head's temp_dir (from the GCS), so
both nodes need the same database directory path; the worker's agent makes it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lynxtop.agent.api.control import ActionError
from lynxtop.agent.serving import launcher, procs, runtmp
from lynxtop.agent.serving.backoff import FailureWindow
from lynxtop.agent.serving.failures import os_refusal
from lynxtop.agent.serving.launcher import ServerProcess
from lynxtop.agent.serving.run import now_ms
from lynxtop.agent.serving.startup import tail_lines
from lynxtop.agent.serving.statefiles import Marker
from lynxtop.contract.config import Config, ray_executable
from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.contract.files import atomic_write
from lynxtop.contract.redact import redact_argv
from lynxtop.contract.status import RayState
from lynxtop.contract.terminal import terminal_safe

log = logging.getLogger(__name__)

SOCKET_ENV = "LYNXTOP_SOCKET"
RAY_LOGS_KEPT = 10
# what `ray start` prints once the node's processes are up (both roles, Ray 2.x)
STARTED_LINE = "Ray runtime started."
START_TIMEOUT_S = 180.0  # a worker retries the head for a while before it gives up by itself
LOG_TAIL_LINES = 20
NOT_UP_TAIL_LINES = 10  # of Ray's log in the "not up" warning, each escaped and cut to LINE_CUT characters
LINE_CUT = 240
TMP_NAME = "rt"  # <database dir>/rt: short, for Ray's socket paths (runtmp.MAX_LEN)
SESSIONS_KEPT = 5  # Ray's session directories kept in it, the newest; more only while their process lives
SESSION = re.compile(r"session_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d{6}_(\d+)")  # Ray 2.x: date, µs, pid of `ray start`


def ray_argv(cfg: Config) -> list[str]:
    """The exact argv of `ray start` for this node's role; no shell ever sees it."""
    r = cfg.ray
    exe, _ = ray_executable(r)
    argv = [exe, "start", "--block", "--disable-usage-stats"]
    if cfg.agent.role == "head":
        # the state API the head's agent reads is served by the dashboard: on loopback only
        argv += ["--head", "--port", str(r.port), "--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
                 "--dashboard-port", str(r.dashboard_port)]
    else:
        argv += ["--address", r.head_address]
    if r.node_ip_address:
        argv += ["--node-ip-address", r.node_ip_address]
    if r.num_gpus is not None:
        argv += ["--num-gpus", str(r.num_gpus)]
    if r.num_cpus is not None:
        argv += ["--num-cpus", str(r.num_cpus)]
    if r.temp_dir is not None:
        argv += ["--temp-dir", str(r.temp_dir)]
    return argv + list(r.extra_args)


# `ray start` options with a value, as ray_argv writes them, and the setting each comes from (RAY_OWNED_FLAGS)
_VALUED = {"--address": "ray.head_address", "--port": "ray.port", "--node-ip-address": "ray.node_ip_address",
           "--num-gpus": "ray.num_gpus", "--num-cpus": "ray.num_cpus", "--dashboard-port": "ray.dashboard_port",
           "--temp-dir": "ray.temp_dir", "--dashboard-host": "--dashboard-host",
           "--include-dashboard": "--include-dashboard"}
_SWITCHES = {"--head": "agent.role", "--block": "--block", "--disable-usage-stats": "--disable-usage-stats"}


def argv_settings(argv: list[str]) -> dict[str, str]:
    """The settings an argv of `ray start` was made from, by name (`ray.port`: "6379"; `agent.role`: "head" or
    "worker"; `ray.extra_args`: the rest, as written, secrets masked): to tell what an adopted Ray was started
    with apart from what the config says now. `--flag=value` is read as `--flag value`; the last one counts."""
    out: dict[str, str] = {"ray.executable": argv[0] if argv else "", "agent.role": "worker"}
    extra: list[str] = []
    words = list(argv[2:] if argv[1:2] == ["start"] else argv[1:])
    i = 0
    while i < len(words):
        word = words[i]
        name, eq, value = word.partition("=")
        if name in _VALUED:
            if not eq:
                i += 1
                value = words[i] if i < len(words) else ""
            out[_VALUED[name]] = value
        elif word in _SWITCHES:
            if word == "--head":
                out["agent.role"] = "head"
        else:
            extra.append(word)
        i += 1
    out["ray.extra_args"] = " ".join(redact_argv(extra))
    return out


def settings_address(settings: dict[str, str]) -> str:
    """The GCS address a Ray started with `settings` (argv_settings) serves or joins."""
    if settings.get("agent.role") == "worker":
        return settings.get("ray.head_address", "")
    return f"{settings.get('ray.node_ip_address') or '127.0.0.1'}:{settings.get('ray.port') or '6379'}"


def ray_tmpdir(cfg: Config) -> tuple[str | None, str | None]:
    """RAY_TMPDIR for this node's Ray: (path, None); (None, None) where Ray's own choice is configured; (None, why
    not) where the directory cannot be used, and Ray keeps its default."""
    r = cfg.ray
    if r.temp_dir is not None or "RAY_TMPDIR" in r.env or "TMPDIR" in r.env or "RAY_TMPDIR" in os.environ:
        return None, None
    return runtmp.make_kept(cfg.agent.database.parent / TMP_NAME)


def prune_sessions(tmp_dir: str, keep: int = SESSIONS_KEPT) -> list[str]:
    """Remove Ray's session directories under `tmp_dir`/ray but the newest `keep`: only real directories of the
    agent's user named as Ray names them whose `ray start` process is gone, never through a symlink (fd-based
    rmtree). Called when no Ray of the agent's runs. The names removed."""
    if not shutil.rmtree.avoids_symlink_attacks:
        return []
    try:  # Ray makes it 0777 (try_make_directory_shared): `tmp_dir`, 0700 and the agent's, keeps others out
        fd = os.open(os.path.join(tmp_dir, "ray"), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []  # none yet, or a symlink or file: left alone
    if os.fstat(fd).st_uid != os.geteuid():
        os.close(fd)
        return []
    removed: list[str] = []
    try:
        names = sorted((n for n in os.listdir(fd) if SESSION.fullmatch(n)), reverse=True)  # newest first
        for name in names[keep:]:
            m = SESSION.fullmatch(name)
            assert m is not None
            try:
                st = os.lstat(name, dir_fd=fd)
                if (not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid()
                        or os.path.exists(f"/proc/{int(m.group(1))}")):
                    continue  # a symlink, a file, not ours, or its Ray may live (a reused pid only keeps it)
                shutil.rmtree(name, dir_fd=fd)
                removed.append(name)
            except OSError as exc:
                log.warning("ray: old session %s/ray/%s left: %s", tmp_dir, name, exc.strerror or exc)
    finally:
        os.close(fd)
    return removed


def _cut(text: str, limit: int = LINE_CUT) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _prepare_tmpdir(cfg: Config) -> tuple[str | None, str | None]:
    tmp_dir, why = ray_tmpdir(cfg)
    if tmp_dir is not None:
        for name in prune_sessions(tmp_dir):
            log.info("ray: removed old session directory %s/ray/%s", tmp_dir, name)
    return tmp_dir, why


class RayNode:
    """The state machine of this node's `ray start --block`: stopped, starting, running, backoff, crash-loop."""

    def __init__(self, cfg: Config, record: Callable[[Event], None], *, state_dir: Path,
                 on_change: Callable[[], None] | None = None, start_timeout_s: float = START_TIMEOUT_S):
        self.cfg = cfg
        self._record = record
        self.state_dir = state_dir
        self.on_change = on_change
        self.start_timeout_s = start_timeout_s
        self.state = RayState.STOPPED
        self.reason = "agent started"
        self.since_ms = now_ms()
        self.proc: ServerProcess | None = None
        self.next_retry_ms: int | None = None
        self.failures = FailureWindow(cfg.agent)
        self._watch: asyncio.Task | None = None
        self._retry: asyncio.Task | None = None
        self._stopped: ServerProcess | None = None  # the Ray an operator or the agent stopped: its exit is expected
        self._closing = False
        # what the Ray this agent started or adopted was started with: its address and dashboard port are the
        # ones in use until Ray next starts, whatever the config says now (a [ray] edit before an agent restart)
        self.running_settings: dict[str, str] | None = None

    # ------------------------------------------------------------------------------------- files

    @property
    def record_path(self) -> Path:
        return self.state_dir / "ray.json"

    @property
    def held_path(self) -> Path:
        return self.state_dir / "ray-stopped.json"

    @property
    def log_dir(self) -> Path:
        return self.cfg.agent.run_log_dir / "ray"

    @property
    def address(self) -> str:
        """The head's GCS address: the one the running (or last) Ray of this agent's serves or joined, else the
        config's. vLLM gets it as RAY_ADDRESS, so it must be the Ray that runs, not the one the config would start."""
        if self.running_settings is not None:
            return settings_address(self.running_settings)
        return settings_address(argv_settings(ray_argv(self.cfg)))

    @property
    def dashboard_port(self) -> int:
        """The head's state API port (Ray's dashboard on 127.0.0.1), as `address`: the running Ray's first."""
        value = (self.running_settings or {}).get("ray.dashboard_port", "")
        return int(value) if value.isdigit() and 0 < int(value) < 65536 else self.cfg.ray.dashboard_port

    def _set(self, state: RayState, reason: str) -> None:
        if state != self.state:
            self.since_ms = now_ms()
            log.info("ray: %s -> %s (%s)", self.state, state, reason)
        self.state, self.reason = state, reason
        if self.on_change:
            self.on_change()

    def _event(self, kind: EventKind, severity: Severity, message: str, with_log: bool = False, **details: Any) -> None:
        details.setdefault("role", self.cfg.agent.role)
        if with_log and self.proc is not None:
            details["log_path"] = self.proc.record.log_path
            details["log_tail"] = tail_lines(self.proc.record.log_path, LOG_TAIL_LINES)
        self._record(Event(kind, severity, message, details=details))

    # ------------------------------------------------------------------------------------- boot and exit

    async def boot(self) -> None:
        """Agent start: adopt the Ray a previous agent left running, else start it (unless stopped on purpose)."""
        record, err = launcher.read_record(self.record_path)
        if err:
            self._event(EventKind.AGENT_STATE_FILE, Severity.WARNING, err)
        if record is not None:
            proc, why = launcher.adopt(record)
            if proc is not None:
                self.proc = proc
                self.running_settings = argv_settings(record.argv)
                proc.watch()
                self._set(RayState.RUNNING, f"adopted from the previous agent (pid {proc.pid})")
                self._adopted(proc)
                self._watch = asyncio.get_running_loop().create_task(self._watch_exit(proc), name="ray-watch")
                return
            try:
                res = await launcher.kill_leftovers(record)
            except procs.ProcUnreadable as exc:  # what is left of it is unknown: its record stays for a later look
                self._set(RayState.STOPPED, f"previous Ray not adopted ({why}) and what is left of it cannot be "
                          f"looked for ({exc}): not started; restart the agent once it can list processes")
                return
            log.info("previous Ray not adopted (%s); %d leftover process(es) killed", why, len(res.pids))
            launcher.remove_record(self.record_path)
        held = self._held()
        if held:
            self._set(RayState.STOPPED, f"{held} (kept stopped across agent restarts; lynxtop start to start it)")
            return
        await self._launch("agent started", own=True)

    def _adopted(self, proc: ServerProcess) -> None:
        """The adoption's event; a warning naming each setting the config changed since that Ray started, which
        the agent keeps using (its address, its dashboard) until Ray next starts."""
        assert self.running_settings is not None
        now = argv_settings(ray_argv(self.cfg))
        differ = [k for k in sorted(now.keys() | self.running_settings.keys())
                  if now.get(k, "") != self.running_settings.get(k, "")]
        if not differ:
            self._event(EventKind.RAY_ADOPTED, Severity.INFO, f"Ray (pid {proc.pid}) left running by the previous "
                        "agent adopted: no restart", pid=proc.pid)
            return
        shown = "; ".join(f"{k}: {_cut(self.running_settings.get(k) or '(unset)')} running, "
                          f"{_cut(now.get(k) or '(unset)')} in the config" for k in differ)  # a record's words: cut
        how = ("on the head `lynxtop stop --cluster`, then `lynxtop ray start` (and `lynxtop start` on each worker)"
               if self.cfg.agent.role == "head"
               else "on this worker `lynxtop stop`, then `lynxtop start`")
        self._event(EventKind.RAY_ADOPTED, Severity.WARNING,
                    f"Ray (pid {proc.pid}) left running by the previous agent adopted: no restart; it was started "
                    f"with other settings than the config's ({shown}). The agent uses the running Ray's address "
                    f"{self.address} (vLLM's RAY_ADDRESS) until Ray is next started; the config applies at the next "
                    f"Ray start ({how})", pid=proc.pid, differ=differ,
                    running={k: self.running_settings.get(k) for k in differ}, config={k: now.get(k) for k in differ})

    def _held(self) -> str | None:
        """Why an operator stopped Ray (kept stopped across agent restarts), or None. Read at agent start on the
        event loop: through Marker, so never through a symlink nor blocked by a FIFO in its place."""
        data, err = Marker(self.held_path).read()
        reason = None if data is None else data.get("reason")
        if err is None and data is not None and not isinstance(reason, str):
            err = f'"reason" is {type(reason).__name__}, not a string'
        if err is not None:
            log.warning("ignoring unreadable %s: %s", self.held_path, err)
            return None
        return reason

    async def shutdown(self, stop_ray: bool) -> None:
        """Agent exit: with live restore Ray keeps running (its record stays for the next agent)."""
        self._closing = True
        self._cancel_retry()
        if stop_ray and self.proc is not None and not self.proc.exited:
            await self._stop_proc("agent shutting down (live_restore off)")
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch
        if self.proc is not None:
            self.proc.close()

    # ------------------------------------------------------------------------------------- operator actions

    async def start(self, by: str) -> str:
        """Start this node's Ray. One already running or starting is the ask met, told apart by its code
        (already_running / already_starting: the CLI exits 0, as for serving's start); a stopping one is refused."""
        if self.state in (RayState.STARTING, RayState.RUNNING):
            pid = f", pid {self.proc.pid}" if self.proc is not None and not self.proc.exited else ""
            code = "already_starting" if self.state == RayState.STARTING else "already_running"
            raise ActionError(code, f"Ray is already {self.state} on this node ({self.cfg.agent.role}, "
                                    f"{self.address}{pid}); nothing was started", 409)
        if self.state == RayState.STOPPING:
            raise ActionError("state", "Ray is stopping on this node; start it once it is stopped", 409)
        with contextlib.suppress(OSError):
            self.held_path.unlink()
        self._cancel_retry()
        self.failures.reset()
        self._event(EventKind.ACTION_START, Severity.INFO, f"start of Ray requested by {by}", by=by)
        await self._launch(f"started by {by}")
        return "starting Ray on this node"

    def refuse_stop_if_stopped(self, by: str) -> None:
        """A stop of a Ray already stopped is the ask met: 409 already_stopped (the CLI exits 0), answered before
        the stop is accepted. It is still kept stopped across agent restarts, as a stop says: a Ray stopped by a
        failed start is otherwise started again by the next agent (an operator's earlier reason is kept)."""
        if self.state != RayState.STOPPED:
            return
        if self._held() is None:
            with contextlib.suppress(OSError):
                atomic_write(self.held_path, json.dumps({"reason": f"stopped by {by}", "since_ms": now_ms()}))
        raise ActionError("already_stopped", f"Ray is already stopped on this node ({self.reason}); it stays "
                                             "stopped until `lynxtop start` here", 409)

    async def stop(self, by: str, hold: bool = True) -> str:
        """Stop this node's Ray; `hold`: keep it stopped across agent restarts until an operator starts it."""
        if self.state == RayState.STOPPING:
            raise ActionError("busy", "Ray is already stopping on this node", 409)
        self._cancel_retry()
        if hold:
            with contextlib.suppress(OSError):
                atomic_write(self.held_path, json.dumps({"reason": f"stopped by {by}", "since_ms": now_ms()}))
        if self.proc is None or self.proc.exited:
            self._set(RayState.STOPPED, f"stopped by {by}")
            return "Ray was not running; it stays stopped"
        self._event(EventKind.ACTION_STOP, Severity.INFO, f"stop of Ray requested by {by}", by=by)
        await self._stop_proc(f"stopped by {by}")
        return "Ray stopped on this node"

    async def _stop_proc(self, reason: str) -> None:
        proc = self.proc
        assert proc is not None
        self._stopped = proc
        self._set(RayState.STOPPING, reason)
        t0 = time.monotonic()
        res = await proc.stop(self.cfg.ray.stop_grace_s, 15.0)
        launcher.remove_record(self.record_path)
        left = f"; still alive after SIGKILL: {res.survivors}" if res.survivors else ""
        self._set(RayState.STOPPED, reason)
        self._event(EventKind.RAY_STOPPED, Severity.WARNING if res.survivors else Severity.INFO,
                    f"Ray stopped in {time.monotonic() - t0:.1f} s ({reason}){left}", pids=res.pids)

    # ------------------------------------------------------------------------------------- runs

    async def _launch(self, reason: str, own: bool = False) -> None:
        """`own`: the agent's start at boot or its retry; an OS refusal then backs off (`_spawn_refused`)."""
        exe, why = ray_executable(self.cfg.ray)
        if why:
            self._set(RayState.STOPPED, f"cannot start Ray: {why}")
            self._event(EventKind.RAY_EXITED, Severity.ERROR, f"cannot start Ray: {why}")
            return
        argv = ray_argv(self.cfg)
        log_path = self.log_dir / time.strftime(f"ray-%Y%m%d-%H%M%S-{int(time.time() * 1000) % 1000:03d}.log")
        for old in launcher.prune_logs(self.log_dir, RAY_LOGS_KEPT,
                                       max_bytes=self.cfg.agent.run_logs_max_total_mb * launcher.MIB):
            log.info("removed old Ray log %s", old)
        env = dict(self.cfg.ray.env) | {SOCKET_ENV: str(self.cfg.agent.socket), "RAY_USAGE_STATS_ENABLED": "0"}
        try:
            tmp_dir, tmp_error = await asyncio.to_thread(_prepare_tmpdir, self.cfg)
        except RuntimeError as exc:  # no thread could start: nothing was started
            self._spawn_refused(exe, argv, exc, own)
            return
        tmp_details: dict[str, Any] = {}
        tmp_note = ""
        if tmp_dir is not None:
            env["RAY_TMPDIR"] = tmp_dir
            tmp_details["tmp_dir"] = tmp_dir
            tmp_note = f"; Ray's temporary directory {tmp_dir}"
        elif tmp_error is not None:
            tmp_details["tmp_dir_error"] = tmp_error
            tmp_note = (f"; Ray keeps its default temporary directory (/tmp/ray, which a restart of the agent's "
                        f"unit removes under it): {tmp_error}")
            log.warning("ray: keeps its default temporary directory: %s", tmp_error)
        try:
            proc = await asyncio.to_thread(launcher.spawn, argv, log_path, env, "ray")
        except (OSError, RuntimeError) as exc:  # nothing was started (spawn never raises once it forked)
            self._spawn_refused(exe, argv, exc, own)
            return
        self.proc = proc
        self.running_settings = argv_settings(argv)
        proc.watch()
        with contextlib.suppress(OSError):
            launcher.write_record(self.record_path, proc.record)
        self.next_retry_ms = None
        self._set(RayState.STARTING, reason)
        self._event(EventKind.RAY_STARTING, Severity.INFO, f"Ray starting as {self.cfg.agent.role} "
                    f"({'GCS on ' if self.cfg.agent.role == 'head' else 'joining '}{self.address}), pid {proc.pid}: "
                    f"{reason}{tmp_note}", pid=proc.pid, argv=redact_argv(argv), log_path=str(log_path),
                    **tmp_details)
        self._watch = asyncio.get_running_loop().create_task(self._watch_exit(proc), name="ray-watch")

    async def _watch_exit(self, proc: ServerProcess) -> None:
        """Running once `ray start` says so; then wait for the exit, and back off and restart on a failure."""
        if self.state == RayState.STARTING:
            await self._await_started(proc)
        stable = asyncio.get_running_loop().call_later(self.cfg.agent.stable_after_s, self.failures.reset)
        try:
            ex = await proc.wait()
        finally:
            stable.cancel()
        if self._stopped is proc or self._closing or self.proc is not proc:
            return
        launcher.remove_record(self.record_path)
        what = "before it was up" if self.state == RayState.STARTING else "while running"
        reason = f"Ray {ex.describe()} {what} (not requested by anyone)"
        self._event(EventKind.RAY_EXITED, Severity.ERROR, reason, with_log=True, exit_code=ex.exit_code,
                    exit_signal=ex.exit_signal)
        leftovers = await proc.stop(5.0, 10.0)  # whatever of the node's Ray outlived `ray start`
        if leftovers.pids:
            log.info("ray: stopped %d leftover process(es) after the exit", len(leftovers.pids))
        self._back_off(reason)

    def _spawn_refused(self, exe: str, argv: list[str], exc: Exception, own: bool) -> None:
        """Ray could not be started. An operator's start stays "stopped" (they see it and act); the agent's own
        start or retry that a passing OS limit refused (processes/threads, memory, descriptors) is a failure
        backed off like an exit: "stopped" there ended the retries for good (the crash-loop limit still caps it)."""
        limit = os_refusal(exc)
        why = f"{exc}: {limit}" if limit else str(exc)
        self._event(EventKind.RAY_EXITED, Severity.ERROR, f"could not start Ray: {why}", argv=redact_argv(argv))
        if own and limit is not None:
            self._back_off(f"could not start {exe}: {why}")
            return
        self.next_retry_ms = None
        self._set(RayState.STOPPED, f"could not start {exe}: {why}")

    def _back_off(self, reason: str) -> None:
        """Count a failure: a retry after a backoff, or a crash loop that waits for an operator."""
        delay = self.failures.fail()
        if delay is None:
            window = self.cfg.agent.crash_loop_window_s
            self._set(RayState.CRASH_LOOP, f"crash loop: {len(self.failures)} failures within {window:g} s; not "
                      f"retrying until an operator acts (lynxtop start). Last: {reason}")
            self._event(EventKind.RAY_CRASH_LOOP, Severity.CRITICAL, self.reason, failures=len(self.failures))
            return
        self.next_retry_ms = now_ms() + int(delay * 1000)
        self._set(RayState.BACKOFF, f"{reason}; retry {self.failures.consecutive} in {delay:.1f} s")
        self._event(EventKind.RAY_BACKOFF, Severity.WARNING, f"Ray: retry in {delay:.1f} s (failure "
                    f"{len(self.failures)} of {self.cfg.agent.crash_loop_failures} allowed in "
                    f"{self.cfg.agent.crash_loop_window_s:g} s)", delay_s=delay, failures=len(self.failures))
        self._retry = asyncio.get_running_loop().create_task(self._retry_after(delay), name="ray-retry")

    async def _await_started(self, proc: ServerProcess) -> None:
        """Until `ray start` says Ray is up, exits, or is stopped. Past `start_timeout_s` a warning says why not
        (its log's last lines), once, and the wait goes on: a worker's `ray start` retries a head that cannot be
        reached, and joins it when it comes back (a head's reboot is no failure, and no crash loop)."""
        deadline = time.monotonic() + self.start_timeout_s
        told = False
        while not proc.exited and self.proc is proc and self.state == RayState.STARTING:
            if any(STARTED_LINE in line for line in tail_lines(proc.record.log_path, 60)):
                self._set(RayState.RUNNING, f"running as {self.cfg.agent.role} ({self.address})")
                self._event(EventKind.RAY_RUNNING, Severity.INFO, f"Ray is up as {self.cfg.agent.role} "
                            f"({self.address}), pid {proc.pid}" + (" (late)" if told else ""), pid=proc.pid)
                return
            if not told and time.monotonic() >= deadline:
                told = True
                await self._not_up(proc)
            await asyncio.sleep(1.0 if told else 0.25)

    async def _not_up(self, proc: ServerProcess) -> None:
        """Ray not up after `start_timeout_s`: the status reason and a warning say so, with its log's last lines
        (escaped and cut: Ray's words, and a worker's may quote whatever answered at the head's address)."""
        lines = await asyncio.to_thread(tail_lines, proc.record.log_path, NOT_UP_TAIL_LINES)
        shown = [_cut(terminal_safe(line)) for line in lines]
        last = shown[-1] if shown else "(its log is empty)"
        waited = f"not up after {self.start_timeout_s:g} s"
        if self.cfg.agent.role == "worker":
            why = f"{waited}: cannot reach the head {self.address} (is its Ray up, and the address reachable?)"
        else:
            why = f"{waited} as head (GCS on {self.address})"
        stop = "`lynxtop stop`" if self.cfg.agent.role == "worker" else "`lynxtop stop --cluster`"
        self._set(RayState.STARTING, f"{why}; last log line: {last}; still waiting")
        self._event(EventKind.RAY_STARTING, Severity.WARNING, f"Ray (pid {proc.pid}) {why}; still waiting, and up "
                    f"as soon as `ray start` says so ({stop} ends the wait). Its log {proc.record.log_path} ends: "
                    f"{last}", pid=proc.pid, log_path=proc.record.log_path, log_tail=shown,
                    waited_s=self.start_timeout_s)

    async def _retry_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self._retry = None
        if self.state == RayState.BACKOFF:
            await self._launch(f"retry {self.failures.consecutive} after failure", own=True)

    def _cancel_retry(self) -> None:
        if self._retry is not None and self._retry is not asyncio.current_task():
            self._retry.cancel()
        self._retry = None
        self.next_retry_ms = None

    @property
    def running(self) -> bool:
        return self.state == RayState.RUNNING
