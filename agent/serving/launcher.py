"""Starting, watching and stopping one `vllm serve` process tree.

- argv from the profile, never a shell; own session, so the whole tree is one process group to signal;
- stdout and stderr to a per-run log file: a pipe fills up and blocks vLLM, and breaks if the agent dies;
- the exit is watched through a pidfd, which also works for a server adopted from a previous agent (not our
  child: the pidfd says *that* it exited, not the status);
- stopping is SIGTERM to the API server (the leader) *only*; once it has exited (at once when it was already
  dead: a crash), SIGTERM to whatever of the run is left; after the grace period SIGKILL to the group and to
  every straggler of the run (EngineCore survives a SIGKILL of the API server), until /proc shows nothing of
  the run; then the run's leftover files and its own TMPDIR are removed (`runfiles`, `runtmp`).

Why not SIGTERM the whole group: vLLM's EngineCore handles SIGTERM itself by *aborting* every request.
Measured with vLLM 0.32 (CPU build) and 3 open streams: a group SIGTERM ended each stream with a bare
`[DONE]` after 3-24 of ~450 tokens (no finish_reason, no usage), and once left the API server hung in
shutdown until SIGKILL at the 40 s grace; a SIGTERM to the API server alone drained every stream in full
(`--shutdown-timeout`) and it exited 0 in ~6 s, stopping its own engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lynxtop.agent.notify import NOTIFY_VARS
from lynxtop.agent.serving import procs, runtmp
from lynxtop.agent.serving.procs import RUN_TOKEN_ENV
from lynxtop.agent.serving.proctable import ProcTable
from lynxtop.agent.serving.runfiles import RunFiles
from lynxtop.contract.files import atomic_write
from lynxtop.contract.redact import redact_env

log = logging.getLogger(__name__)

# After the leader exits on its own, its children get this long to finish exiting before the rest of the
# run is called orphaned and signalled (a leader may exit a moment before the engine it stopped).
ORPHAN_SETTLE_S = 0.5


@dataclass
class ServerRecord:
    """What a later agent needs to recognise and adopt a live server (kept in the state file)."""

    run_id: int | None
    profile: str
    pid: int
    pgid: int
    start_ticks: int
    argv: list[str]
    token: str
    log_path: str
    started_ms: int
    ready_ms: int | None = None
    env: dict[str, str] = field(default_factory=dict)  # the profile's env (not the agent's), secrets masked
    shm_segments: list[str] = field(default_factory=list)  # /dev/shm files the run had mapped when it got ready
    # the profile's when the run started: an edit of the config applies to the next run, not to a load under way
    readiness_timeout_s: float | None = None
    # the run's TMPDIR, made by the agent outside the unit's private /tmp (runtmp): whoever sees the run end removes
    # it; None: the run has the profile's TMPDIR, or the agent's
    tmp_dir: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> ServerRecord:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass
class ExitInfo:
    exit_code: int | None  # None: killed by a signal, or unknown (adopted)
    exit_signal: int | None
    known: bool = True

    def describe(self) -> str:
        if not self.known:
            return "exited (status unknown: adopted, not our child)"
        if self.exit_signal is not None:
            try:
                name = signal.Signals(self.exit_signal).name
            except ValueError:
                name = f"signal {self.exit_signal}"
            return f"killed by {name}"
        return f"exited with code {self.exit_code}"


@dataclass
class Orphan:
    """A process of the run still alive after its API server was gone, and what it took to end it."""

    pid: int
    title: str
    ended_by: str  # "SIGTERM", "SIGKILL", "exited by itself", or "still alive"

    def describe(self) -> str:
        title = self.title if len(self.title) <= 100 else self.title[:99] + "…"
        return f"{self.pid} {title} ({self.ended_by})"


@dataclass
class StopResult:
    """What a stop did: every pid the run had, the orphans it had to stop, the files it removed."""

    pids: list[int]
    leader_was_dead: bool  # the API server had already exited when the stop began (a crash, a SIGKILL)
    orphans: list[Orphan] = field(default_factory=list)
    survivors: list[int] = field(default_factory=list)  # alive even after SIGKILL (uninterruptible sleep)
    removed: list[str] = field(default_factory=list)
    not_removed: list[str] = field(default_factory=list)  # with the reason; or every file, if survivors


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _clean_files(result: StopResult, files: RunFiles) -> None:
    if result.survivors:  # a file still mapped by a live process of the run is not ours to pull away yet
        result.not_removed = [f"{p} (process(es) {result.survivors} of the run still alive)"
                              for p in files.every_path()]
    else:
        result.removed, result.not_removed = files.remove()


def child_env(profile_env: Mapping[str, str], token: str, base: Mapping[str, str] | None = None,
              tmp_dir: str | None = None) -> dict[str, str]:
    """The agent's environment minus systemd's notify/watchdog variables, plus TMPDIR=`tmp_dir` (the run's own),
    the profile's env (its TMPDIR wins) and the token."""
    env = dict(os.environ if base is None else base)
    for var in NOTIFY_VARS:
        env.pop(var, None)
    if tmp_dir is not None:
        env["TMPDIR"] = tmp_dir
    env.update(profile_env)
    env[RUN_TOKEN_ENV] = token
    return env


SIMULATOR_SCRIPT = "lynxtop-sim-vllm"  # lynxtop's simulated vLLM (sim/), its console script
SIMULATOR_MODULE = "lynxtop.sim"


def runs_simulator(argv: list[str]) -> bool:
    """Whether `argv` runs lynxtop's simulated vLLM (its console script, or `python -m lynxtop.sim`): such a run is
    stored and shown as simulated even on real GPUs, where the node itself is not (rule: a simulated component is
    labelled wherever a user sees it)."""
    return bool(argv) and (Path(argv[0]).name == SIMULATOR_SCRIPT or list(argv[1:3]) == ["-m", SIMULATOR_MODULE])


def new_token() -> str:
    return uuid.uuid4().hex[:16]


class ServerProcess:
    """One running server tree: the leader (spawned or adopted) and a pidfd on it."""

    def __init__(self, record: ServerRecord, popen: subprocess.Popen | None, adopted: bool):
        self.record = record
        self.popen = popen
        self.adopted = adopted
        self.exit: ExitInfo | None = None
        self.log_error: str | None = None  # why the run's output is not being kept, if it is not
        self.tmp_error: str | None = None  # why the run has no TMPDIR of its own (spawn), if it has none
        self._pidfd: int | None = None
        self._exited = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        # who the run's files belong to (read now: once the leader is gone /proc cannot say)
        self.uid = procs.uid(record.pid)
        if self.uid is None:
            self.uid = os.getuid()
        self.files = RunFiles(tmp_dir=record.tmp_dir)  # filled at readiness and again before a stop signals
        for path in record.shm_segments:  # seen by a previous agent (adoption)
            self.files.add_recorded(path, self.uid)
        try:
            self._pidfd = os.pidfd_open(record.pid)
        except ProcessLookupError:
            self._on_exit_now()

    @property
    def pid(self) -> int:
        return self.record.pid

    def watch(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start watching the exit on the running loop (call once from the loop)."""
        self._loop = loop or asyncio.get_running_loop()
        if self._pidfd is not None and not self._exited.is_set():
            self._loop.add_reader(self._pidfd, self._on_exit_now)

    def _on_exit_now(self) -> None:
        self.close()
        if self.popen is not None:
            code = self.popen.poll()
            if code is None:  # the pidfd fired, so it exited: reap it
                with contextlib.suppress(subprocess.TimeoutExpired):
                    code = self.popen.wait(timeout=1.0)
            if code is None:
                self.exit = ExitInfo(None, None, known=False)
            elif code < 0:
                self.exit = ExitInfo(None, -code)
            else:
                self.exit = ExitInfo(code, None)
        else:
            self.exit = ExitInfo(None, None, known=False)
        self._exited.set()

    @property
    def exited(self) -> bool:
        return self._exited.is_set()

    async def wait(self) -> ExitInfo:
        await self._exited.wait()
        assert self.exit is not None
        return self.exit

    def leader_alive(self) -> bool:
        return not self.exited and procs.alive(self.pid)

    def members(self, table: ProcTable | None = None) -> list[int]:
        """Live pids of this run (leader, group, descendants, token): from the node's kept `table` when
        sampling, from a fresh look at every process otherwise (deciding whether the run is gone)."""
        roots = [self.pid] if not self.exited else []
        find = table.members if table is not None else procs.run_processes
        return find(self.record.token, self.record.pgid, roots, self.record.start_ticks)

    def note_files(self) -> None:
        """Record the segments the run has mapped now (at readiness: a run SIGKILLed as a whole leaves no
        process whose maps could be read at stop time)."""
        for pid in self.members():
            self.files.add_segments_of(pid, again=True)
        self.record.shm_segments = self.files.segments()

    def signal_group(self, sig: int) -> None:
        """The whole group at once, only while its leader (pid == pgid) is ours and alive: once the run's group
        is empty its number may be a stranger's group; the members are then signalled one by one (`_Stop.kill`)."""
        if not self.leader_alive():
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.record.pgid, sig)

    def _signal_leader(self, sig: int) -> bool:
        """Through the pidfd while we hold it: a recycled pid can never be hit."""
        try:
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, sig)
            elif not self.exited:
                os.kill(self.pid, sig)
            else:
                return False
        except (ProcessLookupError, PermissionError):
            return False
        return True

    async def stop(self, grace_s: float, kill_wait_s: float = 10.0, poll_s: float = 0.05) -> StopResult:
        """SIGTERM the leader, then what it leaves behind, SIGKILL what is left after `grace_s`; clean files."""
        stop = _Stop(self)
        left = stop.look()
        stop.leader_was_dead = not self.leader_alive()
        if not stop.leader_was_dead and self._signal_leader(signal.SIGTERM):
            stop.sent[self.pid] = signal.SIGTERM
        left = await stop.terminate(left, grace_s, poll_s)
        if left:
            log.warning("run %s: %d process(es) still alive after %.0f s grace, sending SIGKILL: %s",
                        self.record.run_id, len(left), grace_s, left)
        left = await stop.kill(left, kill_wait_s, poll_s)
        await self._reap()
        return stop.result(left)

    async def _reap(self) -> None:
        if not self.exited and self.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(self.popen.wait, 2.0)
        # the pidfd callback may be queued behind us: make sure the exit is recorded
        if not self._exited.is_set() and not procs.alive(self.pid):
            self._on_exit_now()

    def close(self) -> None:
        """Stop watching the exit: the pidfd leaves the loop and is closed (again: nothing)."""
        if self._pidfd is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None


