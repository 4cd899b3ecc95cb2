"""Streamed CSV export: a header row, then `time_utc` (ISO-8601) and `ts_ms` first, NULL as an empty field.

Text cells that a spreadsheet would run as a formula (starting with = + - @ tab or CR: OWASP "CSV
Injection") get a leading single quote unless `raw` is asked for; numeric columns are never changed.

SQLite renders each row as one CSV line (ISO time, empty NULLs, quoting of text) and Python only writes
those lines in pages: memory stays constant and the speed stays at the sqlite3 shell's. Each page is read in
its own short read transaction and continues after the last key of the one before (keyset paging), so an
export whose output is not read (`| less` left open) holds no snapshot: the writer's checkpoints still reset
the WAL. The range ends at the newest row stored when the export starts (fixed then: a long export is a
stable range); raw rows and compacted chunks are read together in each page (StoreReader.with_chunks), so
compaction or retention between two pages neither repeats nor drops a row still stored. A file is written
to a temporary name beside the target and renamed at the end: an interrupted export never leaves a half
file under the name. A FIFO or a character device named with -o for one table (`-o >(gzip > x)`, /dev/stdout)
is written into as it is: --force replaces regular files only. `--table all -o DIR` names no file: a link or a
special file at a table's name in DIR is refused (export_all).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from lynxtop.contract.events import LEGACY_KINDS
from lynxtop.contract.files import atomic_write
from lynxtop.contract.terminal import terminal_safe
from lynxtop.store.reader import StoreReader
from lynxtop.store.schema import COMPACTED, RESOLUTIONS, RUN_COLUMNS, SAMPLE_TABLES, rollup_columns, rollup_table

TABLES = ("gpu", "host", "serving", "events", "runs")
# Rows per page, each page one read transaction: under 1 MB of lines, whatever the export size; the
# transaction and the keyset probe cost well under 1 % of rendering them.
PAGE_ROWS = 2000
_WRITE_LINES = 500  # lines per write() (one joined string each)
_ISO = "strftime('%Y-%m-%dT%H:%M:%fZ', {col} / 1000.0, 'unixepoch')"


class ExportError(Exception):
    """A user-facing problem with an export request (exit 2)."""


# An older agent's event kind exported under its dotted name, as StoreReader.events reads it.
_KIND = "(CASE kind {} ELSE kind END)".format(" ".join(f"WHEN '{old}' THEN '{new.value}'"
                                                         for old, new in LEGACY_KINDS.items()))
_EXPRS = {"events": {"kind": _KIND}}  # columns exported as an expression (the header keeps the column name)

# First characters a spreadsheet takes as the start of a formula (OWASP "CSV Injection").
_FORMULA_START = "'=', '+', '-', '@', char(9), char(13)"
_INT64_MAX, _INT64_MIN = 2**63 - 1, -(2**63)  # SQL literals: the second is an integer in SQLite too


def _field(col: str, typ: str, raw: bool = False, expr: str | None = None) -> str:
    """SQL for one field: text quoted when it holds a comma, quote or newline (printf's %s makes NULL empty).

    Unless `raw`, a text cell starting like a formula gets a leading ' (spreadsheets then show it as text);
    INTEGER/REAL columns are written as they are, so numbers, negative ones too, stay numbers; an infinite one
    (stored by an older agent) is an empty cell, no reading, as NULL is: "Inf" is no number to a spreadsheet.
    An older writer stored +-Inf in an INTEGER column as INT64 max/min (CAST(? + 0.5 AS INTEGER)), so there
    those two are infinities too (no reading comes near 9.2e18). Plain comparisons only: abs() of INT64 min
    raises "integer overflow", which failed the whole table's export.
    """
    col = expr or col
    if typ == "INTEGER":  # >= INT64 max also holds for a REAL +Inf; 9e999 is SQLite's +Inf
        return f"CASE WHEN {col} >= {_INT64_MAX} OR {col} <= {_INT64_MIN} THEN NULL ELSE {col} END"
    if typ != "TEXT":
        return f"CASE WHEN {col} >= 9e999 OR {col} <= -9e999 THEN NULL ELSE {col} END"
    val = col if raw else f"(CASE WHEN substr({col}, 1, 1) IN ({_FORMULA_START}) THEN '''' || {col} ELSE {col} END)"
    return (f"CASE WHEN {col} GLOB '*[,\"'||char(10)||char(13)||']*' "
            f"THEN '\"'||replace({val}, '\"', '\"\"')||'\"' ELSE {val} END")


def _line(fields: list[str]) -> str:
    """One printf per 50 fields (SQLite caps function arguments at 127), joined by commas."""
    parts = []
    for i in range(0, len(fields), 50):
        chunk = fields[i:i + 50]
        parts.append(f"printf('{','.join(['%s'] * len(chunk))}', {', '.join(chunk)})")
    return " || ',' || ".join(parts)


@dataclass(frozen=True)
class Query:
    header: list[str]
    sql: str  # one column: the CSV line, rendered by SQLite (one Python object per row, not one per field)
    params: tuple  # (start_ms, end_ms)
    count_sql: str
    plain_sql: str  # the same rows and columns as ordinary SELECT (for the sqlite3 shell comparison)
    table: str  # the SQL table read
    line: str  # the CSV line's expression
    key: tuple[str, ...]  # the order: unique per row, so a page continues after the last key of the one before
    cond: str  # the WHERE condition over ?1 = start and ?2 = end
    ranged: bool  # cond is key[0] in [?1, ?2): a page narrows it (a raw or rollup sample table, events)

    def page_sql(self, after: bool, rows: int, source: str | None = None) -> str:
        """One page: `rows` at most, in key order, each row its line then its key; with `after`, past the key
        (?3, ?4) the last page ended on. The key's first column stays a range bound (?1 moves up to ?3 for a
        ranged table), so each page is one index range probe that starts where the last page ended, however far
        into the export. `source` replaces the table after FROM (StoreReader.chunk_source: raw rows and decoded
        chunks); the key columns in the result let SQLite merge the two in key order instead of sorting them."""
        keys = ", ".join(self.key)
        cond = self.cond
        if after:
            first = self.key[0]
            cond += f" AND {first} >= ?3 AND " + (f"({first} > ?3 OR {self.key[1]} > ?4)" if len(self.key) > 1
                                                   else f"{first} > ?3")
        return (f"SELECT {self.line}, {keys} FROM {source or self.table} WHERE {cond} "
                f"ORDER BY {keys} LIMIT {int(rows)}")


def _csv_text(text: str, raw: bool) -> str:
    """`text` as one CSV cell, as `_field` renders a TEXT column (formula guard unless `raw`, quoting)."""
    if not raw and text[:1] in ("=", "+", "-", "@", "\t", "\r"):
        text = "'" + text
    return '"' + text.replace('"', '""') + '"' if any(ch in text for ch in ',"\n\r') else text


def _sql_text(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _uuid_expr(segments: list[dict], bucket_ms: int, csv: bool, raw: bool) -> str:
    """SQL naming the board behind each row's (gpu, ts_ms) from the index's segments (StoreReader.gpu_identities):
    NULL where unknown. A rollup bucket [ts_ms, ts_ms + bucket_ms) that holds the start of another board's segment
    mixes both boards' readings: it names both, `old+new`. `csv`: the literals rendered as CSV cells (the line)."""
    def lit(text: str) -> str:
        return _sql_text(_csv_text(text, raw) if csv else text)

    whens: list[str] = []
    by_gpu: dict[int, list[dict]] = {}
    for seg in segments:
        if isinstance(seg.get("gpu"), int) and isinstance(seg.get("since_ms"), int):
            by_gpu.setdefault(seg["gpu"], []).append(seg)
    for gpu, segs in sorted(by_gpu.items()):
        inner = []
        if bucket_ms > 1:
            for a, b in zip(segs, segs[1:], strict=False):
                if a["until_ms"] == b["since_ms"] and a["uuid"] != b["uuid"]:
                    inner.append(f"WHEN ts_ms < {b['since_ms']} AND ts_ms > {b['since_ms'] - bucket_ms} "
                                 f"THEN {lit(a['uuid'] + '+' + b['uuid'])}")
        for seg in segs:
            until = f" AND ts_ms < {seg['until_ms']}" if isinstance(seg["until_ms"], int) else ""
            inner.append(f"WHEN ts_ms >= {seg['since_ms']}{until} THEN {lit(seg['uuid'])}")
        whens.append(f"WHEN {gpu} THEN CASE {' '.join(inner)} END")
    return f"CASE gpu {' '.join(whens)} END" if whens else "NULL"


