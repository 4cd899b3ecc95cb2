"""`lynxtop events`: the agent's event log on a terminal (over SSH, without the dashboard).

Read through the agent's socket (`GET /v1/events`, open to every user) when the agent answers, else from the
history database read-only, as `lynxtop runs` reads it (`--database` reads the database directly). Newest last;
times in local time with its UTC offset (`2026-12-01 15:30:00+05:30`; `--utc`: `... UTC`), which `--since` reads
back as the same instant. Every stored or served string (kind, message) is foreign text and goes through
terminal_safe. A bad argument is one line and exit 2; none matching is exit 0
with "no events match". A newer agent's kind this version does not know is shown as it is, beside the others
(contract/events.py: `UnknownKind`); `--kind` names it whole to filter on it. While the history cannot be written
the agent also serves the events it holds in memory; they are marked [pending] (`"pending": true` with --json);
while it cannot even open it, those alone, with a note on stderr saying why the stored ones are missing.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from argparse import Namespace
from pathlib import Path

from lynxtop.contract.events import Event, EventKind, Severity, kind_problem
from lynxtop.contract.format import fmt_datetime
from lynxtop.contract.jsonsafe import strict_dumps
from lynxtop.contract.terminal import terminal_safe

SOCKET_MAX = 10_000  # the most `GET /v1/events` gives in one answer (agent/api/routes.py)
SEVERITIES = tuple(s.value for s in Severity)  # least to most severe
EXIT_UNREACHABLE = 3


def _err(msg: str, code: int = 2) -> int:
    print(terminal_safe(f"lynxtop events: {msg}", lines=True), file=sys.stderr)
    return code


def _note(msg: str) -> None:
    print(terminal_safe(f"lynxtop events: note: {msg}", lines=True), file=sys.stderr)


def _kinds(prefix: str | None) -> list[str] | None:
    """The known kinds that start with `prefix` (None: all); ValueError when none does."""
    if prefix is None:
        return None
    kinds = [k.value for k in EventKind if k.value.startswith(prefix)]
    if not kinds and kind_problem(prefix) is None:  # a whole kind this version lacks: a newer agent's, as stored
        _note(f"--kind {prefix}: not a kind this lynxtop knows; showing events stored under that name (a newer "
              "agent's kind)")
        return [prefix]
    if not kinds:
        families = sorted({k.value.split(".")[0] + "." for k in EventKind if "." in k.value})
        raise ValueError(f"--kind {prefix!r}: no event kind starts with it (a family such as "
                         f"{', '.join(families)} or one kind such as sla.breach)")
    return kinds


def _severities(minimum: str | None) -> list[str] | None:
    return None if minimum is None else list(SEVERITIES[SEVERITIES.index(minimum):])


def _matches(ev: Event, since_ms: int | None, kinds: list[str] | None, severities: list[str] | None,
             run: int | None) -> bool:
    return ((since_ms is None or (ev.ts_ms is not None and ev.ts_ms >= since_ms))
            and (kinds is None or str(ev.kind) in kinds)
            and (severities is None or str(ev.severity) in severities)
            and (run is None or ev.run_id == run))


def _from_socket(path: str, args: Namespace, since_ms: int | None, kinds: list[str] | None,
                 severities: list[str] | None) -> list[Event]:
    """The newest events the agent serves, filtered here (the API takes only `since` and `limit`). Raises
    AgentUnreachable / AgentRefused."""
    from lynxtop.contract.client import AgentClient, events_of

    data = AgentClient(path).request("GET", "/v1/events", {"limit": SOCKET_MAX})
    got = events_of(data, path)  # newest, oldest first
    why = data.get("history_error")
    if why:  # the database cannot be opened: only the events the agent holds in memory are listed
        _note(f"the agent's history cannot be read ({why}); only the events it holds in memory are listed")
    picked = [e for e in got if _matches(e, since_ms, kinds, severities, args.run)]
    oldest = got[0].ts_ms if got else None
    if len(got) >= SOCKET_MAX and len(picked) < args.limit and (since_ms is None or (oldest or 0) > since_ms):
        _note(f"only the agent's newest {SOCKET_MAX} events were searched; give --database PATH to search all")
    return picked[-args.limit:]


def _database(args: Namespace, cfg_db: Path | None) -> Path | None:
    if getattr(args, "database", None):
        return Path(args.database).expanduser()
    return cfg_db


def _from_database(path: Path, args: Namespace, since_ms: int | None, kinds: list[str] | None,
                   severities: list[str] | None) -> list[Event] | int:
    from lynxtop.store.errors import StoreError
    from lynxtop.store.reader import NoHistory, StoreReader

    try:
        reader = StoreReader(path)
    except NoHistory:
        return []
    except StoreError as exc:
        return _err(str(exc))
    if reader.note:  # a read-only directory: read anyway, and say how
        _note(reader.note)
    try:
        # the newest `limit` that match (oldest first); the lower bound is applied after, so that the newest
        # are kept: the reader's since_ms pages forward from the oldest
        got = reader.events(kinds=kinds, severities=severities, run_id=args.run, limit=args.limit)
    except NoHistory:
        return []
    except StoreError as exc:
        return _err(str(exc))
    except sqlite3.DatabaseError as exc:
        return _err(f"{reader.path}: cannot read the history database: {exc}")
    finally:
        reader.close()
    return [e for e in got if since_ms is None or (e.ts_ms is not None and e.ts_ms >= since_ms)]


PENDING = "[pending] "  # before the message of an event the agent holds in memory, not in the database yet


def _print(events: list[Event], args: Namespace) -> None:
    if args.json:
        for ev in events:
            # ASCII: a control character is \u001b, never sent raw; strict: a stored NaN detail is null
            print(strict_dumps(ev.to_json()))
        return
    # local times carry their UTC offset: pasted into --since (zone-less reads as UTC) they are the same instant
    rows = [(fmt_datetime(ev.ts_ms, utc=args.utc, seconds=True, zone=True) if ev.ts_ms is not None else "-",
             terminal_safe(ev.severity), terminal_safe(ev.kind),
             f"run {ev.run_id}" if ev.run_id is not None else "-",
             (PENDING if ev.pending else "") + terminal_safe(ev.message))
            for ev in events]
    head = ("TIME (UTC)" if args.utc else "TIME", "SEVERITY", "KIND", "RUN", "MESSAGE")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    for row in [head, *rows]:
        print("  ".join([*(v.ljust(w) for v, w in zip(row[:4], widths, strict=True)), row[4]]).rstrip())


def run(args: Namespace) -> int:
    from lynxtop.contract.client import AgentRefused, AgentUnreachable
    from lynxtop.store.times import parse_time

    now = int(time.time() * 1000)
    try:
        since_ms = parse_time(args.since, now) if args.since is not None else None
        kinds = _kinds(args.kind)
    except ValueError as exc:
        return _err(str(exc) if str(exc).startswith("--kind") else f"--since: {exc}")
    severities = _severities(args.severity)

    events: list[Event] | int
    if getattr(args, "database", None):
        events = _from_database(_database(args, None), args, since_ms, kinds, severities)  # type: ignore[arg-type]
    else:
        cfg = None
        socket = getattr(args, "socket", None)
        if not socket:
            from lynxtop.cli.config_cli import load_or_exit

            cfg = load_or_exit(args)
            if cfg is None:
                return 2
            socket = str(cfg.agent.socket)
        try:
            events = _from_socket(str(socket), args, since_ms, kinds, severities)
        except AgentRefused as exc:
            return _err(f"{exc.code}: {exc.message}", 1)
        except AgentUnreachable as exc:
            if getattr(args, "socket", None):  # this agent was asked for: no other source stands in
                return _err(str(exc), EXIT_UNREACHABLE)
            assert cfg is not None
            _note(f"the agent does not answer ({exc}); reading the history database {cfg.agent.database}")
            events = _from_database(cfg.agent.database, args, since_ms, kinds, severities)
    if isinstance(events, int):
        return events
    if not events:
        print("no events match", file=sys.stderr if args.json else sys.stdout)
        return 0
    _print(events, args)
    held = sum(ev.pending for ev in events)
    if held:
        _note(f"{held} event(s) marked {PENDING.strip()} are held in the agent's memory: the history database "
              "cannot be written now (see `lynxtop status`); they are stored once writes resume")
    return 0
