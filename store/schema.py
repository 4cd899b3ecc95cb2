"""The database layout (generated from contract/columns.py), its forward migrations, and opening a file safely.

Timestamps are integer epoch milliseconds UTC; units live in column names. Sample tables are wide (one row
per GPU per tick) because a row costs one key and one record header for ~27 values, which is what keeps the
file near 4 bytes per value. The file carries an application_id so a foreign SQLite file is recognised
instead of being silently migrated into.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lynxtop.contract.columns import GPU_METRICS, HOST_METRICS, NVLINK_METRICS, SERVING_METRICS
from lynxtop.contract.files import free_bytes
from lynxtop.store.errors import NewerSchema, NotOurDatabase, StoreAccessError, StoreError

log = logging.getLogger(__name__)

APPLICATION_ID = 0x4C594E58  # "LYNX" in the SQLite header: tells our file from any other SQLite file
BUSY_TIMEOUT_MS = 5000
FILE_MODE = 0o640
PAGE_SIZE = 16384
# Each connection's page cache bound (the writer's and each reader's). A cache only fills as pages are read or
# written and is never given back, so this bound is the RSS step a long-running agent climbs to: 32 MiB took the
# soak's agent 25 minutes to fill (0.7 MB/min). 8 MiB (512 pages) writes as fast (benchmarks/writer_memory.py:
# the same CPU rows/s at 2, 4, 8 and 32 MiB) and fills in minutes; docs/performance.md has the figures.
CACHE_KIB = 8192
DIR_MODE = 0o750

Metrics = tuple[tuple[str, str, str], ...]


@dataclass(frozen=True)
class SampleTable:
    """A raw sample table: keyed by ts_ms (and gpu when per_gpu)."""

    name: str
    metrics: Metrics
    per_gpu: bool

    @property
    def key(self) -> tuple[str, ...]:
        return ("ts_ms", "gpu") if self.per_gpu else ("ts_ms",)


SAMPLE_TABLES: dict[str, SampleTable] = {
    "gpu": SampleTable("gpu_samples", GPU_METRICS, True),
    "nvlink": SampleTable("nvlink_samples", NVLINK_METRICS, True),
    "host": SampleTable("host_samples", HOST_METRICS, False),
    "serving": SampleTable("serving_samples", SERVING_METRICS, False),
}

# Resolution name -> bucket width. Rollups exist for gpu, host and serving (per-link NVLink is raw only:
# 36 columns x 3 stats would triple the rollup size for a view nobody charts over months).
RESOLUTIONS: dict[str, int] = {"1m": 60_000, "1h": 3_600_000}
ROLLUP_KINDS = ("gpu", "host", "serving")
_NOT_ROLLED = {"cpu_per_core_pct", "run_id"}  # a JSON array and an identifier: no min/avg/max


def rollup_metrics(kind: str) -> Metrics:
    """Numeric columns of a sample table that have min/avg/max rollups."""
    return tuple(m for m in SAMPLE_TABLES[kind].metrics if m[1] in ("INTEGER", "REAL") and m[0] not in _NOT_ROLLED)


def rollup_table(kind: str, resolution: str) -> str:
    return f"{kind}_{resolution}"


def rollup_columns(kind: str) -> list[tuple[str, str]]:
    """samples (rows in the bucket), then per metric min, avg, max and n (non-NULL readings).

    n makes averages of averages exact (the 1-hour rollup is computed from 1-minute rows, 60x less work
    than from raw) even when some readings in a minute were missing; it costs about 1 byte per value.
    """
    cols: list[tuple[str, str]] = [("samples", "INTEGER")]
    for name, typ, _ in rollup_metrics(kind):
        cols += [(f"{name}_min", typ), (f"{name}_avg", "REAL"), (f"{name}_max", typ), (f"{name}_n", "INTEGER")]
    return cols


RUN_COLUMNS: tuple[tuple[str, str], ...] = (
    ("profile", "TEXT"), ("argv", "TEXT"), ("model", "TEXT"), ("host", "TEXT"), ("started_ms", "INTEGER"),
    ("pid", "INTEGER"), ("pid_start_time", "REAL"), ("log_path", "TEXT"), ("simulated", "INTEGER"),
    ("flags", "TEXT"), ("ready_ms", "INTEGER"), ("vllm_version", "TEXT"), ("gpu_names", "TEXT"),
    ("gpu_count", "INTEGER"), ("ended_ms", "INTEGER"), ("exit_code", "INTEGER"), ("exit_signal", "INTEGER"),
    ("end_reason", "TEXT"),
)
RUN_JSON_COLUMNS = ("argv", "flags", "gpu_names")

GPU_FACT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("idx", "INTEGER"), ("name", "TEXT"), ("pci_bus_id", "TEXT"), ("cc_major", "INTEGER"), ("cc_minor", "INTEGER"),
    ("arch", "TEXT"), ("mem_total_bytes", "INTEGER"), ("nvlink_count", "INTEGER"), ("gpm_supported", "INTEGER"),
    ("driver_version", "TEXT"), ("nvml_version", "TEXT"), ("first_seen_ms", "INTEGER"), ("last_seen_ms", "INTEGER"),
    # which index the board held when (store/gpu_identity.py): added in place to older files, no floor moved
    ("idx_since_ms", "INTEGER"), ("idx_history", "TEXT"),
    # the board's serial (nvmlDeviceGetSerial; NULL: none or unread), added in place as the two above (s25)
    ("serial", "TEXT"),
)

PROCESS_COLUMNS: tuple[tuple[str, str], ...] = (("used_mem_bytes", "INTEGER"), ("in_vllm_tree", "INTEGER"))
NO_PROCESS_PID = -1  # a gpu_processes row with this pid: the GPU's process list was read empty (docs/store.md)

BENCH_COLUMNS: tuple[tuple[str, str], ...] = (
    ("ts_ms", "INTEGER"), ("run_id", "INTEGER"), ("profile", "TEXT"), ("model", "TEXT"), ("name", "TEXT"),
    ("concurrency", "INTEGER"), ("input_len", "INTEGER"), ("output_len", "INTEGER"), ("num_prompts", "INTEGER"),
    ("duration_s", "REAL"), ("requests_per_s", "REAL"), ("output_tokens_per_s", "REAL"),
    ("total_tokens_per_s", "REAL"), ("ttft_p50_ms", "REAL"), ("ttft_p99_ms", "REAL"), ("tpot_p50_ms", "REAL"),
    ("tpot_p99_ms", "REAL"), ("itl_p50_ms", "REAL"), ("itl_p99_ms", "REAL"), ("e2e_p50_ms", "REAL"),
    ("e2e_p99_ms", "REAL"), ("errors", "INTEGER"), ("simulated", "INTEGER"), ("details", "TEXT"),
    # `lynxtop bench` (added in place to older files by _add_missing_columns): the sweep a level belongs to,
    # whether it was cut short, the server's version, requests/s within the SLA
    ("bench_id", "TEXT"), ("partial", "INTEGER"), ("vllm_version", "TEXT"), ("goodput_per_s", "REAL"),
)

EVENT_SEVERITIES = ("info", "warning", "error", "critical")


def _cols(cols: tuple[tuple[str, str], ...] | list[tuple[str, str]]) -> str:
    return "".join(f", {name} {typ}" for name, typ in cols)


def _sample_ddl(t: SampleTable) -> str:
    metric_cols = _cols([(n, typ) for n, typ, _ in t.metrics])
    if t.per_gpu:
        return (f"CREATE TABLE IF NOT EXISTS {t.name} (ts_ms INTEGER NOT NULL, gpu INTEGER NOT NULL{metric_cols}, "
                f"PRIMARY KEY (ts_ms, gpu)) WITHOUT ROWID")
    return f"CREATE TABLE IF NOT EXISTS {t.name} (ts_ms INTEGER PRIMARY KEY{metric_cols})"


def _rollup_ddl(kind: str, resolution: str) -> str:
    name = rollup_table(kind, resolution)
    cols = _cols(rollup_columns(kind))
    if SAMPLE_TABLES[kind].per_gpu:
        return (f"CREATE TABLE IF NOT EXISTS {name} (ts_ms INTEGER NOT NULL, gpu INTEGER NOT NULL{cols}, "
                f"PRIMARY KEY (ts_ms, gpu)) WITHOUT ROWID")
    return f"CREATE TABLE IF NOT EXISTS {name} (ts_ms INTEGER PRIMARY KEY{cols})"


# table -> key columns of its compacted chunks (store/compact.py: rows ordered by them)
COMPACTED: dict[str, tuple[str, ...]] = {
    **{t.name: t.key for t in SAMPLE_TABLES.values()}, "gpu_processes": ("ts_ms", "gpu", "pid"),
}


def chunk_table(table: str) -> str:
    return f"{table}_chunks"


def _chunk_ddl(table: str) -> list[str]:
    """A rowid table (the blobs are kilobytes: too big for a WITHOUT ROWID b-tree) keyed by interval and GPU."""
    name = chunk_table(table)
    return [f"CREATE TABLE IF NOT EXISTS {name} (id INTEGER PRIMARY KEY, start_ms INTEGER NOT NULL, "
            "gpu INTEGER NOT NULL, end_ms INTEGER NOT NULL, rows INTEGER NOT NULL, data BLOB NOT NULL)",
            f"CREATE UNIQUE INDEX IF NOT EXISTS {name}_start ON {name} (start_ms, gpu)"]


# ---------------------------------------------------------------------------------------------- migrations


def _m1_base(conn: sqlite3.Connection) -> None:
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT) WITHOUT ROWID")
    conn.execute(f"CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY{_cols(RUN_COLUMNS)})")
    conn.execute("CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY, ts_ms INTEGER NOT NULL, run_id INTEGER, "
                 "kind TEXT NOT NULL, severity TEXT NOT NULL, message TEXT NOT NULL, details TEXT)")
    conn.execute("CREATE INDEX IF NOT EXISTS events_ts ON events (ts_ms)")
    conn.execute(f"CREATE TABLE IF NOT EXISTS gpus (uuid TEXT PRIMARY KEY{_cols(GPU_FACT_COLUMNS)}) WITHOUT ROWID")
    conn.execute(f"CREATE TABLE IF NOT EXISTS gpu_processes (ts_ms INTEGER NOT NULL, gpu INTEGER NOT NULL, "
                 f"pid INTEGER NOT NULL{_cols(PROCESS_COLUMNS)}, PRIMARY KEY (ts_ms, gpu, pid)) WITHOUT ROWID")
    conn.execute(f"CREATE TABLE IF NOT EXISTS bench_results (id INTEGER PRIMARY KEY{_cols(BENCH_COLUMNS)})")
    for t in SAMPLE_TABLES.values():
        conn.execute(_sample_ddl(t))


def _m2_rollups(conn: sqlite3.Connection) -> None:
    for kind in ROLLUP_KINDS:
        for res in RESOLUTIONS:
            conn.execute(_rollup_ddl(kind, res))
    conn.execute("CREATE INDEX IF NOT EXISTS events_run ON events (run_id, ts_ms)")
    conn.execute("CREATE INDEX IF NOT EXISTS serving_run ON serving_samples (run_id)")


def _m3_chunks(conn: sqlite3.Connection) -> None:
    """Compacted chunks beside each sample table (issue 29.1); raw rows stay where they are until compacted."""
    for table in COMPACTED:
        for sql in _chunk_ddl(table):
            conn.execute(sql)


def _m4_rollup_dirty(conn: sqlite3.Connection) -> None:
    """Rollup buckets a late sample fell into (below the watermark), written in the sample's own transaction and
    deleted by the rollup step that recomputes them: a crash or a restart between the two no longer loses the
    re-roll (store/rollup.py). Empty in steady state; a row per late bucket, never one per tick."""
    conn.execute("CREATE TABLE IF NOT EXISTS rollup_dirty (kind TEXT NOT NULL, res TEXT NOT NULL, "
                 "bucket_ms INTEGER NOT NULL, PRIMARY KEY (kind, res, bucket_ms)) WITHOUT ROWID")


@dataclass(frozen=True)
class Migration:
    """One step of the layout and its floor: the oldest schema whose code may still read and write a file that has
    this step. A step that only adds what older code never touches (a table, an index) keeps the floor of the step
    before it, so rolling lynxtop back one release keeps its history; one that moves or rewrites rows, or changes a
    table older code writes, raises the floor to its own version (older code would misread or damage the file)."""

    run: Callable[[sqlite3.Connection], None]
    floor: int


# Each function runs once, in its own transaction, in order; append only, never edit a released one. Every new
# migration declares its floor (see Migration); the file's floor (meta.compat_version) is the highest of its
# applied ones, and code older than it refuses the file. The floors:
#   m1 1: the first layout.
#   m2 2: the rollup tables; schema-1 code would write and delete raw rows without keeping rollups that schema-2
#         readers serve for long ranges (charts short of what was sampled, hours rolled up from nothing).
#   m3 3: compaction moves raw rows into *_chunks, which schema-2 code can neither read (a hole in its history)
#         nor expire (retention would never reach them).
#   m4 3: rollup_dirty only; schema-3 code never touches it (a late sample it writes is re-rolled as schema 3
#         always did, and the marks a schema-4 agent left wait for it to come back).
MIGRATIONS: tuple[Migration, ...] = (
    Migration(_m1_base, 1), Migration(_m2_rollups, 2), Migration(_m3_chunks, 3), Migration(_m4_rollup_dirty, 3),
)
SCHEMA_VERSION = len(MIGRATIONS)


def compat_floor(version: int) -> int:
    """The floor of a file of this code's schema `version` or older: the highest of its migrations' floors."""
    return max((m.floor for m in MIGRATIONS[:version]), default=0)


def expected_columns() -> dict[str, list[tuple[str, str]]]:
    """Every table's columns as columns.py describes them now (used to add columns added since creation)."""
    out: dict[str, list[tuple[str, str]]] = {}
    for t in SAMPLE_TABLES.values():
        out[t.name] = [(n, typ) for n, typ, _ in t.metrics]
    for kind in ROLLUP_KINDS:
        for res in RESOLUTIONS:
            out[rollup_table(kind, res)] = rollup_columns(kind)
    out["runs"] = list(RUN_COLUMNS)
    out["gpus"] = list(GPU_FACT_COLUMNS)
    out["bench_results"] = list(BENCH_COLUMNS)
    return out