def build_query(table: str, resolution: str, start_ms: int, end_ms: int, raw: bool = False,
                columns_of: Callable[[str, list[str]], Collection[str]] | None = None,
                gpu_segments: list[dict] | None = None) -> Query:
    """The SELECT for one table, ordered by time, with the ISO time and epoch ms first.

    `columns_of(sql_table, wanted)` gives the columns the file's table has (StoreReader.columns): one that a
    file written before it was added lacks is exported empty (NULL), so the header and rows keep their shape.
    The gpu table's last column, `uuid`, names the board each row was read from (`gpu_segments`, which index held
    which board when: StoreReader.gpu_identities; empty where unknown): history is keyed by NVML index, and a
    replaced board or shifted indices put two boards' readings under one index.
    """
    name = table
    if table in ("gpu", "host", "serving"):
        t = SAMPLE_TABLES[table]
        key = ["ts_ms", "gpu"] if t.per_gpu else ["ts_ms"]
        if resolution == "raw":
            name, cols = t.name, [(m[0], m[1]) for m in t.metrics]
        else:
            name, cols = rollup_table(table, resolution), rollup_columns(table)
        fields = [(k, "INTEGER") for k in key] + cols
        where = f"FROM {name} WHERE ts_ms >= ? AND ts_ms < ?"
    elif table == "events":
        name, fields = "events", [("ts_ms", "INTEGER"), ("id", "INTEGER"), ("run_id", "INTEGER"),
                                  ("kind", "TEXT"), ("severity", "TEXT"), ("message", "TEXT"), ("details", "TEXT")]
        where = "FROM events WHERE ts_ms >= ? AND ts_ms < ?"
        key = ["ts_ms", "id"]
    elif table == "runs":
        name, fields = "runs", [("started_ms", "INTEGER"), ("id", "INTEGER"), *RUN_COLUMNS]
        where = "FROM runs WHERE started_ms < ?2 AND (ended_ms IS NULL OR ended_ms >= ?1)"
        key = ["started_ms", "id"]
    else:
        raise ExportError(f"unknown table {table!r} (known: {', '.join(TABLES)})")
    time_col = fields[0][0]
    iso = _ISO.format(col=time_col)
    header = ["time_utc", "ts_ms", *(c for c, _ in fields[1:])]
    exprs = _EXPRS.get(table, {})
    have = columns_of(name, [c for c, _ in fields]) if columns_of is not None else ()
    if have:  # (empty: the file has no such table; the query says so)
        exprs = {**exprs, **{c: "NULL" for c, _ in fields if c not in have}}
    line_fields = [_field(c, t, raw, exprs.get(c)) for c, t in fields]
    plain = [f"{exprs[c]} AS {c}" if c in exprs else c for c, _ in fields[1:]]
    if table == "gpu":  # the board: its literals rendered as CSV cells already (NULL: an empty cell)
        bucket = 1 if resolution == "raw" else RESOLUTIONS[resolution]
        header.append("uuid")
        line_fields.append(_uuid_expr(gpu_segments or [], bucket, True, raw))
        plain.append(f"{_uuid_expr(gpu_segments or [], bucket, False, raw)} AS uuid")
    line = _line([iso, *line_fields])
    plain_cols = ", ".join([f"{iso} AS time_utc", f"{time_col} AS ts_ms", *plain])
    order = ", ".join(key)
    ranged = table != "runs"
    cond = "ts_ms >= ?1 AND ts_ms < ?2" if ranged else where.split(" WHERE ", 1)[1]
    return Query(header, f"SELECT {line} {where} ORDER BY {order}", (start_ms, end_ms), f"SELECT count(*) {where}",
                 f"SELECT {plain_cols} {where} ORDER BY {order}", name, line, tuple(key), cond, ranged)


