"""`lynxtop runs` and `lynxtop export`: the history database from the command line.

User mistakes (bad times, a missing database, an existing output file) print one clear line and exit 2;
an output that cannot be written (a full disk, /dev/full) prints one line naming it and exits 1; no
traceback reaches the user for those.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
import time
from argparse import Namespace
from pathlib import Path

from lynxtop.contract.format import fmt_datetime, fmt_duration
from lynxtop.contract.jsonsafe import strict_dumps
from lynxtop.contract.records import RunInfo
from lynxtop.contract.terminal import terminal_safe
from lynxtop.store.errors import StoreError
from lynxtop.store.export import ExportError, OutputError, export_all, export_table
from lynxtop.store.reader import NoHistory, StoreReader
from lynxtop.store.times import iso, parse_time


def _err(cmd: str, msg: str) -> int:
    print(terminal_safe(f"lynxtop {cmd}: {msg}", lines=True), file=sys.stderr)
    return 2


def _database(args: Namespace) -> Path | None:
    if getattr(args, "database", None):
        return Path(args.database).expanduser()
    from lynxtop.cli.config_cli import load_or_exit

    cfg = load_or_exit(args)
    return cfg.agent.database if cfg else None


def _open(cmd: str, args: Namespace) -> StoreReader | int:
    path = _database(args)
    if path is None:
        return 2
    try:
        reader = StoreReader(path)
    except StoreError as exc:
        return _err(cmd, str(exc))
    if reader.note:  # a read-only directory: read anyway, and say how
        print(terminal_safe(f"lynxtop {cmd}: note: {reader.note}", lines=True), file=sys.stderr)
    return reader


def _outcome(r: RunInfo) -> str:
    if r.ended_ms is None:
        return "running"
    parts = [r.end_reason or "ended"]
    if r.exit_signal:
        parts.append(f"signal {r.exit_signal}")
    elif r.exit_code is not None:
        parts.append(f"exit {r.exit_code}")
    return ", ".join(parts)


def runs(args: Namespace) -> int:
    if args.limit < 1:
        return _err("runs", f"--limit must be at least 1 (got {args.limit})")
    reader = _open("runs", args)
    if isinstance(reader, int):
        return reader
    try:
        rows = reader.runs(limit=args.limit)
    except StoreError as exc:
        return _err("runs", str(exc))
    except sqlite3.DatabaseError as exc:
        return _err("runs", f"{reader.path}: cannot read the history database: {exc}")
    finally:
        reader.close()
    if args.json:
        print(strict_dumps([r.to_json() for r in rows], indent=2))  # the database's values: never NaN
        return 0
    if not rows:
        print(f"no runs recorded in {reader.path}")
        return 0
    now = int(time.time() * 1000)
    head = ("RUN", "PROFILE", "MODEL", "STARTED (UTC)", "LOAD", "DURATION", "OUTCOME")
    table = [head]
    for r in rows:
        start = r.started_ms
        load = (r.ready_ms - start) / 1000 if r.ready_ms and start else None
        dur = ((r.ended_ms or now) - start) / 1000 if start else None
        model = (r.model or "") + (" (simulated)" if r.simulated else "")
        started = fmt_datetime(start, utc=True, seconds=True).removesuffix(" UTC") if start is not None else ""
        cells = (str(r.id), r.profile or "", model, started,  # the head says UTC; a corrupt start: <bad time N>
                 fmt_duration(load, na="-"), fmt_duration(dur, na="-"), _outcome(r))
        table.append(tuple(map(terminal_safe, cells)))  # the database's words: escaped, then measured
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _silence_stdout() -> None:
    """After a failed write to stdout, point it at /dev/null: the interpreter's final flush of the bytes
    still buffered would otherwise print a second, raw error at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _span_from_args(args: Namespace, now: int) -> tuple[int | None, int | None]:
    """--from/--to as epoch ms; (None, None) with --run (the run's span is read from the database)."""
    if args.run is not None:
        if args.time_to:
            raise ExportError("--to goes with --from, not with --run (a run has its own time span)")
        return None, None
    times = {}
    for option, text in (("--from", args.time_from), ("--to", args.time_to)):
        try:
            times[option] = parse_time(text, now) if text is not None else now
        except ValueError as exc:  # out of range too: never a traceback from iso() further in
            raise ExportError(f"{option}: {exc}") from None
    start, end = times["--from"], times["--to"]
    if end <= start:
        raise ExportError(f"--to ({iso(end)}) must be after --from ({iso(start)})")
    return start, end