def schema_version(conn: sqlite3.Connection, path: Path | str | None = None) -> int:
    """The file's schema version (0 before the first migration). A value that is not a whole number ('3.1', a
    blob: no lynxtop writes one) is refused as NewerSchema naming `path` and the value, as a newer schema is: the
    agent and the readers say what is wrong with which file instead of int()'s bare ValueError (a traceback in
    `lynxtop runs`), and nothing is migrated or moved aside."""
    has_meta = conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone()
    if not has_meta:
        return 0
    row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    if row is None:
        return 0
    value = row[0]
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    where = path or _main_file(conn)
    raise NewerSchema(f"{where}: its schema version (meta.schema_version) is {shown}, not a whole number: not a "
                      f"layout this lynxtop knows (it knows schema {SCHEMA_VERSION}; a newer lynxtop or another "
                      f"program wrote it); nothing was migrated or moved. Use the lynxtop that wrote it, or move "
                      f"{where} (with its -wal and -shm) aside: the new history starts empty")


def compat_version(conn: sqlite3.Connection, version: int) -> int:
    """The oldest schema whose code may read and write this file of schema `version` (meta.compat_version). A file
    written before floors were recorded has none, and one whose value is not a whole number cannot be trusted: for
    both the floor is the schema version itself, so only code that knows that schema opens it (as before)."""
    row = conn.execute("SELECT value FROM meta WHERE key='compat_version'").fetchone() if version else None
    value = None if row is None else row[0]
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    return value if isinstance(value, int) and 0 < value <= version else version