def fixed_end(reader: StoreReader, q: Query) -> Query:
    """`q` ending at the newest row stored now (when before its end): the range a long export reads is fixed
    when it starts, so rows written meanwhile past it never make it longer (or endless). Idempotent."""
    start, end = q.params
    if not q.ranged:  # runs: a few rows, read as they are
        return q
    newest = reader.newest(q.table, q.key[0])
    return q if newest is None or newest + 1 >= end else dataclasses.replace(q, params=(start, newest + 1))


def pages(reader: StoreReader, q: Query, rows: int | None = None) -> Iterator[list[str]]:
    """The export's lines a page at a time, each page read in its own short read transaction (see the module's
    docstring); nothing is held between pages, however long the consumer takes with one.

    A page of a raw sample table reads the compacted chunks of its own span with the raw rows, in the same
    transaction, and ends at an interval edge past about `rows` chunk rows (StoreReader.chunk_window), so it
    decodes only those chunks; a row compacted between two pages is read from its chunk by the next one, and the
    keyset skips what an earlier page gave, whichever form it is in now."""
    rows = rows or PAGE_ROWS
    q = fixed_end(reader, q)
    start, stop = q.params
    chunked = q.ranged and q.table in COMPACTED
    lo, last = start, ()
    while True:
        with reader.snapshot():
            hi = reader.chunk_window(q.table, lo, stop, rows) if chunked else stop
            source = reader.chunk_source(q.table, lo, hi) if chunked else q.table
            params = (lo, hi, *last) if q.ranged else (start, stop, *last)
            lines, key = reader.lines(q.page_sql(bool(last), rows, source), params)
        full = len(lines) == rows
        if lines:
            yield lines
        del lines  # one page in memory at a time
        if full:  # more may follow in [lo, hi): after this key
            last = key
            lo = key[0] if q.ranged else lo
            continue
        if q.ranged and hi < stop:  # the window is done: the next starts where it ended
            lo, last = hi, ()
        else:
            return


