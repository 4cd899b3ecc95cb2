"""The supervisor's files beside the database, each owned by one class here.

- `ServerState` (serving.json): the running server's record, written before anything awaits so a killed agent's
  successor finds the server (adoption, agent/serving/adoption.py). A failed write is one event per episode and
  is retried while the run lives. A copy is kept beside the control socket (the runtime directory, /run/lynxtop:
  a tmpfs kept across `systemctl restart`), so a full state disk cannot leave a restarted agent without it.
- `Marker` (crash-loop.json, readiness-timeouts.json, switch.json): a small JSON note that outlives the agent: a
  crash loop not to be autostarted again, a switch's target to finish after the agent died mid-switch. Read
  through agent/serving/safefile.py: never through a symlink, never blocking on a FIFO, numbers finite.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lynxtop.agent.serving import launcher, safefile
from lynxtop.contract.events import EventKind, Severity
from lynxtop.contract.files import atomic_write

log = logging.getLogger(__name__)

Emit = Callable[..., Any]  # the run lifecycle's event(kind, severity, message, **details): state and run added


class ServerState:
    """serving.json at `path`, and its copy beside the control socket `socket` (None: no copy).

    Each is written atomically and fails on its own: the primary's failure is an event per episode (an operator
    must know a restart could lose the run), the copy's a log line per episode (the primary still has the run).
    Both are read as launcher.read_record reads (no symlink followed, no FIFO waited on, every field checked) and
    only when the agent's user owns them (`read_owned`); the one describing the later run wins, so a record only
    the copy could take is not lost."""

    def __init__(self, path: Path, emit: Emit, socket: Path | None = None):
        self.path = path
        self._emit = emit
        self._unsaved = False  # the last write failed: retried by `resave` while the run lives
        self.copy = _copy_path(path, socket)
        self._copy_unsaved = False  # the copy's last write failed: logged once, retried like the primary

    def save(self, record: launcher.ServerRecord) -> None:
        self._save_primary(record)
        self._save_copy(record)

    def _save_primary(self, record: launcher.ServerRecord) -> None:
        try:
            launcher.write_record(self.path, record)
        except OSError as exc:
            if not self._unsaved:  # retried until written (a full disk): one event per episode
                self._emit(EventKind.AGENT_STATE_FILE, Severity.WARNING, f"cannot write {self.path}: {exc}; a "
                           "restarted agent will not be able to adopt this run; retrying until it is written")
            self._unsaved = True
            return
        if self._unsaved:
            self._unsaved = False
            self._emit(EventKind.AGENT_STATE_FILE, Severity.INFO, f"{self.path} written again: a restarted agent "
                       "can adopt this run")

    def _save_copy(self, record: launcher.ServerRecord) -> None:
        """Into the existing runtime directory (its owner, the API server, makes it): never made here."""
        if self.copy is None:
            return
        try:  # a rename replaces a symlink there, never writes through it; a tmpfs: no fsync needed
            atomic_write(self.copy, record.to_json(), mode=0o640, fsync=False)
        except OSError as exc:
            if not self._copy_unsaved:
                log.warning("cannot write the copy of the run's record %s: %s (%s still has it)", self.copy, exc,
                            self.path)
            self._copy_unsaved = True
            return
        self._copy_unsaved = False

    def resave(self, record: launcher.ServerRecord) -> None:
        """The state file (or its copy) a failed write left stale or missing, written again once it can be."""
        if self._unsaved:
            self._save_primary(record)
        if self._copy_unsaved:
            self._save_copy(record)

    def read(self) -> tuple[launcher.ServerRecord | None, str | None]:
        """(record, why) as launcher.read_record says; `why` also says when the copy was read instead, and why.
        An unreadable copy never hides a good primary, nor the reverse."""
        record, err = read_owned(self.path)
        if self.copy is None:
            return record, err
        copy, copy_err = read_owned(self.copy)
        if copy_err:
            log.warning("ignoring the copy of the run's record: %s", _reason(copy_err))
        if copy is None or (record is not None and not _later(copy, record)):
            return record, err
        use = f"read the run from its copy {self.copy} (run {copy.run_id}, profile {copy.profile}, pid {copy.pid})"
        if record is not None:
            what = "a later run" if copy.started_ms > record.started_ms else "the same run, and that it got ready"
            return copy, f"{self.copy} records {what} than {self.path} (not rewritten: a full disk?); {use}"
        if err:
            return copy, f"{_reason(err)}; {use}"
        return copy, f"{self.path} is missing (not written: a full disk?); {use}"

    def remove(self) -> None:
        """At the run's end. A record that cannot be removed (a file system gone read-only says EROFS even for a
        file that is not there) is told, never raised: the run's end must go on (its GPUs, its failure count), and a
        next agent finds the record stale (no live process with its pid and start time) and leaves it."""
        try:
            launcher.remove_record(self.path)
        except OSError as exc:
            if os.path.lexists(self.path):
                self._emit(EventKind.AGENT_STATE_FILE, Severity.WARNING, f"cannot remove {self.path}: {exc}; the "
                           "run has ended: the record stays, stale (a restarted agent finds its processes gone)",
                           path=str(self.path), error=str(exc))
        if self.copy is not None:
            try:
                launcher.remove_record(self.copy)
            except OSError as exc:
                log.warning("cannot remove the copy of the run's record %s: %s", self.copy, exc)


def read_owned(path: Path) -> tuple[launcher.ServerRecord | None, str | None]:
    """launcher.read_record, but a record another user owns is not read: (None, why naming its owner). A record
    whose server is gone has every process it names SIGKILLed (launcher.kill_leftovers), so one another user
    planted (beside a socket in a shared directory, in a state directory they may write) would have the agent kill
    any process of the node."""
    return launcher.read_record(path, owner=os.geteuid())


def _copy_path(path: Path, socket: Path | None) -> Path | None:
    """`<socket's stem>.serving.json` beside the socket (two agents may share a runtime directory, never a
    socket); None without a socket, or where the socket shares the state directory (the same disk: no help)."""
    if socket is None or os.path.realpath(socket.parent) == os.path.realpath(path.parent):
        return None
    return socket.with_name(f"{socket.stem}.{path.name}")


def _later(copy: launcher.ServerRecord, primary: launcher.ServerRecord) -> bool:
    """Whether the copy describes a later run than the primary: started later, or on a tie got ready."""
    return (copy.started_ms, copy.ready_ms is not None) > (primary.started_ms, primary.ready_ms is not None)


def _reason(err: str) -> str:
    """read_record's words without their "ignored: nothing is adopted" end, which is not so when the other
    record is read."""
    return err.removesuffix(launcher.UNREADABLE)


class Marker:
    """A JSON note at `path`: written atomically, read back as a dict, removed when its episode ends.

    With `event` (the run lifecycle's), a write that fails (a full disk, a read-only directory) is an
    `agent.state_file` warning saying what a restarted agent will not know (`lost`): the note exists only to outlive
    the agent, and a line in the log alone left the operator believing it would. Once per episode, not at every
    retry that rewrites it: the next write that succeeds ends it (said), as does `clear` (nothing left to keep).
    Without `event` the caller says it (switch.json: agent/serving/switching.py)."""

    def __init__(self, path: Path, event: Emit | None = None):
        self.path = path
        self._event = event
        self._unsaved = False  # the last write failed and was told: the episode goes on until a write or a clear

    def save(self, data: dict[str, Any], lost: str = "") -> OSError | None:
        try:
            atomic_write(self.path, json.dumps(data))
        except OSError as exc:
            if not self._unsaved:
                self._tell(Severity.WARNING, f"cannot write {self.path}: {exc}" + (f"; {lost}" if lost else ""),
                           error=str(exc))
            self._unsaved = True
            return exc
        if self._unsaved:
            self._unsaved = False
            self._tell(Severity.INFO, f"{self.path} written again: a restarted agent reads it")
        return None

    def _tell(self, severity: Severity, message: str, **details: Any) -> None:
        if self._event is not None:
            self._event(EventKind.AGENT_STATE_FILE, severity, message, path=str(self.path), **details)

    def read(self) -> tuple[dict[str, Any] | None, str | None]:
        """(the note, None), (None, None) when there is none, (None, why) when it cannot be read or is not JSON
        as an agent writes it. At agent start this runs on the event loop: it never blocks (safefile)."""
        try:
            data = safefile.read_json(self.path)
        except FileNotFoundError:
            return None, None
        except safefile.StateFileError as exc:
            return None, f"it {exc.reason}"  # the caller names the path
        except (OSError, ValueError) as exc:
            return None, str(exc)
        if not isinstance(data, dict):
            return None, "not a JSON object"
        return data, None

    def clear(self) -> None:
        self._unsaved = False  # its episode is over: a later failed write is news again
        with contextlib.suppress(OSError):
            self.path.unlink()