def _main_file(conn: sqlite3.Connection) -> str:
    """The file of `conn`'s main database, for a message when the caller did not name it."""
    return next((r[2] for r in conn.execute("PRAGMA database_list") if r[1] == "main"), "") or "the database"


def migrate(conn: sqlite3.Connection, target: int = SCHEMA_VERSION) -> int:
    """Run the missing migrations up to `target`; returns the version reached. Safe to call on every open."""
    version = schema_version(conn)
    while version < target:
        conn.execute("BEGIN IMMEDIATE")
        try:
            MIGRATIONS[version].run(conn)
            version += 1
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)", (str(version),))
            _write_floor(conn, version)
            conn.execute("COMMIT")
        except BaseException:
            rollback(conn)
            raise
    if 0 < version <= SCHEMA_VERSION and not _floor_written(conn, version):  # a file from before floors existed
        conn.execute("BEGIN IMMEDIATE")
        try:
            _write_floor(conn, version)
            conn.execute("COMMIT")
        except BaseException:
            rollback(conn)
            raise
    if target == SCHEMA_VERSION:
        _add_missing_columns(conn)
    return version


def _write_floor(conn: sqlite3.Connection, version: int) -> None:
    conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('compat_version', ?)", (str(compat_floor(version)),))


def _floor_written(conn: sqlite3.Connection, version: int) -> bool:
    """Whether meta.compat_version is this code's floor for `version`. A newer schema's floor is never rewritten
    (that release knows it; this one does not): callers only ask for versions this code knows."""
    row = conn.execute("SELECT value FROM meta WHERE key='compat_version'").fetchone()
    return row is not None and row[0] == str(compat_floor(version))