def count(reader: StoreReader, q: Query) -> int:
    """The rows `pages` gives for `q` as the file is now (for the progress bar): raw rows and chunk rows, each
    key once; only the chunks at the range's edges (or under a late raw row) are decoded."""
    q = fixed_end(reader, q)
    with reader.snapshot():
        n = reader.fetch(q.count_sql, q.params)[0][0]
        if q.ranged and q.table in COMPACTED:
            n += reader.chunk_rows(q.table, *q.params)
    return n


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
    """The header and every page of `q` into `out`; no read transaction is open while `out` is written to."""
    it = pages(reader, q)
    lines = next(it, None)  # a file with no history (NoHistory) or damage raises here: nothing written yet
    out.write(",".join(q.header) + "\n")
    n = 0
    while lines is not None:
        for i in range(0, len(lines), _WRITE_LINES):
            out.write("\n".join(lines[i:i + _WRITE_LINES]))
            out.write("\n")
        n += len(lines)
        if progress:
            progress.update(n)
        lines = None  # before the next page is read: one page in memory at a time
        lines = next(it, None)
    if progress:
        progress.update(n, final=True)
    return n


class _Terminal:
    """stdout when it is a terminal: the database's text (a model name, an event message) is shown escaped, so it
    cannot act on the terminal; a file or a pipe gets the exact bytes."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write(terminal_safe(text, lines=True))


class OutputError(Exception):
    """The output could not be written (a full disk, /dev/full): exit 1 with a line naming it."""


def _query(reader: StoreReader, table: str, resolution: str, start_ms: int, end_ms: int, raw: bool) -> Query:
    """The query of one table's export (its end is fixed by `fixed_end` just before it is counted and written)."""
    if resolution != "raw" and resolution not in RESOLUTIONS:
        raise ExportError(f"unknown resolution {resolution!r} (known: raw, {', '.join(RESOLUTIONS)})")
    if table in ("events", "runs"):
        resolution = "raw"
    segments = reader.gpu_identities() if table == "gpu" else None
    return build_query(table, resolution, start_ms, end_ms, raw, reader.columns, segments)


def _target_kind(output: Path, force: bool) -> str | None:
    """None for a regular file (or none yet) that may be written, else the special kind written as it is;
    ExportError for a target export must not write (an existing file without --force, a directory, a socket)."""
    kind = _special_kind(output)
    if kind is None:
        if output.exists() and not force:
            raise ExportError(f"{output} already exists; use --force to overwrite it")
        if output.is_dir():
            raise ExportError(f"{output} is a directory; give a file name (or use --table all for a directory)")
    elif kind not in _WRITTEN_AS_IS:
        raise ExportError(f"{output} is a {kind}: export writes a regular file, a FIFO or a character device")
    return kind


