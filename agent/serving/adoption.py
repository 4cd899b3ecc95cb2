"""Adoption (live restore): the server a previous agent left running is taken over, never restarted.

Owns the decision at agent start: serving.json read (agent/serving/statefiles.py), the process's identity checked
(`launcher.take_over`: pid, start time, command line, run token), the profile it is supervised with, and the run's
row. A server that is gone or not ours any more is cleaned up (its leftovers killed, its row closed) and nothing is
adopted. A live recorded pid carrying the run's token is never signalled: adopted when it is provably the server
(on its token and command line if the record's start time is wrong or unknown), else held as it is, for an
operator. An unreadable record adopts and kills nothing. The run lifecycle takes what `find` returns and watches it
like any run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lynxtop.agent.serving import launcher, procs
from lynxtop.agent.serving.launcher import ServerProcess
from lynxtop.agent.serving.run import now_ms
from lynxtop.agent.serving.runstore import RunStore, store_call
from lynxtop.agent.serving.statefiles import ServerState
from lynxtop.agent.serving.stopping import files_text
from lynxtop.contract.config import Config, Profile
from lynxtop.contract.events import EventKind, Severity

log = logging.getLogger(__name__)

# An adopted server whose profile was removed from the config is stopped with these defaults.
FALLBACK_GRACE_S = 60.0


@dataclass(frozen=True)
class Adopted:
    proc: ServerProcess
    record: launcher.ServerRecord
    profile: Profile


def with_address_of(prof: Profile, argv: list[str]) -> Profile:
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


class Adoption:
    def __init__(self, state: ServerState, store: RunStore, event: Callable[..., Any], config: Callable[[], Config],
                 *, host: str, simulated: bool):
        self._state = state
        self._store = store
        self._event = event  # the lifecycle's event call
        self._config = config
        self._host = host
        self._simulated = simulated
        self.held: launcher.ServerRecord | None = None  # the run held at this agent's start, until it is stopped

    async def find(self, stopping: int | None = None) -> Adopted | None:
        """The server the previous agent left, adopted; or None (nothing recorded, or cleaned up after it).
        `stopping`: the run an operator's stop was ending when the previous agent ended (its end is a stop)."""
        record, err = self._state.read()
        if err:
            self._event(EventKind.AGENT_STATE_FILE, Severity.WARNING, err)
        if record is None:
            return None
        proc, found = launcher.take_over(record)
        if proc is None:
            if found.ours:
                self._held(record, found.reason or "?")
            else:
                stopped = stopping is not None and record.run_id == stopping
                await self._not_adopted(record, found.reason or "?", stopped=stopped)
            return None
        if found.note:  # the record's start time was wrong or unknown: adopted on the token, and said so
            self._event(EventKind.AGENT_STATE_FILE, Severity.WARNING,
                        f"{self._state.path}: {found.note}; the record is corrected when the run is next saved",
                        pid=record.pid, run_id_prev=record.run_id)
        prof = self._profile(record)
        if record.run_id is not None:
            if record.ready_ms is None:  # its save at READY may have failed (a full disk): the row may know
                record.ready_ms = (await asyncio.to_thread(self._row_times, record.run_id))[0]
            await self._restore_row(record)
        return Adopted(proc, record, prof)

    def _held(self, record: launcher.ServerRecord, why: str) -> None:
        """The recorded server is alive and carries the run's token, but cannot be proven to be the server itself:
        not adopted, and nothing of the run is signalled or removed (its token says it is the run's: killing it
        would throw away a load of up to 20 minutes). Its record and row stay; it holds autostart while it lives
        (the supervisor's strays check); an operator decides: `lynxtop stop` ends it (heldstop.py)."""
        self.held = record
        self._event(EventKind.SERVING_NOT_ADOPTED, Severity.WARNING,
                    f"previous run {record.run_id} (profile {record.profile}) not adopted: {why}; its run token "
                    f"says it is that run's, so nothing of it is signalled and it keeps serving, unsupervised "
                    f"({self._state.path} is kept; `lynxtop start` refuses while it lives). To go on: check it "
                    f"(ps -fp {record.pid}), then `lynxtop stop` ends it and closes the run (SIGTERM to the API "
                    f"server, which stops its engine; SIGKILL after the grace), as kill {record.pid} would",
                    run_id_prev=record.run_id, about_run=record.run_id, pid=record.pid, held=True, pids=[])

    async def close_held(self) -> launcher.StopResult | None:
        """After an operator's stop ended the held run (heldstop.py): what it left removed (its files), its row
        closed as stopped by the operator, its record removed. None, all kept: nothing is held, or its server
        still lives. ProcUnreadable: what is left cannot be looked for (all kept, as `_not_adopted` keeps it)."""
        record = self.held
        if record is None or await asyncio.to_thread(launcher.leader_is_the_runs, record):
            return None
        res = await launcher.kill_leftovers(record)
        self.held = None
        if record.run_id is not None and (await asyncio.to_thread(self._row_times, record.run_id))[1] is None:
            await self._restore_row(record)
            await store_call(self._store.update_run, record.run_id, ended_ms=now_ms(),
                             end_reason="stopped by operator")
        self._state.remove()
        return res

    async def _not_adopted(self, record: launcher.ServerRecord, why: str, stopped: bool = False) -> None:
        """The recorded server is gone or not ours any more: kill what is left of its run and close its row.
        `stopped`: an operator's stop of it was under way (its end is that stop's, said as such). /proc that cannot
        be listed (the agent out of descriptors) says nothing of what is left: nothing is signalled or closed, and
        the record stays for the next agent's look."""
        try:
            res = await launcher.kill_leftovers(record)
        except procs.ProcUnreadable as exc:
            self._event(EventKind.SERVING_NOT_ADOPTED, Severity.WARNING,
                        f"previous run {record.run_id} (profile {record.profile}) not adopted: {why}; what is left "
                        f"of it cannot be looked for ({exc}), so nothing of it is signalled and its record "
                        f"{self._state.path} is kept: the agent's next start looks again",
                        run_id_prev=record.run_id, about_run=record.run_id, pids=[], kept=True)
            return
        extra = (f"; killed {len(res.pids)} leftover process(es) of that run: "
                 + ", ".join(o.describe() for o in res.orphans)) if res.pids else ""
        head = (f"previous run {record.run_id} (profile {record.profile}), whose stop by an operator was under way "
                f"when the previous agent ended, is gone: the stop is finished" if stopped else
                f"previous run {record.run_id} (profile {record.profile}) not adopted")
        self._event(EventKind.SERVING_NOT_ADOPTED, Severity.INFO if stopped else Severity.WARNING,
                    f"{head}: {why}{extra}{files_text(res)}", run_id_prev=record.run_id, about_run=record.run_id,
                    pids=res.pids, orphans=[dataclasses.asdict(o) for o in res.orphans], removed=res.removed,
                    not_removed=res.not_removed)
        if res.survivors:
            self._event(EventKind.SERVING_UNKILLABLE, Severity.CRITICAL, f"previous run {record.run_id}: "
                        f"process(es) still alive after SIGKILL: {res.survivors}", pids=res.survivors,
                        about_run=record.run_id)
        if record.run_id is not None:
            if (await asyncio.to_thread(self._row_times, record.run_id))[1] is not None:
                self._state.remove()  # its row is closed already: a stale record (an old copy), not this run's end
                return
            await self._restore_row(record)
            await store_call(self._store.update_run, record.run_id, ended_ms=now_ms(),
                             end_reason="stopped by operator" if stopped else f"lost while the agent was down: {why}")
        self._state.remove()

    def _profile(self, record: launcher.ServerRecord) -> Profile:
        """The profile an adopted server is supervised with: the config's, on the address and readiness timeout
        the server was really started with (a fallback when the profile was removed)."""
        prof = self._config().profile(record.profile)
        if prof is None:
            # keep serving; stop and readiness use the recorded argv's host/port defaults
            prof = Profile(name=record.profile, executable=record.argv[0] if record.argv else "?",
                           model=record.argv[2] if len(record.argv) > 2 else "?",
                           stop_grace_s=FALLBACK_GRACE_S)
            self._event(EventKind.SERVING_ADOPTED_UNKNOWN_PROFILE, Severity.WARNING,
                        f"adopted run {record.run_id} uses profile {record.profile!r}, which is no longer in the "
                        "config; it keeps running")
        elif prof.argv() != record.argv:
            self._event(EventKind.SERVING_ADOPTED_PROFILE_CHANGED, Severity.WARNING,
                        f"profile {record.profile} changed in the config since run {record.run_id} started; the "
                        "adopted server keeps its old flags until it is restarted")
        prof = with_address_of(prof, record.argv)
        if isinstance(record.readiness_timeout_s, (int, float)) and record.readiness_timeout_s > 0:
            prof = dataclasses.replace(prof, readiness_timeout_s=float(record.readiness_timeout_s))
        return prof

    def _row_times(self, run_id: int) -> tuple[int | None, int | None]:
        """When the run's row says it became ready and ended (None: not so, no row, or no readable history). The
        record is saved at spawn and again at READY; the history's row is another copy of that time, and without it
        a model serving for hours would be adopted as a load long past its readiness timeout. A row ended already
        is not closed again by a stale record."""
        path = self._config().agent.database
        try:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2.0)
        except sqlite3.Error as exc:
            log.warning("cannot read run %s's row in %s: %s", run_id, path, exc)
            return None, None
        try:
            row = conn.execute("SELECT ready_ms, ended_ms FROM runs WHERE id = ?", (int(run_id),)).fetchone()
        except sqlite3.Error as exc:
            log.warning("cannot read run %s's row in %s: %s", run_id, path, exc)
            return None, None
        finally:
            conn.close()
        if not row:
            return None, None
        ready, ended = row
        return (ready if isinstance(ready, int) else None), (ended if isinstance(ended, int) else None)

    async def _restore_row(self, record: launcher.ServerRecord) -> None:
        """The run's row from serving.json when the history lacks it (the previous agent ended while the disk
        was full, its queued row unwritten); an existing row is left as it is."""
        await store_call(
            self._store.create_run, run_id=record.run_id, profile=record.profile, argv=record.argv,
            model=record.argv[2] if len(record.argv) > 2 else None, host=self._host, started_ms=record.started_ms,
            pid=record.pid, pid_start_time=record.start_ticks, log_path=record.log_path,
            simulated=self._simulated or launcher.runs_simulator(record.argv),
            ready_ms=record.ready_ms)