def _run_span(reader: StoreReader, run_id: int, now: int) -> tuple[int, int]:
    run = reader.run(run_id, summary=False)
    if run is None:
        raise ExportError(f"no run {run_id} in {reader.path} (see `lynxtop runs`)")
    if run.started_ms is None:
        raise ExportError(f"run {run_id} has no start time recorded; use --from/--to")
    end = (run.ended_ms or now) + 1
    if run.started_ms >= end:  # a wild node clock stored a start in the far future: the span would be empty
        raise ExportError(f"run {run_id}'s recorded start ({iso(run.started_ms)}) is not before its end "
                          f"({iso(end - 1)}); use --from/--to")
    return run.started_ms, end


def _write(reader: StoreReader, args: Namespace, start: int, end: int) -> None:
    raw = bool(getattr(args, "raw", False))
    out = Path(args.output).expanduser() if args.output else None
    if args.table == "all" and out is not None:
        counts = export_all(reader, args.resolution, start, end, out, args.force, raw=raw)
        print(f"wrote {', '.join(f'{t}: {n} rows' for t, n in counts.items())} to {out}", file=sys.stderr)
        return
    n = export_table(reader, args.table, args.resolution, start, end, out, args.force, raw=raw)
    if out is not None and n == 0:
        print(f"note: no {args.table} rows between {iso(start)} and {iso(end)}", file=sys.stderr)


class _Terminated(BaseException):
    """SIGTERM during an export (`timeout 60 lynxtop export ...`, a cron job killed): raised where the export is, so
    the atomic write's cleanup (on any BaseException, as for Ctrl-C) removes its hidden temp file."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise _Terminated


def export(args: Namespace) -> int:
    """`lynxtop export`; SIGTERM ends it as Ctrl-C does (no temp file left behind), with exit 143 (128 + 15)."""
    try:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread (an embedding caller): the default action stays
        previous = None
    try:
        return _export(args)
    except _Terminated:
        where = f" ({args.output} was not written)" if args.output else ""
        print(terminal_safe(f"lynxtop export: terminated (SIGTERM){where}", lines=True), file=sys.stderr)
        return 143
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _export(args: Namespace) -> int:
    now = int(time.time() * 1000)
    try:
        start, end = _span_from_args(args, now)
        if args.table == "all" and not args.output:
            raise ExportError("--table all writes one file per table: give a directory with -o DIR")
    except ExportError as exc:
        return _err("export", str(exc))
    reader = _open("export", args)
    if isinstance(reader, int):
        return reader
    try:
        if args.run is not None:
            start, end = _run_span(reader, args.run, now)
        if start is None or end is None:  # unreachable: argparse requires --run or --from
            return _err("export", "give --run N or --from T")
        _write(reader, args, start, end)
    except OutputError as exc:
        _silence_stdout()
        print(f"lynxtop export: {exc}", file=sys.stderr)
        return 1
    except NoHistory as exc:  # an empty file: nothing to export, as `lynxtop runs` finds no runs in it
        print(terminal_safe(f"lynxtop export: {exc}", lines=True), file=sys.stderr)
        return 0
    except (ExportError, StoreError) as exc:
        return _err("export", str(exc))
    except sqlite3.DatabaseError as exc:  # damage found mid-read
        return _err("export", f"{reader.path}: cannot read the history database: {exc}")
    except BrokenPipeError:
        sys.stderr.close()  # `lynxtop export ... | head` is normal use, not an error
        return 0
    except OSError as exc:
        return _err("export", f"{exc.filename or args.output}: {exc.strerror}")
    finally:
        reader.close()
    return 0