def export_table(reader: StoreReader, table: str, resolution: str, start_ms: int, end_ms: int,
                 output: Path | None, force: bool = False, progress_stream: TextIO | None = None,
                 raw: bool = False) -> int:
    """Export one table to `output` (a file, atomically) or stdout; returns the row count."""
    q = _query(reader, table, resolution, start_ms, end_ms, raw)
    if output is None:
        try:
            n = write_csv(reader, q, _Terminal(sys.stdout) if sys.stdout.isatty() else sys.stdout)
            sys.stdout.flush()  # a full disk shows here, not at exit where nothing can name the output
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputError(f"cannot write to stdout: {exc.strerror or exc}") from None
        return n
    kind = _target_kind(output, force)
    if kind is None and not output.parent.is_dir():
        raise ExportError(f"{output.parent} does not exist")
    q = fixed_end(reader, q)
    prog = Progress(progress_stream or sys.stderr, count(reader, q), f"{output.name}")
    try:
        if kind is not None:
            return _write_special(output, lambda f: write_csv(reader, q, f, prog))
        n = atomic_write(output, lambda f: write_csv(reader, q, f, prog))
    except OSError as exc:
        raise OutputError(f"cannot write to {output}: {exc.strerror or exc}") from None
    return n or 0


_WRITTEN_AS_IS = ("FIFO", "character device")


def _special_kind(path: Path) -> str | None:
    """What `path` is when it is neither absent, a directory nor a regular file (after symlinks): a FIFO (`-o
    >(gzip > x)`), a character device (/dev/stdout, /dev/null) or something export must not write."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return {stat.S_IFIFO: "FIFO", stat.S_IFCHR: "character device", stat.S_IFBLK: "block device",
            stat.S_IFSOCK: "socket"}.get(stat.S_IFMT(mode), "special file")


def _write_special(path: Path, write: Callable[[TextIO], int]) -> int:
    """Write into a FIFO or a character device as it is: replacing it with a regular file (what --force does to
    a file) would, as root, turn a node in /dev into a file. Opened without O_CREAT and checked again after
    opening, so a path swapped for a regular file in between is not written through."""
    fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        kind = stat.S_IFMT(os.fstat(fd).st_mode)
        if kind not in (stat.S_IFIFO, stat.S_IFCHR):
            raise ExportError(f"{path} changed while being opened (it is no longer a FIFO or character device)")
        with open(fd, "w", encoding="utf-8", newline="", closefd=False) as f:
            return write(f)
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(directory: Path) -> None:
    """Persist the renames (durability only: a file system that cannot fsync a directory loses nothing else)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class _Staging:
    """Where `--table all` writes its files until every one is complete, so a failure (a full disk) leaves nothing
    half-made: a directory that did not exist is written as a hidden sibling (`.DIR.XXXX.tmp`, the same file
    system) renamed to DIR at the end; into an existing one each file goes to a hidden temporary name inside it
    (DIR may be a mount point) and all are renamed over their targets only once all are written. `discard`
    removes what the export made (the files, the sibling, parent directories it created), nothing else."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.made_parents: list[Path] = []
        self.files: list[tuple[Path, Path]] = []  # (temporary, target)
        self.sibling: Path | None = None
        if directory.is_dir():
            return
        missing = [p for p in (directory.parent, *directory.parent.parents) if not p.exists()]
        try:
            for p in reversed(missing):
                p.mkdir(mode=0o777)  # the umask applies, as mkdir(1)'s
                self.made_parents.append(p)
            self.sibling = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", suffix=".tmp", dir=directory.parent))
            os.chmod(self.sibling, 0o777 & ~_umask())  # the directory's mode as mkdir gives it, not mkdtemp's 0700
        except BaseException:
            self.discard()
            raise

    def write(self, target: Path, write: Callable[[TextIO], int]) -> int:
        """Write `target`'s content aside (synced to disk); it takes the name at `commit`."""
        if self.sibling is not None:
            tmp = self.sibling / target.name
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        else:
            fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            tmp = Path(name)
        self.files.append((tmp, target))
        with open(fd, "w", encoding="utf-8", newline="") as f:  # owns fd from here: closed whatever happens
            if self.sibling is None:
                os.fchmod(fd, 0o666 & ~_umask())  # as a shell's `>` makes it, not mkstemp's 0600
            n = write(f)
            f.flush()
            os.fsync(f.fileno())
        return n

    def commit(self) -> None:
        """Every file under its name at once (as far as renames go): the sibling becomes DIR, or each file is
        renamed over its target."""
        if self.sibling is not None:
            _fsync_dir(self.sibling)
            os.rename(self.sibling, self.directory)  # an empty DIR made meanwhile is replaced; a full one refuses
            self.sibling = None
            self.made_parents = []
            _fsync_dir(self.directory.parent)
        else:
            for tmp, target in self.files:
                os.replace(tmp, target)
            _fsync_dir(self.directory)
        self.files.clear()

    def discard(self) -> None:
        """Remove what the export made, newest first; what existed before is left as it was."""
        for tmp, _ in self.files:
            with contextlib.suppress(OSError):
                tmp.unlink()
        self.files.clear()
        for d in ([self.sibling] if self.sibling else []) + self.made_parents[::-1]:
            with contextlib.suppress(OSError):
                d.rmdir()  # only when empty: never anything someone else put there
        self.sibling, self.made_parents = None, []