def rollback(conn: sqlite3.Connection) -> None:
    """Roll back if a transaction is still open (SQLite already rolled back after some errors, e.g. FULL)."""
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass


def _add_missing_columns(conn: sqlite3.Connection) -> None:
    """Columns added to columns.py after a file was created are added in place (NULL for old rows)."""
    adds = []
    for table, cols in expected_columns().items():
        have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
        adds += [f"ALTER TABLE {table} ADD COLUMN {name} {typ}" for name, typ in cols if name not in have]
    if adds:
        conn.execute("BEGIN IMMEDIATE")
        try:
            for sql in adds:
                conn.execute(sql)
            conn.execute("COMMIT")
        except BaseException:
            rollback(conn)
            raise


# ---------------------------------------------------------------------------------------------- opening


def configure(conn: sqlite3.Connection, *, readonly: bool = False) -> None:
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    if not readonly and conn.execute("PRAGMA page_count").fetchone()[0] == 0:
        # only possible before the first table: 16 KiB pages insert ~20 % faster and scan faster than 4 KiB
        conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
    if not readonly:
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StoreError(f"cannot switch to WAL journal mode (got {mode!r})")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA journal_size_limit = 67108864")  # truncate a WAL that grew during a long export
    tune(conn)


def tune(conn: sqlite3.Connection, *, mmap: bool = False) -> None:
    """Memory for speed, bounded: a page cache of CACHE_KIB per connection keeps the pages just written (which
    rollups and the dashboard read next) in memory; sorts stay in memory. Readers also map the file instead
    of copying pages; the writer does not, because an I/O error under a mapping is a SIGBUS, not an error code."""
    conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
    conn.execute("PRAGMA temp_store = MEMORY")
    if mmap:
        conn.execute("PRAGMA mmap_size = 268435456")