class _Stop:
    """The bookkeeping of one stop: every process of the run seen (and its title), the last signal each got from
    us, and the orphans (what was left once the leader was gone)."""

    def __init__(self, proc: ServerProcess):
        self.proc = proc
        self.titles: dict[int, str] = {}
        self.sent: dict[int, int] = {}
        self.orphans: list[int] | None = None  # None: the leader is not known to be gone yet
        self.files = proc.files
        self.files.add_from_log(proc.record.log_path, proc.uid if proc.uid is not None else os.getuid())
        self.leader_was_dead = False  # the API server had exited before the stop began (set by the caller)
        self._leader_gone_at: float | None = None

    def look(self) -> list[int]:
        alive = self.proc.members()
        for pid in alive:
            if pid not in self.titles:
                self.titles[pid] = procs.title(pid)
                self.files.add_segments_of(pid, again=True)  # before any signal: a dead process's maps are gone
        return alive

    def signal(self, pid: int, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
            self.sent[pid] = sig

    def _orphan_the_rest(self, left: list[int]) -> None:
        """Once the leader is gone (its children had ORPHAN_SETTLE_S to follow it), all that is left is orphaned."""
        if self.orphans is None and not self.proc.leader_alive():
            self._leader_gone_at = self._leader_gone_at or time.monotonic()
            if self.leader_was_dead or time.monotonic() - self._leader_gone_at >= ORPHAN_SETTLE_S:
                self.orphans = []
        if self.orphans is None:
            return
        for pid in left:
            if pid != self.proc.pid and pid not in self.orphans:
                self.orphans.append(pid)
                self.signal(pid, signal.SIGTERM)

    async def terminate(self, left: list[int], grace_s: float, poll_s: float) -> list[int]:
        """Wait up to `grace_s` for the run to end, SIGTERMing orphans; returns what is still alive."""
        deadline = time.monotonic() + grace_s
        while True:
            self._orphan_the_rest(left)
            if not left or time.monotonic() >= deadline:
                break
            await asyncio.sleep(poll_s)
            left = self.look()
        if self.orphans is None:  # the grace ended first: if the leader is gone, what it left behind is orphaned
            self.orphans = [p for p in left if p != self.proc.pid] if not self.proc.leader_alive() else []
        return left

    async def kill(self, left: list[int], kill_wait_s: float, poll_s: float) -> list[int]:
        """SIGKILL the group and every straggler until nothing is left or `kill_wait_s` passed."""
        deadline = time.monotonic() + kill_wait_s
        while left and time.monotonic() < deadline:
            self.proc.signal_group(signal.SIGKILL)
            for pid in left:
                self.signal(pid, signal.SIGKILL)
            await asyncio.sleep(poll_s)
            left = self.look()
        return left

    def result(self, left: list[int]) -> StopResult:
        result = StopResult(pids=sorted(set(self.titles) | {self.proc.pid}), leader_was_dead=self.leader_was_dead,
                            survivors=left)
        for pid in self.orphans or []:
            ended = ("still alive" if pid in left else _signal_name(self.sent[pid]) if pid in self.sent
                     else "exited by itself")
            result.orphans.append(Orphan(pid, self.titles.get(pid, "?"), ended))
        _clean_files(result, self.files)
        return result


def spawn(argv: list[str], log_path: Path, profile_env: Mapping[str, str], profile: str,
          run_id: int | None = None, token: str | None = None, started_ms: int | None = None,
          secret_names: Collection[str] = (), tmp_root: Path | None = None) -> ServerProcess:
    """Start `argv` (no shell) in its own session with output to `log_path` (created 0640).

    `tmp_root`: the run's TMPDIR is made there (runtmp) unless the profile sets its own; when it cannot be (said
    in `tmp_error` on the result) the run has the agent's, as without `tmp_root`.

    `profile_env` reaches the server as it is; the record (kept in the state file) holds it with every secret
    value masked (`secret_names` beyond contract/redact's patterns): the server's /proc/PID/environ is the one
    place a secret is kept while it runs.

    A log that cannot be created (full disk, permissions) does not stop serving: the output goes to
    /dev/null and `log_error` on the result says why, for the caller's event.
    """
    token = token or new_token()
    log_error: str | None = None
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
    except OSError as exc:
        log_error = f"cannot create the run's log {log_path}: {exc.strerror or exc}"
        fd = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    cwd = log_path.parent if log_path.parent.is_dir() else Path("/")
    tmp_dir = tmp_error = None
    if tmp_root is not None and "TMPDIR" not in profile_env:
        tmp_dir, tmp_error = runtmp.make(tmp_root, token[:8])
        if tmp_error:
            log.warning("run of profile %s keeps the agent's temporary directory: %s", profile, tmp_error)
    try:
        popen = subprocess.Popen(  # noqa: S603 - argv list, no shell
            argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=subprocess.STDOUT, close_fds=True,
            start_new_session=True, env=child_env(profile_env, token, tmp_dir=tmp_dir), cwd=str(cwd),
        )
    except OSError:
        if tmp_dir is not None:
            runtmp.remove(tmp_dir)  # nothing was started: nothing uses it
        raise
    finally:
        os.close(fd)
    st = procs.stat(popen.pid)
    record = ServerRecord(
        run_id=run_id, profile=profile, pid=popen.pid, pgid=popen.pid, start_ticks=st.start_ticks if st else 0,
        argv=list(argv), token=token, log_path=str(log_path),
        started_ms=started_ms if started_ms is not None else int(time.time() * 1000),
        env=redact_env(profile_env, secret_names), tmp_dir=tmp_dir,
    )
    proc = ServerProcess(record, popen, adopted=False)
    proc.log_error, proc.tmp_error = log_error, tmp_error
    return proc


def check_adoptable(record: ServerRecord, settle_tries: int = 20, settle_s: float = 0.005) -> str | None:
    """Why `record` can not be adopted (None: it is the same live process, started with the same argv).

    A server started through wrappers (a pyenv shim, `env`, a shell script) execs several times in its first
    moments, and for the instant of each exec its /proc environ and cmdline read empty: a mismatch is looked at
    again for up to `settle_tries` x `settle_s` before the process is called someone else's.
    """
    for _ in range(settle_tries - 1):
        reason = _why_not_adoptable(record)
        if reason is None or not reason.endswith(_OTHER_COMMAND):
            return reason
        time.sleep(settle_s)
    return _why_not_adoptable(record)


_OTHER_COMMAND = "runs a different command line"


def _why_not_adoptable(record: ServerRecord) -> str | None:
    st = procs.stat(record.pid)
    if st is None or st.state in ("Z", "X"):
        return f"pid {record.pid} is no longer running"
    if st.start_ticks != record.start_ticks:
        return f"pid {record.pid} now belongs to another process (start time differs)"
    args = procs.cmdline(record.pid)
    if args is None:
        return f"cannot read the command line of pid {record.pid}"
    if not _same_command(args, record.argv) and not procs.environ_has(record.pid, RUN_TOKEN_ENV, record.token):
        return f"pid {record.pid} {_OTHER_COMMAND}"
    return None


def _same_command(cmdline: list[str], argv: list[str]) -> bool:
    """argv as started; a script run through its shebang shows as [interpreter, (flag,) script, args...]."""
    if cmdline == argv:
        return True
    extra = len(cmdline) - len(argv)
    return 0 < extra <= 3 and bool(argv) and cmdline[extra:] == argv


def adopt(record: ServerRecord) -> tuple[ServerProcess | None, str | None]:
    reason = check_adoptable(record)
    if reason:
        return None, reason
    proc = ServerProcess(record, None, adopted=True)
    if proc.exited:
        return None, f"pid {record.pid} exited while being adopted"
    return proc, None


def leftovers(record: ServerRecord) -> list[int]:
    """Processes of a run whose leader is gone, e.g. after the agent was down.

    By token only: the recorded pid (and so the process group id) may belong to someone else by now.
    """
    return procs.run_processes(record.token, None, ())  # every process: rare, and a record may be wrong


async def kill_leftovers(record: ServerRecord, wait_s: float = 10.0, poll_s: float = 0.05) -> StopResult:
    """SIGKILL every leftover of a dead run and remove its files; `pids` empty: nothing was left."""
    found = leftovers(record)
    titles = {pid: procs.title(pid) for pid in found}
    files = RunFiles(tmp_dir=record.tmp_dir)
    for pid in found:
        files.add_segments_of(pid)
    owners = {u for u in (procs.uid(p) for p in found) if u is not None}
    owner = owners.pop() if len(owners) == 1 else os.getuid()
    files.add_from_log(record.log_path, owner)
    for path in record.shm_segments:  # what the run had mapped when it got ready, even if nothing is left now
        files.add_recorded(path, owner)
    deadline = time.monotonic() + wait_s
    left = found
    while left and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        await asyncio.sleep(poll_s)
        left = leftovers(record)
    result = StopResult(pids=found, leader_was_dead=True, survivors=left,
                        orphans=[Orphan(p, titles[p], "still alive" if p in left else "SIGKILL") for p in found])
    _clean_files(result, files)
    return result


def read_record(path: Path) -> tuple[ServerRecord | None, str | None]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"cannot read {path}: {exc}"
    try:
        return ServerRecord.from_json(text), None
    except (ValueError, TypeError, KeyError) as exc:
        return None, f"{path} is not a valid server record ({exc}); ignored"


def write_record(path: Path, record: ServerRecord) -> None:
    """Atomically (write + rename): a crash mid-write must not lose the record of a live 20-minute load."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
    atomic_write(path, record.to_json(), mode=0o640)


def remove_record(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def prune_logs(log_dir: Path, keep: int, protect: set[str] | frozenset[str] = frozenset()) -> list[Path]:
    """Delete all but the newest `keep` run logs (never one in `protect`): runs are many, disks are not."""
    try:
        logs = sorted((p for p in log_dir.glob("*.log") if p.is_file()), key=lambda p: p.stat().st_mtime,
                      reverse=True)
    except OSError:
        return []
    removed = []
    for p in logs[keep:]:
        if str(p) in protect:
            continue
        with contextlib.suppress(OSError):
            p.unlink()
            removed.append(p)
    return removed