def _not_regular(path: Path) -> str | None:
    """Why `path` (a table's name in `--table all`'s DIR) must not be written, or None: absent or a regular file.
    lstat, not stat: a link is the planter's choice of target (a device, anyone's file), whatever it points at."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be checked ({exc.strerror or exc})"
    if stat.S_ISREG(st.st_mode):
        return None
    if stat.S_ISLNK(st.st_mode):
        try:
            return f"is a symbolic link (to {os.readlink(path)!r})"
        except OSError:
            return "is a symbolic link"
    kind = {stat.S_IFDIR: "directory", stat.S_IFIFO: "FIFO", stat.S_IFCHR: "character device",
            stat.S_IFBLK: "block device", stat.S_IFSOCK: "socket"}.get(stat.S_IFMT(st.st_mode), "special file")
    return f"is a {kind}"


def export_all(reader: StoreReader, resolution: str, start_ms: int, end_ms: int, directory: Path,
               force: bool = False, progress_stream: TextIO | None = None, raw: bool = False) -> dict[str, int]:
    """One file per table in `directory` (created if absent); checks every target before writing any, and puts
    the files in place only when all are written: on a failure (OutputError: a full disk) none is kept, no
    existing file is replaced, and a directory it created is removed (`_Staging`). A table's name that is a link
    or a special file is refused before anything is written: in a DIR others may write, it is theirs to plant (a
    link to a device, to anyone's file), so each file is only ever created anew and renamed over the name."""
    if os.path.lexists(directory) and not directory.is_dir():  # a dangling symlink too: never replaced
        raise ExportError(f"{directory} is not a directory (--table all writes one file per table into it)")

    def name(t: str) -> str:
        return f"{t}.csv" if t in ("events", "runs") or resolution == "raw" else f"{t}_{resolution}.csv"

    targets = {t: directory / name(t) for t in TABLES}
    for p in targets.values():
        why = _not_regular(p)
        if why:
            raise ExportError(f"{p} {why}: --table all writes each table only as a regular file it creates or "
                              f"replaces by rename, never into what is at a name it did not get from you; remove "
                              f"it, or export into a directory only you write (or -o FILE for one table)")
    existing = [str(p) for p in targets.values() if os.path.lexists(p)]
    if existing and not force:
        raise ExportError(f"{', '.join(existing)} already exist(s); use --force to overwrite")
    queries = {t: _query(reader, t, resolution, start_ms, end_ms, raw) for t in TABLES}
    at = directory
    try:
        staging = _Staging(directory)
    except OSError as exc:
        raise OutputError(f"cannot create {exc.filename or directory}: {exc.strerror or exc}") from None
    counts: dict[str, int] = {}
    try:
        for t, target in targets.items():
            at = target
            q = fixed_end(reader, queries[t])
            prog = Progress(progress_stream or sys.stderr, count(reader, q), target.name)
            write = functools.partial(write_csv, reader, q, progress=prog)
            counts[t] = staging.write(target, write)  # renamed over the name at commit: never written through
        at = directory
        staging.commit()
    except OSError as exc:
        left = (f"{directory} was not created" if staging.sibling is not None
                else f"no file in {directory} was created or replaced")
        staging.discard()
        raise OutputError(f"cannot write to {at}: {exc.strerror or exc}; {left}") from None
    except BaseException:
        staging.discard()
        raise
    return counts