# SQLite primary result codes that say "not allowed", as opposed to "damaged" (CORRUPT 11, NOTADB 26).
_PERM, _READONLY, _CANTOPEN, _AUTH = 3, 8, 14, 23
_DAMAGED_CODES = {11, 26}


def _code(exc: BaseException) -> int:
    return getattr(exc, "sqlite_errorcode", 0) & 0xFF


def access_problem(path: Path) -> str | None:
    """Why this process cannot write `path` or create its -wal/-shm beside it, or None if it can.

    Only stat/access calls: nothing here opens the file (a plain open()+close() of the live database
    would drop SQLite's POSIX locks held by every connection of this process).
    """
    where = path.parent
    if not os.access(where, os.W_OK | os.X_OK):
        return f"the directory {where} is not writable (SQLite needs to create {path.name}-wal and -shm there)"
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        return f"{path} is not readable and writable by uid {os.geteuid()}"
    for side in (Path(f"{path}-wal"), Path(f"{path}-shm")):
        if side.exists() and not os.access(side, os.R_OK | os.W_OK):
            return f"{side} is not readable and writable by uid {os.geteuid()}"
    return None


_SIDECAR_ROLE = {"-wal": "write-ahead log", "-shm": "shared-memory index"}
_FILE_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
               stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


def sidecar_problem(path: Path) -> str | None:
    """What is wrong with `path`-wal or -shm when one exists and is not a regular file, else None.

    SQLite keeps its log and index there; a directory of that name gave "disk I/O error" (and, for a new
    database, left a 0-byte file) or "permission denied", which say nothing of the cause. Only stat calls.
    """
    for suffix, role in _SIDECAR_ROLE.items():
        side = Path(f"{path}{suffix}")
        try:
            mode = side.stat().st_mode
        except FileNotFoundError:
            if side.is_symlink():
                return f"{side} is a symbolic link to nothing; SQLite keeps the database's {role} there: remove it"
            continue
        except OSError as exc:
            return f"{side}: {exc.strerror}; SQLite keeps the database's {role} there"
        if not stat.S_ISREG(mode):
            kind = _FILE_KINDS.get(stat.S_IFMT(mode), "not a regular file")
            return (f"{side} is {kind}, not a regular file; SQLite keeps the database's {role} there: "
                    "move it away (nothing was opened or created)")
    return None


