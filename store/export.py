"""Streamed CSV export: a header row, then `time_utc` (ISO-8601) and `ts_ms` first, NULL as an empty field.

Rows go from an SQLite cursor to `csv.writer.writerows` in chunks, with the ISO time computed by SQLite, so
memory stays constant and the speed stays near the sqlite3 shell's. A file is written to a temporary name
beside the target and renamed at the end: an interrupted export never leaves a half file under the name.
"""

from __future__ import annotations

import csv
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from lynxtop.store.reader import StoreReader
from lynxtop.store.schema import RESOLUTIONS, RUN_COLUMNS, SAMPLE_TABLES, rollup_columns, rollup_table

TABLES = ("gpu", "host", "serving", "events", "runs")
CHUNK = 500  # rows per fetch: ~0.5 MB of Python objects, whatever the export size
_ISO = "strftime('%Y-%m-%dT%H:%M:%fZ', {col} / 1000.0, 'unixepoch')"


class ExportError(Exception):
    """A user-facing problem with an export request (exit 2)."""


@dataclass(frozen=True)
class Query:
    sql: str
    params: tuple
    count_sql: str


def build_query(table: str, resolution: str, start_ms: int, end_ms: int) -> Query:
    """The SELECT for one table, ordered by time, with the ISO time and epoch ms first."""
    iso = _ISO.format(col="ts_ms")
    if table in ("gpu", "host", "serving"):
        t = SAMPLE_TABLES[table]
        key = "ts_ms, gpu" if t.per_gpu else "ts_ms"
        if resolution == "raw":
            name, cols = t.name, [m[0] for m in t.metrics]
        else:
            name, cols = rollup_table(table, resolution), [c for c, _ in rollup_columns(table)]
        where = f"FROM {name} WHERE ts_ms >= ? AND ts_ms < ?"
        return Query(f"SELECT {iso} AS time_utc, {key}, {', '.join(cols)} {where} ORDER BY {key}",
                     (start_ms, end_ms), f"SELECT count(*) {where}")
    if table == "events":
        where = "FROM events WHERE ts_ms >= ? AND ts_ms < ?"
        return Query(f"SELECT {iso} AS time_utc, ts_ms, id, run_id, kind, severity, message, details {where} "
                     "ORDER BY ts_ms, id", (start_ms, end_ms), f"SELECT count(*) {where}")
    if table == "runs":
        cols = ", ".join(c for c, _ in RUN_COLUMNS)
        where = "FROM runs WHERE started_ms < ? AND (ended_ms IS NULL OR ended_ms >= ?)"
        return Query(f"SELECT {_ISO.format(col='started_ms')} AS time_utc, started_ms AS ts_ms, id, {cols} {where} "
                     "ORDER BY started_ms, id", (end_ms, start_ms), f"SELECT count(*) {where}")
    raise ExportError(f"unknown table {table!r} (known: {', '.join(TABLES)})")


class Progress:
    """A one-line bar on stderr, redrawn at most 5 times a second; a plain final line when not a TTY."""

    def __init__(self, stream: TextIO, total: int, label: str):
        self.stream, self.total, self.label = stream, total, label
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.last = 0.0

    def update(self, done: int, final: bool = False) -> None:
        now = time.monotonic()
        if not final and (not self.tty or now - self.last < 0.2):
            return
        self.last = now
        frac = done / self.total if self.total else 1.0
        bar = "#" * int(frac * 30)
        line = f"{self.label}: [{bar:<30}] {frac:4.0%} {done}/{self.total} rows"
        if self.tty:
            self.stream.write("\r" + line + ("\n" if final else ""))
        elif final:
            self.stream.write(line + "\n")
        self.stream.flush()


def write_csv(reader: StoreReader, q: Query, out: TextIO, progress: Progress | None = None) -> int:
    names, cur = reader.stream(q.sql, q.params)
    w = csv.writer(out, lineterminator="\n")
    w.writerow(names)
    n = 0
    try:
        while True:
            rows = cur.fetchmany(CHUNK)
            if not rows:
                break
            w.writerows(rows)
            n += len(rows)
            if progress:
                progress.update(n)
    finally:
        cur.close()  # ends the read snapshot so the writer's checkpoints can proceed
    if progress:
        progress.update(n, final=True)
    return n


def export_table(reader: StoreReader, table: str, resolution: str, start_ms: int, end_ms: int,
                 output: Path | None, force: bool = False, progress_stream: TextIO | None = None) -> int:
    """Export one table to `output` (a file, atomically) or stdout; returns the row count."""
    if resolution != "raw" and resolution not in RESOLUTIONS:
        raise ExportError(f"unknown resolution {resolution!r} (known: raw, {', '.join(RESOLUTIONS)})")
    if table in ("events", "runs"):
        resolution = "raw"
    q = build_query(table, resolution, start_ms, end_ms)
    if output is None:
        return write_csv(reader, q, sys.stdout)
    if output.exists() and not force:
        raise ExportError(f"{output} already exists; use --force to overwrite it")
    if output.is_dir():
        raise ExportError(f"{output} is a directory; give a file name (or use --table all for a directory)")
    if not output.parent.is_dir():
        raise ExportError(f"{output.parent} does not exist")
    total = reader.stream(q.count_sql, q.params)[1].fetchone()[0]
    prog = Progress(progress_stream or sys.stderr, total, f"{output.name}")
    fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".part", dir=output.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)  # mkstemp's 0600 would surprise; honour the user's umask like `>` does
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
            n = write_csv(reader, q, f, prog)
        os.replace(tmp, output)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return n


def export_all(reader: StoreReader, resolution: str, start_ms: int, end_ms: int, directory: Path,
               force: bool = False, progress_stream: TextIO | None = None) -> dict[str, int]:
    """One file per table in `directory` (created if absent); checks every target before writing any."""
    if directory.exists() and not directory.is_dir():
        raise ExportError(f"{directory} is not a directory (--table all writes one file per table into it)")
    def name(t: str) -> str:
        return f"{t}.csv" if t in ("events", "runs") or resolution == "raw" else f"{t}_{resolution}.csv"

    targets = {t: directory / name(t) for t in TABLES}
    existing = [str(p) for p in targets.values() if p.exists()]
    if existing and not force:
        raise ExportError(f"{', '.join(existing)} already exist(s); use --force to overwrite")
    directory.mkdir(parents=True, exist_ok=True)
    return {t: export_table(reader, t, resolution, start_ms, end_ms, p, True, progress_stream)
            for t, p in targets.items()}
