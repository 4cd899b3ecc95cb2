"""Starting, watching and stopping one `vllm serve` process tree.

- argv from the profile, never a shell; own session, so the whole tree is one process group to signal;
- stdout and stderr to a per-run log file: a pipe fills up and blocks vLLM, and breaks if the agent dies;
- the exit is watched through a pidfd, which also works for a server adopted from a previous agent (not our
  child: the pidfd says *that* it exited, not the status);
- stopping is SIGTERM to the API server (the leader) *only*; once it has exited (at once when it was already
  dead: a crash), SIGTERM to whatever of the run is left; after the grace period SIGKILL to the group and to
  every straggler of the run (EngineCore survives a SIGKILL of the API server), until /proc shows nothing of
  the run; then the run's leftover files and its own TMPDIR are removed (`runfiles`, `runtmp`) and its log's
  disk reserve given back (`logreserve`);
- the run's record (serving.json) is read back only as an agent writes it (`record_fields`), and a live pid that
  carries the run's token is never signalled on the word of a record (`identify`, `kill_leftovers`).

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
import re
import select
import signal
import stat
import subprocess
import threading
import time
import uuid
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lynxtop.agent.notify import NOTIFY_VARS
from lynxtop.agent.serving import logreserve, procs, runtmp, safefile
from lynxtop.agent.serving.procs import RUN_TOKEN_ENV
from lynxtop.agent.serving.proctable import ProcTable
from lynxtop.agent.serving.runfiles import RunFiles
from lynxtop.contract.config import AgentConfig
from lynxtop.contract.files import atomic_write
from lynxtop.contract.redact import redact_env

log = logging.getLogger(__name__)

# After the leader exits on its own, its children get this long to finish exiting before the rest of the
# run is called orphaned and signalled (a leader may exit a moment before the engine it stopped).
ORPHAN_SETTLE_S = 0.5
BLIND_RETRY_S = 0.5  # a stop that cannot read /proc (out of descriptors) looks again this often

RECORD_FORMAT = 1  # serving.json's layout; a record without "format" is the previous version's: read as format 1
PID_MAX = 1 << 22  # the kernel's PID_MAX_LIMIT: a larger pid is no process (and would overflow os.kill)
TOKEN_SHAPE = re.compile(r"[0-9a-f]{16}")  # what new_token() makes
# spawn: how often the new process's start time is read before it is recorded as unknown (it was just forked)
START_READS, START_READ_GAP_S = 20, 0.005
# a loading run this young (or adopted and not looked at yet) is looked at every YOUNG_LOOK_S (`look_due`): its
# EngineCore and workers retitle themselves at once, and are known only from a look while their leader lives
YOUNG_S, YOUNG_LOOK_S = 60.0, 1.0
EXIT_POLL_S = 0.5  # how often a leader's exit is looked for in /proc when no pidfd could be opened on it


@dataclass
class ServerRecord:
    """What a later agent needs to recognise and adopt a live server (kept in the state file, serving.json).

    Read back through `from_json`, which trusts nothing in it (a record of another version, a hand edit): a
    field of another type once made the next agent take the live server for a stranger's pid and SIGKILL it."""

    run_id: int | None
    profile: str
    pid: int
    pgid: int
    start_ticks: int  # 0: unknown (/proc could not say at spawn); written as null, never as a start time
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
    # (pid, start ticks) of the run's processes when it got ready: vLLM's EngineCore and workers retitle themselves,
    # which hides the token from /proc, so a later agent knows them by these once their API server is gone
    members: list[tuple[int, int]] = field(default_factory=list)

    def to_json(self) -> str:
        data = asdict(self)
        data["start_ticks"] = self.start_ticks if self.start_ticks > 0 else None
        return json.dumps({"format": RECORD_FORMAT, **data}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> ServerRecord:
        """The record as an agent writes it, else ValueError naming the field and what is wrong with it."""
        return cls(**record_fields(safefile.loads_strict(text)))


def _show(value: Any) -> str:
    """A field's value for a message, as JSON shows it (a string in quotes): a hand edit may hold a megabyte."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


_REQUIRED = object()  # a field's default: there is none, the field must be there
MEMBERS_MAX = 4096  # process identities a record keeps (a run is a server, an engine and a worker per GPU)
_INT_MAX = safefile.INT_LIMIT - 1


class _Fields:
    """The fields of a record read from disk, each taken only if it has the type and range an agent writes."""

    def __init__(self, data: dict[str, Any]):
        self.data = data

    def _get(self, key: str, default: Any) -> tuple[Any, bool]:
        """(value, True), or (default, False) when the key is absent and has a default."""
        if key in self.data:
            return self.data[key], True
        if default is _REQUIRED:
            raise ValueError(f'"{key}" is missing')
        return default, False

    def integer(self, key: str, low: int, high: int, *, null: bool = False, default: Any = None) -> int | None:
        value, present = self._get(key, default)
        if not present or value is None and null:
            return value
        if type(value) is not int or not low <= value <= high:  # a bool, a float, a string: refused
            raise ValueError(f'"{key}" is {_show(value)}, not {_range(low, high)}' + (" or null" if null else ""))
        return value

    def string(self, key: str, *, null: bool = False, default: Any = None) -> str | None:
        value, present = self._get(key, default)
        if not present or value is None and null:
            return value
        if not isinstance(value, str) or not value:
            raise ValueError(f'"{key}" is {_show(value)}, not a non-empty string' + (" or null" if null else ""))
        return value

    def strings(self, key: str, *, default: Any = _REQUIRED) -> list[str]:
        value, present = self._get(key, default)
        if present and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
            raise ValueError(f'"{key}" is {_show(value)}, not a list of strings')
        return list(value)

    def identities(self, key: str) -> list[tuple[int, int]]:
        value, present = self._get(key, [])
        if not present:
            return []
        if isinstance(value, list) and len(value) > MEMBERS_MAX:
            raise ValueError(f'"{key}" has {len(value)} entries, more than {MEMBERS_MAX}')
        if not isinstance(value, list) or not all(
                isinstance(v, list) and len(v) == 2 and all(type(x) is int for x in v)
                and 1 <= v[0] <= PID_MAX and 1 <= v[1] <= _INT_MAX for v in value):
            raise ValueError(f'"{key}" is {_show(value)}, not a list of [pid, start time] pairs')
        return [(pid, ticks) for pid, ticks in value]

    def env(self, key: str) -> dict[str, str]:
        value, present = self._get(key, {})
        if present and (not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values())):
            raise ValueError(f'"{key}" is {_show(value)}, not an object of strings')
        return dict(value)

    def seconds(self, key: str) -> float | None:
        value, _ = self._get(key, None)
        if value is None:
            return None
        if type(value) not in (int, float) or not value > 0:  # finite: loads_strict refuses NaN and infinity
            raise ValueError(f'"{key}" is {_show(value)}, not a number of seconds above 0 or null')
        return float(value)


def _range(low: int, high: int) -> str:
    if high < _INT_MAX:
        return f"an integer from {low} to {high}"
    return "a positive integer" if low == 1 else f"an integer of at least {low}"


def record_fields(data: Any) -> dict[str, Any]:
    """ServerRecord's fields from a parsed serving.json, each checked; ValueError names the first one wrong.

    Without "format" it is the previous version's record: the same fields, and start_ticks 0 where /proc could
    not say (now written as null). A format above RECORD_FORMAT is a newer agent's: not read, not guessed at."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    fmt = data.get("format", RECORD_FORMAT)
    if type(fmt) is not int or fmt < 1:
        raise ValueError(f'"format" is {_show(fmt)}, not a format number')
    if fmt > RECORD_FORMAT:
        raise ValueError(f'"format" is {fmt}: written by a newer agent (this one reads format {RECORD_FORMAT})')
    f = _Fields(data)
    argv = f.strings("argv")
    if not argv or not argv[0]:
        raise ValueError(f'"argv" is {_show(argv)}, not a command line (a non-empty list, its first word non-empty)')
    token = f.string("token", default=_REQUIRED)
    if not TOKEN_SHAPE.fullmatch(token or ""):
        raise ValueError(f'"token" is {_show(token)}, not a run token (16 lowercase hex digits)')
    start = f.integer("start_ticks", 0 if "format" not in data else 1, _INT_MAX, null=True, default=_REQUIRED)
    return {
        "run_id": f.integer("run_id", 1, _INT_MAX, null=True, default=_REQUIRED),
        "profile": f.string("profile", default=_REQUIRED),
        "pid": f.integer("pid", 1, PID_MAX, default=_REQUIRED),
        "pgid": f.integer("pgid", 1, PID_MAX, default=_REQUIRED),
        "start_ticks": start or 0,  # null: unknown, as 0 is in memory (procs: <= 0 is "not known")
        "argv": argv, "token": token, "log_path": f.string("log_path", default=_REQUIRED),
        "started_ms": f.integer("started_ms", 0, _INT_MAX, default=_REQUIRED),
        "ready_ms": f.integer("ready_ms", 0, _INT_MAX, null=True),
        "env": f.env("env"), "shm_segments": f.strings("shm_segments", default=[]),
        "readiness_timeout_s": f.seconds("readiness_timeout_s"), "tmp_dir": f.string("tmp_dir", null=True),
        "members": f.identities("members"),
    }


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


def _clean_files(result: StopResult, files: RunFiles, log_path: str) -> None:
    if result.survivors:  # a file still mapped by a live process of the run is not ours to pull away yet
        result.not_removed = [f"{p} (process(es) {result.survivors} of the run still alive)"
                              for p in files.every_path()]
    else:
        result.removed, result.not_removed = files.remove()
        logreserve.release_quietly(log_path)  # nothing of the run writes to its log any more


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
        # pid -> start ticks of every process seen in the run (replaced, never changed in place: the sampler's
        # thread reads it too); a retitled one shows no token, and once the leader is gone no group either
        self.known: dict[int, int] = dict(record.members)
        self._seen: dict[int, int] = dict(record.members)  # the live members of the last look (the record's)
        self._looked_at: float | None = None  # when this agent last looked (monotonic)
        self._look_begun = float("-inf")  # when the look `_seen` holds began: an older one finishing later loses
        self._known_lock = threading.Lock()  # looks merge into `known` from the loop and the sampler's thread
        self.files = RunFiles(tmp_dir=record.tmp_dir)  # filled at readiness and again before a stop signals
        for path in record.shm_segments:  # seen by a previous agent (adoption)
            self.files.add_recorded(path, self.uid)
        self.pidfd_error: str | None = None  # why the exit is polled from /proc instead (no pidfd), if it is
        self._poll: asyncio.TimerHandle | None = None
        try:
            self._pidfd = os.pidfd_open(record.pid)
        except ProcessLookupError:
            self._on_exit_now()
        except OSError as exc:
            # EMFILE/ENFILE/ENOMEM: the server runs (spawn forked it, or it is adopted); raising here once left a
            # forked vLLM with no record while the start said "could not start". Its exit is polled instead.
            self.pidfd_error = f"no pidfd on pid {record.pid} ({exc.strerror or exc}): its exit is polled in /proc"
            log.warning("profile %s: %s", record.profile, self.pidfd_error)

    @property
    def pid(self) -> int:
        return self.record.pid

    def watch(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start watching the exit on the running loop (call once from the loop)."""
        self._loop = loop or asyncio.get_running_loop()
        if self._pidfd is not None and not self._exited.is_set():
            self._loop.add_reader(self._pidfd, self._on_exit_now)
        elif self.pidfd_error is not None and not self._exited.is_set():
            self._poll = self._loop.call_later(EXIT_POLL_S, self._poll_exit)

    def _poll_exit(self) -> None:
        """Without a pidfd: the leader exited once /proc shows it a zombie (our child, not reaped: its pid cannot
        be reused meanwhile), gone, or another process under its pid (an adopted leader reaped by another)."""
        self._poll = None
        if self._exited.is_set() or self._loop is None:
            return
        st = procs.stat(self.pid)
        ticks = self.record.start_ticks
        if st is None or st.state in ("Z", "X") or (ticks and st.start_ticks != ticks):
            self._on_exit_now()
        else:
            self._poll = self._loop.call_later(EXIT_POLL_S, self._poll_exit)

    def _on_exit_now(self) -> None:
        if self.popen is not None and self.popen.returncode is None:
            self._look_before_reaping()
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

    def _look_before_reaping(self) -> None:
        """Our child has exited and is not reaped yet: its zombie holds its pid, so its process group is certainly
        the run's (procs._group_is_the_runs) and every process still in it is known from now on, even an EngineCore
        that retitled itself before any look (an API server dead seconds into the load). Once reaped, a leaderless
        group with no token left in it cannot be told from a stranger's that got the number."""
        try:
            self._members()
        except Exception:  # noqa: BLE001 - the exit must be recorded whatever this look met
            log.exception("run %s: cannot look at the run's processes as its API server exits", self.record.run_id)

    def leader_alive(self) -> bool:
        return not self.exited and procs.alive(self.pid)

    def members(self, table: ProcTable | None = None) -> list[int]:
        """Live pids of this run (leader, group, descendants, token): from the node's kept `table` when
        sampling, from a fresh look at every process otherwise (deciding whether the run is gone). /proc
        unreadable (out of descriptors): the last look's, never none (`_members`)."""
        return self._members(table)[0]

    def _members(self, table: ProcTable | None = None, strict: bool = False) -> tuple[list[int], dict[int, int]]:
        """The members and their start ticks; each one is known from now on. /proc unreadable: procs.ProcUnreadable
        with `strict` (a stop must know it cannot see), else the last look's members, nothing learnt or forgotten
        (an empty answer would read a live run as gone, and empty the record's members)."""
        roots = [self.pid] if not self.exited else []
        find = table.members if table is not None else procs.run_processes
        seen: dict[int, int] = {}
        begun = time.monotonic()
        try:
            found = find(self.record.token, self.record.pgid, roots, self.record.start_ticks, self.known, seen)
        except procs.ProcUnreadable:
            if strict:
                raise
            with self._known_lock:
                last = dict(self._seen)
            return sorted(last), last
        with self._known_lock:
            known = self.known
            if any(known.get(pid) != ticks for pid, ticks in seen.items()):
                if len(known) + len(seen) > MEMBERS_MAX:  # a run that churns processes: the gone ones go first
                    known = {}
                self.known = {**known, **seen}
            if begun >= self._look_begun:  # looks overlap (the loading watch's, readiness', the sampler's)
                self._seen, self._looked_at, self._look_begun = seen, time.monotonic(), begun
        return found, seen

    def look_due(self) -> bool:
        """Whether a loading run is to be looked at now: at most every YOUNG_LOOK_S, in its first YOUNG_S or until
        this agent first looked. Real vLLM's EngineCore and workers hide the run's token as they start; an agent
        killed before it saw them leaves its successor nothing to know them by once their API server dies. Later
        and once ready, the node's look every 5 s is enough: nothing is added to a serving agent's steady cost."""
        looked = self._looked_at
        if looked is not None and time.monotonic() - looked < YOUNG_LOOK_S:
            return False
        age = procs.age_s(self.record.start_ticks)
        return looked is None or (age is not None and age < YOUNG_S)

    def members_changed(self) -> bool:
        """The record's members made those of the last look; whether they changed (the caller saves the record, so
        an agent killed mid-load leaves them to the next one: `leftovers`)."""
        seen = sorted(self._seen.items())[:MEMBERS_MAX]
        if [tuple(m) for m in self.record.members] == seen:
            return False
        self.record.members = seen
        return True

    def note_files(self) -> None:
        """Record the segments the run has mapped now and its processes (at readiness: a run SIGKILLed as a
        whole leaves no process whose maps could be read at stop time, and retitled ones show no token)."""
        found, seen = self._members()
        for pid in found:
            self.files.add_segments_of(pid, again=True)
        self.record.shm_segments = self.files.segments()
        self.record.members = sorted(seen.items())[:MEMBERS_MAX]

    def signal_group(self, sig: int) -> None:
        """The whole group at once, only while its leader (pid == pgid) is ours and alive: once the run's group
        is empty its number may be a stranger's group; the members are then signalled one by one (`_Stop.kill`).
        Alive as the pidfd says (`_leader_running`): the group is reached even when /proc cannot be read."""
        if not self._leader_running():
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.record.pgid, sig)

    def _leader_running(self) -> bool:
        """Whether the leader has not exited: by polling the pidfd while we hold it (no descriptor opened, so a
        stop out of descriptors still tells; a zombie reads exited, as with `leader_alive`), else from /proc."""
        if self.exited:
            return False
        if self._pidfd is None:
            return self.leader_alive()
        poll = select.poll()  # a poll(2) per call: no epoll descriptor
        poll.register(self._pidfd, select.POLLIN)
        return not poll.poll(0)

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
        """SIGTERM the leader, then what it leaves behind, SIGKILL what is left after `grace_s`; clean files.

        /proc unreadable (the agent out of descriptors) is not "nothing left": the stop goes on by the pidfd, the
        group (while the leader is ours) and the known pids, waits its grace, SIGKILLs, and does not return until
        a look at /proc confirms the run is gone (`_Stop.until_seen`): its caller removes the record."""
        stop = _Stop(self)
        left = stop.look()
        stop.leader_was_dead = not self._leader_running()
        if not stop.leader_was_dead and self._signal_leader(signal.SIGTERM):
            stop.sent[self.pid] = signal.SIGTERM
        left = await stop.terminate(left, grace_s, poll_s)
        if left or stop.blind:
            log.warning("run %s: %s after %.0f s grace, sending SIGKILL: %s", self.record.run_id,
                        f"{len(left)} process(es) still alive" if not stop.blind else
                        f"which processes live is unknown ({stop.blind})", grace_s, left)
        left = await stop.kill(left, kill_wait_s, poll_s)
        if stop.blind:
            left = await stop.until_seen(kill_wait_s, poll_s)
        await self._reap()
        return stop.result(left)

    async def _reap(self) -> None:
        if not self.exited and self.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(self.popen.wait, 2.0)
        # the pidfd callback may be queued behind us: make sure the exit is recorded (by the pidfd: /proc
        # unreadable is no exit, and this closes the pidfd)
        if not self._exited.is_set() and not self._leader_running():
            self._on_exit_now()

    def close(self) -> None:
        """Stop watching the exit: the pidfd leaves the loop and is closed (again: nothing)."""
        if self._poll is not None:
            self._poll.cancel()
            self._poll = None
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
        self.blind: str | None = None  # why /proc cannot be read now (the run's processes unknown, not none)
        self.unverified: set[int] = set()  # known pids that may be someone else's now: never signalled by pid

    def look(self) -> list[int]:
        try:
            alive = self.proc._members(strict=True)[0]
        except procs.ProcUnreadable as exc:
            return self._blind_look(str(exc))
        if self.blind is not None:
            log.warning("run %s: /proc can be read again: the stop goes on from what it shows", self.proc.record.run_id)
            self.blind, self.unverified = None, set()
        for pid in alive:
            if pid not in self.titles:
                self.titles[pid] = procs.title(pid)
                self.files.add_segments_of(pid, again=True)  # before any signal: a dead process's maps are gone
        return alive

    def _blind_look(self, why: str) -> list[int]:
        """What may still live while /proc cannot be listed: the leader by its pidfd, and each known member (pid and
        start time) not proven gone. A pid whose process cannot be read is kept (unverified: not signalled by pid,
        which may be a stranger's by now, but the stop is not done while it may live); no such pid: gone."""
        if self.blind is None:
            log.error("run %s: stop: %s; which of the run's processes live cannot be told: the stop goes on by the "
                      "pidfd, the process group and the known pids, and is not done (the record kept, serving "
                      "'stopping') until /proc can be read", self.proc.record.run_id, why)
        self.blind = why
        left = [self.proc.pid] if self.proc._leader_running() else []
        unverified = set()
        for pid, ticks in sorted(self.proc.known.items()):
            if pid == self.proc.pid:
                continue
            seen = procs.seen_alive(pid, ticks)
            if seen is False:
                continue
            left.append(pid)
            if seen is None:
                unverified.add(pid)
        self.unverified = unverified
        return left

    async def until_seen(self, kill_wait_s: float, poll_s: float) -> list[int]:
        """After the SIGKILL, /proc still unreadable: no look can confirm the run is gone, so the stop waits for one
        (a stop once called a live server stopped on an empty listing), SIGKILLing the group and the verified
        members meanwhile; then it ends as any stop's kill does."""
        log.error("run %s: stop not confirmed: %s; waiting until /proc can be read", self.proc.record.run_id,
                  self.blind)
        while True:
            await asyncio.sleep(BLIND_RETRY_S)
            left = self.look()
            if self.blind is None:
                return await self.kill(left, kill_wait_s, poll_s)
            self.proc.signal_group(signal.SIGKILL)
            for pid in left:
                self.signal(pid, signal.SIGKILL)

    def signal(self, pid: int, sig: int) -> None:
        if pid in self.unverified:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
            self.sent[pid] = sig

    def _orphan_the_rest(self, left: list[int]) -> None:
        """Once the leader is gone (its children had ORPHAN_SETTLE_S to follow it), all that is left is orphaned."""
        if self.orphans is None and not self.proc._leader_running():
            self._leader_gone_at = self._leader_gone_at or time.monotonic()
            if self.leader_was_dead or time.monotonic() - self._leader_gone_at >= ORPHAN_SETTLE_S:
                self.orphans = []
        if self.orphans is None:
            return
        for pid in left:
            if pid != self.proc.pid and pid not in self.orphans and pid not in self.unverified:
                self.orphans.append(pid)
                self.signal(pid, signal.SIGTERM)

    async def terminate(self, left: list[int], grace_s: float, poll_s: float) -> list[int]:
        """Wait up to `grace_s` for the run to end, SIGTERMing orphans; returns what is still alive."""
        deadline = time.monotonic() + grace_s
        while True:
            self._orphan_the_rest(left)
            if not left and self.blind is None or time.monotonic() >= deadline:
                break
            await asyncio.sleep(poll_s)
            left = self.look()
        if self.orphans is None:  # the grace ended first: if the leader is gone, what it left behind is orphaned
            self.orphans = ([p for p in left if p != self.proc.pid and p not in self.unverified]
                            if not self.proc._leader_running() else [])
        return left

    async def kill(self, left: list[int], kill_wait_s: float, poll_s: float) -> list[int]:
        """SIGKILL the group and every straggler until nothing is left or `kill_wait_s` passed."""
        deadline = time.monotonic() + kill_wait_s
        while (left or self.blind is not None) and time.monotonic() < deadline:
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
        _clean_files(result, self.files, self.proc.record.log_path)
        return result


class RunLogRefused(OSError):
    """The run's log path holds something the agent does not write through (a link, not a regular file, not its
    own): the run is not started. str() names the path and why."""


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
    /dev/null and `log_error` on the result says why, for the caller's event. A log path where something other
    than the agent's own regular file stands (a symlink, a FIFO, a hard link, someone else's file: planted in a
    log directory others can write) is never written through: RunLogRefused (an OSError naming the path), and
    nothing is started, which the caller reports as the start failure it is.
    """
    token = token or new_token()
    log_error: str | None = None
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
        fd = safefile.open_log_append(log_path, 0o640, refused="the run is not started, nothing is written through it")
    except safefile.StateFileError as exc:
        raise RunLogRefused(f"the run's log {exc}") from None
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
    try:  # the server runs from here: it is returned, watched, or killed, never left running unrecorded
        record = ServerRecord(
            run_id=run_id, profile=profile, pid=popen.pid, pgid=popen.pid, start_ticks=_start_ticks(popen.pid),
            argv=list(argv), token=token, log_path=str(log_path),
            started_ms=started_ms if started_ms is not None else int(time.time() * 1000),
            env=redact_env(profile_env, secret_names), tmp_dir=tmp_dir,
        )
        proc = ServerProcess(record, popen, adopted=False)  # no pidfd: its exit is polled (pidfd_error)
    except Exception as exc:
        _kill_unrecorded(popen, tmp_dir)
        refused = OSError(f"pid {popen.pid} was started, then killed with its process group before it could be "
                          f"recorded ({type(exc).__name__}: {exc})")
        refused.errno = exc.errno if isinstance(exc, OSError) else None  # a passing limit stays one (a retry)
        raise refused from exc
    proc.log_error, proc.tmp_error = log_error, tmp_error
    return proc


def _kill_unrecorded(popen: subprocess.Popen, tmp_dir: str | None) -> None:
    """A server spawn could not record: SIGKILL its group (its own session: start_new_session) and reap it."""
    with contextlib.suppress(OSError):
        os.killpg(popen.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        popen.wait(timeout=5.0)
    if tmp_dir is not None and popen.returncode is not None:
        runtmp.remove(tmp_dir)


def _start_ticks(pid: int) -> int:
    """The new process's start time, read again briefly if /proc does not answer at once; 0 (written as null:
    unknown) if it never does. Recorded as a start time, a wrong value would make a later agent take the server
    for a stranger; unknown, the server is adopted on its token and command line (`identify`)."""
    for attempt in range(START_READS):
        st = procs.stat(pid)
        if st is not None:
            return st.start_ticks
        if attempt < START_READS - 1:
            time.sleep(START_READ_GAP_S)
    log.warning("cannot read the start time of pid %d in /proc: recorded as unknown (a later agent adopts it on "
                "its run token and command line)", pid)
    return 0


@dataclass(frozen=True)
class Identity:
    """What the recorded pid is now, for adoption."""

    reason: str | None  # why it is not adopted; None: it is the run's server, to adopt
    ours: bool = False  # not adopted, yet alive and carrying the run's token: the run's, so never signalled
    note: str | None = None  # adopted without its start time confirming it (the record's is wrong or unknown): why
    start_ticks: int = 0  # the live process's start time
    settling: bool = False  # a mismatch a read mid-exec could cause: looked at again


def identify(record: ServerRecord, settle_tries: int = 20, settle_s: float = 0.005) -> Identity:
    """Who the recorded pid is now.

    A server started through wrappers (a pyenv shim, `env`, a shell script) execs several times in its first
    moments, and for the instant of each exec its /proc environ and cmdline read empty: a mismatch is looked at
    again for up to `settle_tries` x `settle_s` before the process is called someone else's.
    """
    for _ in range(settle_tries - 1):
        found = _identify(record)
        if not found.settling:
            return found
        time.sleep(settle_s)
    return _identify(record)


def check_adoptable(record: ServerRecord, settle_tries: int = 20, settle_s: float = 0.005) -> str | None:
    """Why `record` can not be adopted (None: it is the run's live server; `identify`)."""
    return identify(record, settle_tries, settle_s).reason


_OTHER_COMMAND = "runs a different command line"


def _identify(record: ServerRecord) -> Identity:
    """The start time tells a reused pid from the server, the run token tells a stranger from the run.

    A live pid carrying the run's token is the run's: a stranger never has it. With the recorded start time it is
    the server (retitled or not, as before). Without it (the record's start time unknown or not the process's:
    a hand edit, another version's record, /proc unreadable at spawn), the token alone cannot tell the server
    from another process of the run on its reused pid, but the kernel can: a pid is not handed out again while
    a process group or session of that number lives, so a process on the server's pid that leads its own group,
    carries the token and runs the recorded argv is the server. Anything less is held: not adopted, and never
    signalled (`kill_leftovers` would SIGKILL it with the rest of the run)."""
    pid = record.pid
    st = procs.stat(pid)
    if st is None or st.state in ("Z", "X"):
        return Identity(f"pid {pid} is no longer running")
    args = procs.cmdline(pid)
    same_argv = args is not None and _same_command(args, record.argv)
    same_start = record.start_ticks > 0 and st.start_ticks == record.start_ticks
    if same_start and same_argv:
        return Identity(None, start_ticks=st.start_ticks)
    token = procs.environ_has(pid, RUN_TOKEN_ENV, record.token)
    if same_start:
        if token:  # retitled (setproctitle), or its argv read mid-exec: the token says it is the run's
            return Identity(None, start_ticks=st.start_ticks)
        what = f"cannot read the command line of pid {pid}" if args is None else f"pid {pid} {_OTHER_COMMAND}"
        return Identity(what, settling=True)
    start = "start time not recorded" if record.start_ticks <= 0 else "start time differs"
    if not token:  # a stranger on a reused pid (an empty read mid-exec is looked at again first)
        return Identity(f"pid {pid} now belongs to another process ({start}; it does not carry the run's token)",
                        settling=True)
    seen = f"{start}: {record.start_ticks or 'none'} recorded, {st.start_ticks} now"
    if same_argv and st.pgid == pid == record.pgid:
        return Identity(None, start_ticks=st.start_ticks,
                        note=f"pid {pid} adopted on its run token ({seen}): it runs the recorded command line and "
                             "leads the run's process group")
    why = ("its command line cannot be read" if args is None else "it runs a different command line"
           if not same_argv else f"it does not lead the run's process group (pgid {st.pgid}, recorded {record.pgid})")
    return Identity(f"pid {pid} carries the run's token ({seen}) but {why}", ours=True, settling=not same_argv)


def _same_command(cmdline: list[str], argv: list[str]) -> bool:
    """argv as started; a script run through its shebang shows as [interpreter, (flag,) script, args...]."""
    if cmdline == argv:
        return True
    extra = len(cmdline) - len(argv)
    return 0 < extra <= 3 and bool(argv) and cmdline[extra:] == argv


def take_over(record: ServerRecord) -> tuple[ServerProcess | None, Identity]:
    """The recorded server adopted, or None and why not (`Identity.ours`: alive and the run's, never to be
    signalled). Adopted on its token (`Identity.note`), the record gets the process's real start time: the
    run's later looks (its members, its age) and the next agent's identity check use it."""
    found = identify(record)
    if found.reason:
        return None, found
    if found.note:
        record.start_ticks = found.start_ticks
    proc = ServerProcess(record, None, adopted=True)
    if proc.exited:
        return None, Identity(f"pid {record.pid} exited while being adopted")
    return proc, found


def adopt(record: ServerRecord) -> tuple[ServerProcess | None, str | None]:
    proc, found = take_over(record)
    return proc, found.reason


def leader_is_the_runs(record: ServerRecord) -> bool:
    """Whether the recorded pid is alive and carries the run's token: then nothing of the run is a leftover."""
    st = procs.stat(record.pid)
    return (st is not None and st.state not in ("Z", "X")
            and procs.settled_environ_value(st, RUN_TOKEN_ENV) == record.token)


def leftovers(record: ServerRecord) -> list[int]:
    """Processes of a run whose leader is gone, e.g. after the agent was down.

    By token, and by the processes the record names (pid and start time: a retitled one shows no token), never by
    group: the recorded pid (and so the process group id) may belong to someone else by now. Every process is
    looked at: this is rare, and a record may be wrong.
    """
    return procs.run_processes(record.token, None, (), known=dict(record.members))


async def kill_leftovers(record: ServerRecord, wait_s: float = 10.0, poll_s: float = 0.05) -> StopResult:
    """SIGKILL every leftover of a dead run and remove its files; `pids` empty: nothing was left.

    Nothing at all while the recorded pid is alive and carries the run's token: the run is not dead, and its
    server is never signalled here, whatever the record got wrong about it (`leader_was_dead` False)."""
    if leader_is_the_runs(record):
        return StopResult(pids=[], leader_was_dead=False)
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
    _clean_files(result, files, record.log_path)
    return result


def read_record(path: Path, owner: int | None = None) -> tuple[ServerRecord | None, str | None]:
    """(the record, None), (None, None) when there is none, (None, why) when it is unreadable: not a regular file
    (a symlink is not followed, a FIFO not waited on: safefile), or not a record as an agent writes it. Unreadable,
    nothing is adopted and nothing of that run is signalled: the caller says why, and a server still running from
    it holds autostart (the supervisor's strays check) until an operator stops it. `owner`: a record another uid
    owns is unreadable too (safefile.read_text)."""
    try:
        text = safefile.read_text(path, owner=owner)
    except FileNotFoundError:
        return None, None
    except safefile.StateFileError as exc:
        return None, f"{exc}{UNREADABLE}"
    except OSError as exc:
        return None, f"cannot read {path}: {exc}{UNREADABLE}"
    try:
        return ServerRecord.from_json(text), None
    except ValueError as exc:
        return None, f"{path} is not a valid server record ({exc}){UNREADABLE}"


UNREADABLE = ("; ignored: nothing is adopted and nothing is signalled (a server still running from it keeps "
               "serving unsupervised and holds autostart while it lives)")


def write_record(path: Path, record: ServerRecord) -> None:
    """Atomically (write + rename): a crash mid-write must not lose the record of a live 20-minute load."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
    atomic_write(path, record.to_json(), mode=0o640)


def remove_record(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


MIB = 1 << 20
# a caller that passes no budget still has one: the config's default (`[agent] run_logs_max_total_mb`)
RUN_LOGS_MAX_BYTES = AgentConfig.run_logs_max_total_mb * MIB
_LOG_PARTS = (".log.1.tmp", ".log.1", ".log")  # a log's kept part (logcap.py) and a cap cut short by an exit


def log_bytes(st: os.stat_result) -> int:
    """What a log file takes of a disk budget: its allocated blocks (what fills the disk, a reserve left past its
    end included: logreserve.py), never less than its length (a sparse file still takes that to copy or back up;
    the agent's own logs, written O_APPEND, have no holes, so the two agree but for a reserve)."""
    return max(st.st_size, st.st_blocks * 512)


def _run_log_of(name: str) -> str | None:
    """The run log's name a file of `log_dir` belongs to (itself, or the log whose part it is); None: not one."""
    for suffix in _LOG_PARTS:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[:len(name) - len(suffix)] + ".log"
    return None


def prune_logs(log_dir: Path, keep: int, protect: set[str] | frozenset[str] = frozenset(),
               max_bytes: int = RUN_LOGS_MAX_BYTES) -> list[Path]:
    """Delete all but the newest `keep` run logs, and the oldest more until the rest hold at most `max_bytes`
    (0: no byte bound), never one in `protect`: runs are many, disks are not (each ended log may hold
    `run_log_max_mb` and half that again in its `.1`; 200 of them were 150 GB). A protected log's bytes count.

    A log's kept part (`<log>.1`, left by the size cap: logcap.py) is counted and removed with its log, never as a
    log of its own; one whose log is gone counts for that log. Only regular files are counted or removed, looked
    at without following a symlink (one in the directory is not a log the agent wrote, and its target is not
    ours to delete). Returns the logs removed (or whose part was), oldest first."""
    runs: dict[Path, tuple[float, list[tuple[Path, int]]]] = {}  # a run's log -> newest mtime, (file, bytes)
    try:
        names = [p.name for p in log_dir.iterdir()]
    except OSError:
        return []
    for name in names:
        base_name = _run_log_of(name)
        if base_name is None:
            continue
        p = log_dir / name
        try:
            st = p.lstat()
        except OSError:  # gone meanwhile
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        base = log_dir / base_name
        mtime, files = runs.get(base, (0.0, []))
        runs[base] = (max(mtime, st.st_mtime), [*files, (p, log_bytes(st))])
    total = sum(n for _, files in runs.values() for _, n in files)
    newest_first = sorted(runs, key=lambda b: runs[b][0], reverse=True)
    removed = []
    for rank in range(len(newest_first) - 1, -1, -1):  # the oldest first
        base = newest_first[rank]
        if str(base) in protect or (rank < keep and (max_bytes <= 0 or total <= max_bytes)):
            continue
        gone = False
        for p, n in runs[base][1]:
            with contextlib.suppress(OSError):
                p.unlink()
                gone = True
                total -= n
        if gone:
            removed.append(base)
    return removed