def open_error(exc: sqlite3.Error, path: Path, doing: str = "open") -> StoreError:
    """The StoreError for an SQLite failure while opening: NotOurDatabase only for real damage.

    Permission problems (a read-only directory or file, a read-only mount) and transient ones (busy, I/O)
    are never called damage, so a healthy file is never moved aside because of them.
    """
    code = _code(exc)
    if code == 26:  # SQLITE_NOTADB: SQLite read the header and it is not its own
        return NotOurDatabase(f"{path}: not an SQLite database (the file header is wrong)")
    if code in _DAMAGED_CODES:
        return NotOurDatabase(f"{path}: the database is damaged or unreadable: {exc}")
    if code in (_PERM, _READONLY, _CANTOPEN, _AUTH):
        why = access_problem(path)
        return StoreAccessError(f"{path}: permission denied: cannot {doing} the history database "
                                f"({why or exc}); the file was not touched")
    full = disk_full(exc, path)
    if full:
        return DiskFull(f"{path}: cannot {doing} the history database: {full} (SQLite: {exc})", full)
    return StoreError(f"{path}: cannot {doing} the history database: {exc}")


class DiskFull(StoreError):
    """Opening failed because the database's file system is full (SQLITE_FULL, ENOSPC, or an I/O error such as
    SQLITE_IOERR_SHMSIZE with no space left): not an operator error, so the agent's writer waits it out
    (store/writer.py) rather than refusing to start. `reason` is what to tell the operator."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


_FULL, _IOERR = 13, 10
# Below this much free space an I/O error while opening is the disk being full: a new -shm alone needs 32 KiB,
# and "disk I/O error" (SQLITE_IOERR_SHMSIZE) is all SQLite says of it.
FULL_SLACK_BYTES = 1 << 20


def _file_system(path: Path) -> str:
    """'the <type> file system at <mount point>' of `path` (its type from /proc/self/mounts, when listed)."""
    at = Path(os.path.realpath(path))
    while not at.exists() or not os.path.ismount(at):
        if at.parent == at:
            break
        at = at.parent
    kind = None
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 2 and parts[1].replace("\\040", " ") == str(at):
                    kind = parts[2]  # the last mount on that point is the one in force
    except OSError:
        pass
    return f"the {kind} file system at {at}" if kind else f"the file system at {at}"


def no_space(path: Path, free: int | None = None) -> str:
    """The operator's words for a full disk under `path`: which file system, which file, how much is left."""
    free = free_bytes(path) if free is None else free
    left = f"{free} bytes free" if free is not None else "free space unknown"
    return f"no space left on {_file_system(path)} ({path}), {left}"


def disk_full(exc: BaseException, path: Path) -> str | None:
    """`no_space`'s reason when an open failure `exc` (sqlite3.Error or OSError) is the disk being full, else None.

    SQLITE_FULL and ENOSPC say so themselves; an I/O error does only with (almost) no free space left (otherwise it
    may be failing hardware, and is reported as it is)."""
    code, free = _code(exc), free_bytes(path)
    if code == _FULL or getattr(exc, "errno", None) == errno.ENOSPC:
        return no_space(path, free)
    if code == _IOERR and free is not None and free < FULL_SLACK_BYTES:
        return no_space(path, free)
    return None


