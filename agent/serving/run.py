"""One run: a server start, spawned (`Run.launch`) or adopted from a previous agent (`Run.adopt`).

Everything that begins and ends with one server lives here and is made new with it: the process, its run id,
start and ready times, vLLM's version, the start-up phases, why it is degraded, whether its log can be written,
and whether its end was recorded. The supervisor keeps what spans runs (state, failure window, backoff,
the action), so a new run can never inherit a field that one of two hand-written resets forgot.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from lynxtop.agent.serving import launcher, procs
from lynxtop.agent.serving.launcher import ServerProcess, ServerRecord
from lynxtop.agent.serving.startup import PhaseMark, PhaseTracker
from lynxtop.contract.config import Profile
from lynxtop.contract.files import free_bytes
from lynxtop.contract.status import LoadProgress

LOG_SPACE_MIN_BYTES = 1 << 20  # below this on the log's file system, the run's output is being lost


def _wall_ms() -> int:
    return int(time.time() * 1000)


_clock: Callable[[], int] = _wall_ms


def now_ms() -> int:
    """A run's times (start, ready, end, state changes): on the agent's timeline once the node has set it
    (`use_clock`), the clock its samples are stamped with, so a run's span selects its own samples after the wall
    clock was stepped (`export --run`, the run's summary); the wall clock for a supervisor used alone."""
    return _clock()


def use_clock(clock: Callable[[], int] | None) -> None:
    """Stamp the agent's runs with `clock` (None: the wall clock). One timeline per agent process: the node's."""
    global _clock
    _clock = clock or _wall_ms


class Run:
    def __init__(self, proc: ServerProcess, *, run_id: int | None, started_ms: int, ready_ms: int | None,
                 adopted: bool):
        self.proc = proc
        self.run_id = run_id
        self.started_ms = started_ms
        self.ready_ms = ready_ms
        self.adopted = adopted
        self.vllm_version: str | None = None
        self.tracker = PhaseTracker(proc.record.log_path, started_ms)
        self.degraded: dict[str, str] = {}  # condition ("hang", "unresponsive", "health") -> why
        self.log_problem: tuple[str, str] | None = None  # (kind, message) while the run's log cannot be written
        self.finished = False  # its end is recorded (runs row, state file removed, pidfd closed)
        self.crash_reason: str | None = None  # set when it crashed before a stop reached it
        self.outcome: asyncio.Future[bool] = asyncio.get_running_loop().create_future()  # ready (True) or failed
        self.ready_timeout_s: float | None = None  # the readiness timeout it loads under (None: none applies)
        self.ready_deadline_ms: int | None = None  # when it is stopped unless ready (the status shows it)
        proc.watch()

    @classmethod
    def launch(cls, prof: Profile, log_dir: Path, tmp_root: Path | None = None) -> Run:
        """Spawn `prof` with its output in a new log under `log_dir` and its TMPDIR under `tmp_root` (OSError: it
        could not be started)."""
        started = now_ms()
        token = launcher.new_token()
        stamp = datetime.fromtimestamp(started / 1000, UTC).strftime("%Y%m%dT%H%M%SZ")
        log_path = log_dir / f"{stamp}_{prof.name}_{token[:8]}.log"
        proc = launcher.spawn(prof.argv(), log_path, prof.env, prof.name, token=token, started_ms=started,
                              secret_names=prof.secret_env, tmp_root=tmp_root)
        proc.record.readiness_timeout_s = prof.readiness_timeout_s
        run = cls(proc, run_id=None, started_ms=started, ready_ms=None, adopted=False)
        run.ready_timeout_s = prof.readiness_timeout_s
        run.ready_deadline_ms = started + int(prof.readiness_timeout_s * 1000)
        return run

    @classmethod
    def adopt(cls, proc: ServerProcess, record: ServerRecord, readiness_timeout_s: float | None = None) -> Run:
        """`readiness_timeout_s`: the timeout the adopted load runs under (its record's, else its profile's)."""
        run = cls(proc, run_id=record.run_id, started_ms=record.started_ms, ready_ms=record.ready_ms, adopted=True)
        # catch up silently (the previous agent reported those phases), without reading a log of weeks of serving
        # on the event loop before READY=1: a ready run's start-up is over, a loading run's phase is in the tail
        if record.ready_ms is not None:
            run.tracker.start_at_end()
            run.tracker.marks.append(PhaseMark("api up", record.ready_ms))
        else:
            run.tracker.start_at_tail()
            # each phase found stamped from its line's time, not this adoption's: the durations stay real
            run.tracker.catch_up(now_ms())
        if readiness_timeout_s is not None and not run.was_ready:
            # counted from the process's start on the boot clock, as the readiness watch counts it: a wall clock
            # stepped while no agent ran moves neither the deadline nor the time shown as left
            elapsed = procs.age_s(record.start_ticks)
            now = now_ms()
            if elapsed is None:
                elapsed = max(0.0, (now - (record.started_ms or now)) / 1000)
            run.ready_timeout_s = readiness_timeout_s
            run.ready_deadline_ms = now + int((readiness_timeout_s - elapsed) * 1000)
        return run

    @property
    def log_path(self) -> str:
        return self.proc.record.log_path

    @property
    def was_ready(self) -> bool:
        """Adopted after it had become ready under the previous agent."""
        return self.adopted and self.proc.record.ready_ms is not None

    @property
    def load_progress(self) -> LoadProgress | None:
        """The checkpoint shards' last progress while the weights load (None in the other phases: the bar is
        over once they are read)."""
        p = self.tracker.progress
        if p is None or self.tracker.phase != "loading weights":
            return None
        return LoadProgress(done=p[0], total=p[1], pct=p[2])

    def new_phases(self) -> list[PhaseMark]:
        return self.tracker.poll(now_ms())

    def resolve(self, ok: bool) -> None:
        if not self.outcome.done():
            self.outcome.set_result(ok)

    # ------------------------------------------------------------------------------------- degraded

    def mark_degraded(self, condition: str, reason: str) -> bool:
        """Record why the run is degraded; True when this condition is new."""
        new = condition not in self.degraded
        self.degraded[condition] = reason
        return new

    def clear_degraded(self, condition: str) -> bool:
        """True when the condition was there."""
        return self.degraded.pop(condition, None) is not None

    def degraded_reason(self) -> str:
        return "; ".join(self.degraded.values())

    # ------------------------------------------------------------------------------------- log

    def check_log(self) -> tuple[tuple[str, str] | None, tuple[str, str] | None]:
        """(the problem now, the one before): a run whose output cannot be written is told once per episode."""
        problem: tuple[str, str] | None = None
        path = Path(self.log_path)
        if self.proc.log_error:
            problem = ("create", self.proc.log_error)
        else:
            free = free_bytes(path.parent)
            if free is None:
                problem = ("stat", f"cannot check the free space of the run's log {path}")
            elif free < LOG_SPACE_MIN_BYTES:
                problem = ("space", f"the file system of the run's log {path} is full ({free} bytes free)")
        was, self.log_problem = self.log_problem, problem
        return problem, was