def check_identity(conn: sqlite3.Connection, path: Path, *, integrity: bool = True, reader: bool = False) -> None:
    """Raise NotOurDatabase for a foreign or damaged database, NewerSchema for one a newer lynxtop changed in a way
    this code cannot follow (its floor, meta.compat_version, is above SCHEMA_VERSION). A newer schema within the
    floor (an added table this code never touches) opens as it is, with a log line, and is never migrated down: a
    node rolled back one release keeps its agent and its history. `reader`: a read-only open (says it at INFO, so
    `lynxtop runs` prints nothing of it; the writer's open is the agent's and warns)."""
    try:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        if app_id != APPLICATION_ID and (tables or app_id != 0):
            shown = ", ".join(tables[:5]) + (", …" if len(tables) > 5 else "")
            raise NotOurDatabase(f"{path}: an SQLite database of another program, not a lynxtop history "
                                 f"(application_id {app_id}, tables: {shown or 'none'})")
        if integrity and tables:
            problems = [r[0] for r in conn.execute("PRAGMA quick_check(5)")]
            if problems != ["ok"]:
                raise NotOurDatabase(f"{path}: the database is damaged: {'; '.join(problems)}")
        version = schema_version(conn, path) if tables else 0
        floor = compat_version(conn, version) if version > SCHEMA_VERSION else version
    except sqlite3.DatabaseError as exc:  # the header of a non-SQLite file gives NOTADB here
        raise open_error(exc, path) from None
    if floor > SCHEMA_VERSION:
        agent = "" if reader else ("; the agent does not run on it, and a vLLM server already running keeps serving "
                                   "(unsupervised until an agent that knows the schema starts)")
        raise NewerSchema(f"{path}: written by a newer lynxtop (schema {version}, which needs a lynxtop that knows "
                          f"schema {floor} or newer; this one knows {SCHEMA_VERSION}); nothing was migrated or moved. "
                          f"On a rollback: keep a lynxtop that knows schema {floor} on this node for {path}, or move "
                          f"{path} (with its -wal and -shm) aside: the new history starts empty{agent}")
    if version > SCHEMA_VERSION:
        log.log(logging.INFO if reader else logging.WARNING, "%s: schema %d, this build knows %d: opened, since "
                "schema %d's changes keep %d's tables as they were", path, version, SCHEMA_VERSION, version,
                SCHEMA_VERSION)


def create_file(path: Path) -> None:
    """Create the directory (0750) and an empty file (0640) so SQLite's files inherit those modes."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        os.close(fd)
    except FileExistsError:
        pass
    except PermissionError as exc:
        raise StoreAccessError(f"{path}: permission denied: cannot create the history database "
                               f"({exc.strerror})") from None
    except OSError as exc:
        if exc.errno == errno.EROFS:
            raise StoreAccessError(f"{path}: permission denied: cannot create the history database "
                                   f"({exc.strerror})") from None
        full = disk_full(exc, path)
        if full:
            raise DiskFull(f"{path}: cannot create the history database: {full}", full) from None
        raise StoreError(f"{path}: cannot create the history database: {exc.strerror}") from None


def connect_rw(path: Path, *, integrity: bool = True) -> sqlite3.Connection:
    """Open (creating if absent) for the one writer: checked, configured, migrated.

    The file is only ever opened through SQLite: a foreign file is recognised by SQLite's own NOTADB on the
    first read. A file this process cannot write raises StoreAccessError ("permission denied") and is not
    touched; only real damage raises NotOurDatabase (which the writer moves aside).
    """
    problem = sidecar_problem(path)
    if problem:  # before create_file: a new database is not even created
        raise StoreError(f"{path}: cannot open the history database: {problem}")
    create_file(path)  # O_EXCL: opens nothing when the file exists
    try:
        conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise open_error(exc, path) from None
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        check_identity(conn, path, integrity=integrity)
        configure(conn)
        migrate(conn)
        # SQLite silently opens a file it cannot write read-only, and only the first page written says so:
        # write one (rolled back) to find out now rather than at the first tick.
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("UPDATE meta SET value = value WHERE key = 'schema_version'")
        finally:
            rollback(conn)
    except sqlite3.Error as exc:
        conn.close()
        raise open_error(exc, path, "write") from None
    except BaseException:
        conn.close()
        raise
    return conn


def sidecar_paths(path: Path) -> list[Path]:
    return [path, Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}-journal")]
