"""The one writer of the history database: a thread fed by a bounded queue.

Samplers must never wait on the disk, so `submit_tick` only appends to a queue (a full queue drops the
oldest tick and counts it). The thread writes whatever is queued in one transaction (each tick is atomic:
it is all in or all out), then does bounded rollup and retention work. Transient failures (full disk,
I/O error, busy, a read-only remount) keep the ticks buffered in that bounded queue and retry; a corrupt
file is moved aside and a fresh one started; bad rows are isolated and dropped. Nothing raised here stops
the thread. A database that cannot even be opened because its disk is full (a clean stop removed the
-wal/-shm and no new -shm can be made) does not stop the agent either: the writer starts unopened, keeps
writes as in any outage and retries the open in its thread (see _start_unopened).

Every few seconds the thread also checks that the -wal/-shm it writes through are still the files on disk.
If an outside process unlinked them (it could only do so if this process's locks were lost), commits
would go into a deleted file that nobody else sees and that vanishes when the agent stops: the writer
says so (a critical event, stats()["wal_unlinked"]), copies its frames into the main file (a checkpoint
on its own connection) and reconnects every connection of this process to the files on disk.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
import sqlite3
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import chain, repeat
from operator import is_, itemgetter
from pathlib import Path
from typing import Any

from lynxtop.contract.config import Retention
from lynxtop.contract.events import Event, EventKind, Severity, canonical_kind
from lynxtop.contract.files import free_bytes
from lynxtop.contract.redact import redact_argv, redact_flags
from lynxtop.store import compact, gpu_identity, inproc, swap
from lynxtop.store import retention as retention_mod
from lynxtop.store.checkpoint import FALLBACK_AUTOCHECKPOINT_PAGES, Checkpointer
from lynxtop.store.errors import NotOurDatabase, StoreError
from lynxtop.store.rollup import Rollups, late_buckets, load_watermarks, mark_late
from lynxtop.store.schema import (
    BENCH_COLUMNS,
    EVENT_SEVERITIES,
    FULL_SLACK_BYTES,
    GPU_FACT_COLUMNS,
    NO_PROCESS_PID,
    PROCESS_COLUMNS,
    ROLLUP_KINDS,
    RUN_COLUMNS,
    RUN_JSON_COLUMNS,
    SAMPLE_TABLES,
    DiskFull,
    connect_rw,
    create_file,
    rollback,
    sidecar_paths,
    sidecar_problem,
)
from lynxtop.store.scrub import mask_run_flags

log = logging.getLogger(__name__)

# SQLite primary result codes
_BUSY, _LOCKED, _READONLY, _IOERR, _CORRUPT, _FULL, _CANTOPEN, _NOTADB = 5, 6, 8, 10, 11, 13, 14, 26
_TRANSIENT = {_BUSY, _LOCKED, _READONLY, _IOERR, _FULL, _CANTOPEN}  # READONLY: a remount read-only
_DAMAGED = {_CORRUPT, _NOTADB}
OPS_MAX = 10_000  # non-tick writes held during a write outage; beyond, the oldest events go (see _drop_oldest_events)
MAINTAIN_EVERY_S = 30.0
WAL_CHECK_S = 2.0  # how often the thread checks its -wal/-shm are still on disk (~100 readlinks: cheap)
DETACH_TIMEOUT_S = 5.0  # how long a renewal waits for an in-process reader to finish its query
_LOG_LEVELS = {"critical": logging.CRITICAL, "error": logging.ERROR, "warning": logging.WARNING}
# A database that could not be opened at all because its disk is full (see _start_unopened): the open is retried
# this often, doubling from the first to the last, and at once when the file system has room again.
OPEN_RETRY_S = (5.0, 30.0)


LAG_QUIET_S = 60.0  # ticks dropped by a lagging writer: one episode until this long passes without a drop
LAG_TELL_S = 2.0  # ... told once it has lasted this long with no write error: a failing write is the outage's


class _LagDrops:
    """Ticks dropped because the writer lags (its queue full with no write error: a slow disk, a busy CPU), told once
    per episode: store.ticks_dropped once it has lasted `tell_s` with writes not failing (a queue that filled while
    the first failing write was still being tried is the outage's, told by store.write_failed / writes_resumed),
    and once `quiet_s` pass without a drop, store.writer_caught_up with the count (an episode too short to have
    been told is told then, once). Only counted before, in `dropped`: the history had gaps nobody was told of."""

    def __init__(self, quiet_s: float = LAG_QUIET_S, tell_s: float = LAG_TELL_S):
        self.quiet_s, self.tell_s = quiet_s, tell_s
        self.count = 0  # ticks dropped in the open episode (0: none open)
        self.first = self.last = 0.0  # monotonic times of its first and last drop
        self.told = False  # its store.ticks_dropped sent

    def hit(self, n: int, now: float) -> None:
        """`n` ticks dropped now."""
        if self.count == 0:
            self.first, self.told = now, False
        self.count += n
        self.last = now

    def to_tell(self, now: float) -> bool:
        """Whether the open episode is due its store.ticks_dropped now (once)."""
        if self.count and not self.told and now - self.first >= self.tell_s:
            self.told = True
            return True
        return False

    def forget(self) -> None:
        """The open episode's drops are a write outage's (told by its events): not a lag's."""
        self.count, self.told = 0, False

    def close(self, now: float) -> tuple[int, float, bool] | None:
        """(ticks dropped, span in s, whether it was told) of the episode when it just ended: `quiet_s` without a
        drop."""
        if self.count == 0 or now - self.last < self.quiet_s:
            return None
        done = (self.count, round(self.last - self.first, 1), self.told)
        self.forget()
        return done


@dataclass(slots=True)
class _Tick:
    ts_ms: int
    gpu_rows: list[dict]
    host_row: dict | None
    serving_row: dict | None
    nvlink_rows: list[dict]
    process_rows: list[dict]


@dataclass
class _Op:
    fn: Callable[[sqlite3.Connection], Any]
    future: Future = field(default_factory=Future)
    droppable: bool = False  # an event: dropped (oldest first) when the queue is full; nothing else is
    event_row: tuple | None = None  # an event's row as it will be stored: what pending_events() shows of it


def _now_ms(clock: Callable[[], float]) -> int:
    return int(clock() * 1000)


def _last_read(c: sqlite3.Connection, gpu: int, last_seen_ms: int | None) -> int | None:
    """When index `gpu` was last read: its newest sample since its board's last (re)initialisation, else that
    time. Searched back from the newest tick (every tick holds every GPU's row, a lost one's too): a few rows."""
    since = last_seen_ms if isinstance(last_seen_ms, int) else 0
    try:
        row = c.execute("SELECT ts_ms FROM gpu_samples WHERE ts_ms >= ? AND gpu = ? ORDER BY ts_ms DESC LIMIT 1",
                        (since, gpu)).fetchone()
    except sqlite3.OperationalError:  # no sample table (a file made by a tool): the upsert's time says it
        row = None
    return max(row[0], since) if row else last_seen_ms


def _pending_event(row: tuple) -> Event:
    """A held event's row (record's) as the Event a read of the stored row would give, marked pending."""
    ts, run_id, kind, severity, message, det = row
    return Event(kind, severity, message, json.loads(det) if det is not None else None, run_id, ts, pending=True)


def _low_space(path: Path) -> bool:
    """The file system of `path` has (almost) no space left: an open would fail there."""
    free = free_bytes(path)
    return free is not None and free < FULL_SLACK_BYTES


def _peek_top_run_id(path: Path) -> int:
    """The newest run id in the file, read where it cannot be opened for writing (a full disk: no -shm can be made).

    `immutable=1` reads the main file alone, without -shm or locks: complete after a clean close (which checkpoints
    and removes the -wal); frames still in a -wal are not seen. 0 when even that fails."""
    try:
        c = sqlite3.connect(f"{Path(os.path.abspath(path)).as_uri()}?mode=ro&immutable=1", uri=True)
    except sqlite3.Error:
        return 0
    try:
        return int(c.execute("SELECT COALESCE(MAX(id), 0) FROM runs").fetchone()[0] or 0)
    except sqlite3.Error:
        return 0
    finally:
        c.close()


def linger_for(sample_interval_s: float) -> float:
    """How long the agent's ticks wait to share a transaction (StoreWriter's `linger_s`) at a sampling interval.

    Below 1 s: a second of ticks a transaction (issue 29.3). From 1 s to 2 s: five seconds of ticks (session 12;
    two in session 9): at 1 Hz almost all of the writer's CPU is fixed cost per transaction and wake-up (BEGIN,
    COMMIT's WAL frames, the thread's wake-up, the file checks that share it), and at 5 s a commit lines up with
    the checkpointer's 5 s rounds (one wake-up of each thread a round, see Checkpointer's `commit_every_s`).
    What it trades: a crash (SIGKILL, OOM) loses at most the ticks of the last 5 s instead of none, which is
    what a power loss may cost anyway (commits wait up to 5 s for a checkpoint's fsync: store/checkpoint.py);
    the history shows a tick up to 5 s late, and a -wal/-shm unlinked or a database swapped is noticed up to
    5 s late (the file checks ride the thread's wake-ups). The live views read the socket, not the database;
    events, flush() and close() still write at once. Slower sampling gains nothing from waiting: no linger.
    """
    if sample_interval_s < 1.0:
        return 1.0
    return 5.0 if sample_interval_s < 2.0 else 0.0


def _insert_sql(table: str, key: tuple[str, ...], metrics: tuple[tuple[str, str, str], ...],
                nulls: tuple[bool, ...] | None = None, rows: int = 1, plain: bool = False,
                finite: bool = False) -> str:
    # INTEGER metrics are rounded by SQLite (in C): a float 700.4 would otherwise be stored as an 8-byte REAL.
    # x + 0.5 truncated is round-half-up for the non-negative values these metrics are, and cheaper than
    # round(); NULL stays NULL. `nulls` marks columns written as a literal NULL instead of a bound None.
    # `rows` rows per statement (see ROWS_PER_INSERT). `plain`: every value bound as it is, for values that
    # are ints in [0, 2**52), which the rounding stores unchanged (see _executemany_tick_rows).
    # A non-finite number is no reading: stored as NULL (CAST would make +-Inf INT64 max/min, which read as
    # huge readings; a REAL column would keep Inf, which no CSV reader takes as a number). NaN is bound as
    # NULL by SQLite itself; +-Inf are nulled in the statement (_NO_INF). That costs ~60 ns a value (+50 % of
    # SQLite's insert, measured), so `finite` statements, whose values the caller knows are all finite (their
    # sum is: see _executemany_tick_rows), are written without it; plain ones hold only ints.
    cols = ", ".join(key + tuple(m[0] for m in metrics))
    if plain:
        row = f"({', '.join('?' * (len(key) + len(metrics)))})"
        return f"INSERT OR REPLACE INTO {table} ({cols}) VALUES {', '.join([row] * rows)}"
    exprs = ["{v}"] * len(key) + [(_ROUND if finite else _NO_INF).get(m[1], "{v}") for m in metrics]
    if nulls is not None:
        exprs = ["NULL" if null else e for e, null in zip(exprs, nulls, strict=True)]
    # Each bound value by its number: an expression names its value twice. One row: ?N in VALUES. Many
    # rows: a VALUES list of plain ? read by one SELECT that rounds; expressions inside a multi-row VALUES
    # list cost 2x more per row than one-row statements (measured), outside it they cost as usual.
    named, n = [], 0
    for e in exprs:
        if e != "NULL":
            n += 1
            e = e.format(v=f"?{n}" if rows == 1 else f"column{n}")
        named.append(e)
    if rows == 1:
        return f"INSERT OR REPLACE INTO {table} ({cols}) VALUES ({', '.join(named)})"
    row = f"({', '.join('?' * n)})"
    return f"INSERT OR REPLACE INTO {table} ({cols}) SELECT {', '.join(named)} FROM (VALUES {', '.join([row] * rows)})"


# A metric's stored value by its column type ({v}: the bound value): INTEGER ones rounded. _NO_INF also makes
# +-Inf NULL: x * 0 is NaN for them, which SQLite's arithmetic turns into NULL, and 0 (or -0.0, which adds
# exactly) for any number, so `+ x * 0` leaves numbers as they are (text too in an INTEGER column: the CAST
# already made it a number). A REAL column keeps text as it came (CASE): a bad value is not made a 0 reading.
_ROUND = {"INTEGER": "CAST({v} + 0.5 AS INTEGER)"}
_NO_INF = {"INTEGER": "CAST({v} + 0.5 + {v} * 0 AS INTEGER)", "REAL": "CASE WHEN {v} - {v} = 0 THEN {v} END"}


# kind -> (table, key columns, metrics) of every table a tick's rows go into
_TABLES: dict[str, tuple[str, tuple[str, ...], tuple[tuple[str, str, str], ...]]] = {
    **{kind: (t.name, t.key, t.metrics) for kind, t in SAMPLE_TABLES.items()},
    "processes": ("gpu_processes", ("ts_ms", "gpu", "pid"), tuple((n, t, "") for n, t in PROCESS_COLUMNS)),
}


@functools.lru_cache(maxsize=256)
def _insert_sql_nulls(kind: str, nulls: tuple[bool, ...] | None, rows: int = 1, plain: bool = False,
                      finite: bool = False) -> str:
    return _insert_sql(*_TABLES[kind], nulls, rows, plain, finite)


_EXACT = 2**52  # an int in [0, 2**52) is exact as v + 0.5 in a double: CAST(v + 0.5 AS INTEGER) stores v itself
# C unsigned integers of at least 52 bits (8 bytes on Linux; elsewhere 'L' may be 4): see _unsigned
_UNSIGNED = "L" if array("L").itemsize >= 8 else "Q"


def _unsigned(values: list | tuple) -> bool:
    """Whether no value is below 0, for ints whose sum is under _EXACT (the plain-statement check): an array of C
    unsigned longs refuses a negative int in C at ~10 ns a value, where min() compares each at ~30 (0.8 us of a
    GPU row, issue 29.2). Whatever else refuses too: the statement is then bound with its rounding, as before."""
    try:
        array(_UNSIGNED, values)
    except (TypeError, OverflowError, ValueError):
        return False
    return True


# Rows bound to one INSERT: CPython's sqlite3 pays ~2 us per statement execution on top of ~60 ns per value
# (measured: a 29-column GPU row cost 5.2 us through executemany, 0.65 us of it SQLite's own insert), so
# many rows per execution nearly halve the cost; beyond ~128 rows nothing more is gained.
ROWS_PER_INSERT = 128


def _per_statement(c: sqlite3.Connection, width: int) -> int:
    """Rows bound to one multi-row INSERT of rows `width` values wide (ROWS_PER_INSERT, within SQLite's limit)."""
    return max(1, min(ROWS_PER_INSERT, c.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // max(1, width)))


def _statements(n: int, per: int) -> list[int]:
    """Rows per statement for `n` rows: full statements of `per`, then the rest in powers of two.

    A batch smaller than `per` (a 1 Hz tick's 8 GPU rows, a lingering 10 Hz second's 80) went one row per
    execution before (issue 29.3); powers of two keep the statements prepared for the rest to a handful per
    table and NULL pattern (CPython's statement cache holds 128), and the executions to a few per batch.
    """
    rest = n % per
    return [per] * (n // per) + [1 << i for i in reversed(range(rest.bit_length())) if rest >> i & 1]


def _executemany_rows(c: sqlite3.Connection, kind: str, nulls: tuple[bool, ...] | None, rows: list[tuple]) -> None:
    """Insert `rows` (all of one width) in multi-row statements (see _statements)."""
    at = 0
    finite = _finite(rows)
    for size, count in _runs(_statements(len(rows), _per_statement(c, len(rows[0])))):
        sql = _insert_sql_nulls(kind, nulls, size, finite=finite)
        if size == 1:
            c.executemany(sql, rows[at:at + count])
        else:
            c.executemany(sql, [tuple(chain.from_iterable(rows[i:i + size]))
                                for i in range(at, at + size * count, size)])
        at += size * count


def _finite(rows: list[tuple]) -> bool:
    """Whether every value of `rows` is a finite number, by their sum in C (one +-Inf makes it infinite, NaN or both
    infinities NaN): a few microseconds for a tick's rows, where the expression that nulls +-Inf in the statement
    cost a third of the 1 Hz writer thread (measured). Text or an odd type: not known (False)."""
    try:
        total = sum(chain.from_iterable(rows))
    except (TypeError, OverflowError):
        return False
    return total - total == 0


def _runs(sizes: list[int]) -> list[tuple[int, int]]:
    """(size, how many in a row) of a list of statement sizes: one executemany per run."""
    out: list[tuple[int, int]] = []
    for size in sizes:
        if out and out[-1][0] == size:
            out[-1] = (size, out[-1][1] + 1)
        else:
            out.append((size, 1))
    return out


def _executemany_tick_rows(c: sqlite3.Connection, kind: str, rows: list[tuple]) -> None:
    """Insert rows, writing missing readings as literal NULLs.

    CPython's sqlite3 binds None through its slow adaptation path (~1 us each, measured: a serving row of
    mostly-missing readings inserted 5x slower than one of floats), and a sampler's None pattern is stable
    from tick to tick, so rows are grouped by that pattern and each group gets its own cached statement.

    Most statements hold no None at all (GPU and NVLink rows): a statement's values are flattened first and
    summed, which raises on a None (or text) at ~10 ns a value; `None in row` compares every value with None
    through rich comparison (~100 ns a value: 3 us of a 29-column GPU row, issue 29.2). A statement the sum
    refuses is tried as a whole with its first row's NULL pattern (see _one_pattern: host and serving rows
    keep theirs tick after tick); only one whose rows differ (or hold text) is grouped row by row.

    A statement whose values are all ints in [0, 2**52) (every GPU and NVLink row the samplers make) is bound
    plainly, without the rounding expression per INTEGER value (4 VDBE steps each, ~30 % of an 80-row GPU
    insert, session 9): the sum already says "ints only" (a float makes it a float), and with no value below 0
    a sum under 2**52 bounds every value, so one min() more decides; rounding such a value stores it unchanged.

    The sum also says whether every value is finite: one +-Inf makes it infinite, NaN or both infinities NaN.
    Only a statement whose sum is not finite (rows grouped row by row: their group's, _finite) pays for the
    expression that stores +-Inf as NULL (see _insert_sql); a finite sum costs one subtraction a statement.
    """
    # (pattern, rows, plain, finite) -> values
    flat: dict[tuple[tuple[bool, ...] | None, int, bool, bool], list[Any]] = {}
    rest: list[tuple] = []
    at = 0
    for size in _statements(len(rows), _per_statement(c, len(rows[0]))):
        chunk = rows[at:at + size]
        at += size
        if size > 1:
            values = []  # sqlite3 binds a list as a tuple; filled row by row: 0.07 us a GPU row, tuple(chain()) 0.33
            for r in chunk:
                values += r
        else:
            values = chunk[0]
        mask = None
        try:
            total = sum(values)  # numbers only: no None among them (an int, float or bool sums without raising)
        except (TypeError, OverflowError):  # OverflowError: an int past a float's range; binding says why
            mask, values, finite = _one_pattern(chunk) if size >= PATTERN_MIN_ROWS else (None, (), False)
            if mask is None:
                rest += chunk
                continue
            plain = False
        else:
            plain = type(total) is int and total < _EXACT and _unsigned(values)
            finite = total - total == 0  # an int, or a finite float (inf - inf and NaN - NaN are NaN)
        flat.setdefault((mask, size, plain, finite), []).append(values)
    for (mask, size, plain, finite), statements in flat.items():  # rows of one kind are all as wide (one getter)
        c.executemany(_insert_sql_nulls(kind, mask, size, plain, finite), statements)
    groups: dict[tuple[bool, ...], list[tuple]] = {}
    for r in rest:
        mask = _null_mask(r)
        group = groups.get(mask)
        if group is None:
            groups[mask] = group = []
        group.append(r)
    for mask, group in groups.items():
        if True in mask:  # the values left, taken by one C-level getter per pattern (cached)
            _executemany_rows(c, kind, mask, list(map(_non_null(mask), group)))
        else:
            _executemany_rows(c, kind, None, group)


# Statements of fewer rows go row by row: the whole-statement checks cost a few microseconds more than the
# patterns of a handful of rows (measured: a 1 Hz tick's one host row +4.5 us, a 10 Hz second's 8 + 2 even).
PATTERN_MIN_ROWS = 16


def _one_pattern(chunk: list[tuple]) -> tuple[tuple[bool, ...] | None, list | tuple, bool]:
    """(NULL pattern, the values it leaves, flattened, whether its numbers are all finite) when every row of
    `chunk` has its first row's Nones, text where it has text (host rows' JSON) and numbers elsewhere;
    (None, (), False) otherwise. C-level checks over the whole chunk: a pattern a row cost more than the
    statement's binding (~1.5 us for a 44-column serving row, issue 29.2)."""
    first = chunk[0]
    mask = _null_mask(first)
    text = tuple(map(isinstance, first, repeat(str)))
    if True not in mask and True not in text:
        return None, (), False  # numbers only, yet the sum refused: a huge int or an odd type (row by row)
    keep, numbers, texts, nulls = _pattern_getters(mask, text)
    try:
        total = sum(chain.from_iterable(map(numbers, chunk)))  # a None (or text) where the first row had a number
    except (TypeError, OverflowError):
        return None, (), False
    if texts is not None and set(map(type, chain.from_iterable(map(texts, chunk)))) != {str}:
        return None, (), False
    if nulls is not None and len(chunk) > 1:
        seen = tuple(chain.from_iterable(map(nulls, chunk)))
        if seen.count(None) != len(seen):  # identity first: ~10 ns a None
            return None, (), False  # a value where the first row had a None
    values: list = []
    for r in map(keep, chunk):  # see _executemany_tick_rows: cheaper than tuple(chain(...))
        values += r
    return mask, values, total - total == 0


@functools.lru_cache(maxsize=256)
def _pattern_getters(mask: tuple[bool, ...], text: tuple[bool, ...]) -> tuple[Callable, Callable, Callable | None,
                                                                               Callable | None]:
    """Getters (each returns a tuple) of a row's non-NULL values, its numbers, its texts and its NULLs."""
    def getter(flags: list[bool]) -> Callable | None:
        return _non_null(tuple(not f for f in flags)) if any(flags) else None

    numbers = getter([not n and not t for n, t in zip(mask, text, strict=True)]) or (lambda r: ())
    return _non_null(mask), numbers, getter([t and not n for n, t in zip(mask, text, strict=True)]), getter(list(mask))


def _null_mask(row: tuple | list) -> tuple[bool, ...]:
    """Which values of a row are None, by C-level map (a genexpr cost ~3 us a row)."""
    return tuple(map(is_, row, repeat(None)))


@functools.lru_cache(maxsize=256)
def _non_null(mask: tuple[bool, ...]) -> Callable[[tuple | list], tuple]:
    """A getter of a row's values that `mask` does not mark None, as a tuple (even of one)."""
    at = [i for i, null in enumerate(mask) if not null]
    if len(at) == 1:
        only = at[0]
        return lambda r: (r[only],)
    return itemgetter(*at)


_TICK_SQL = {kind: _insert_sql(t.name, t.key, t.metrics) for kind, t in SAMPLE_TABLES.items()}
_NAMES = {kind: tuple(m[0] for m in t.metrics) for kind, t in SAMPLE_TABLES.items()}
_PER_CORE = 1 + _NAMES["host"].index("cpu_per_core_pct")  # the one list-valued column: stored as JSON
_PROC_NAMES = tuple(n for n, _ in PROCESS_COLUMNS)
_RUN_FIELDS = {n for n, _ in RUN_COLUMNS}
_GPU_FIELDS = tuple(n for n, _ in GPU_FACT_COLUMNS
                    if n not in ("first_seen_ms", "last_seen_ms", *gpu_identity.IDENTITY_COLUMNS))
_BENCH_FIELDS = {n for n, _ in BENCH_COLUMNS} - {"details"}


_KEYED = {kind: ("gpu", *_NAMES[kind]) for kind in ("gpu", "nvlink")}
_GET = {kind: itemgetter(*names) for kind, names in _KEYED.items()}


def _rows(ts: int, rows: list[dict], get: Callable[[dict], tuple], names: tuple[str, ...]) -> list[tuple]:
    """(ts, gpu, metrics...) per row; itemgetter is the fast path, .get() fills keys a sampler left out."""
    head = (ts,)
    try:
        return [head + get(r) for r in rows]
    except KeyError:
        return [(ts, *map(r.get, names)) for r in rows]


_NO_PROCESS = (None,) * len(_PROC_NAMES)


class SlowRows:
    """Which of a tick's NVLink per-link and process rows are readings not yet stored (docs/store.md).

    The GPU sampler reads those about once a second and hands the SAME row objects to every tick until the next
    read (agent/gpu/sampler.py), so a row is fresh when it is not the object last stored for its GPU: each
    reading is stored once, at the tick it was read. A GPU of the tick (a row in gpu_rows, lost ones too) whose
    reading went away is stored as such: an all-NULL link row, a process row with pid NO_PROCESS_PID. The state
    is a copy per transaction, kept only when it commits: a rolled-back batch's readings stay fresh."""

    def __init__(self, links: dict | None = None, procs: dict | None = None, known: set | None = None):
        self.links: dict[int, dict] = links or {}  # gpu -> the link row last stored (held: its id stays unique)
        self.procs: dict[int, dict] = procs or {}  # gpu -> the first process row last stored
        # GPUs seen since this writer started: a GPU first seen without a reading has it stored as gone, so a
        # reading stored before a restart is not taken for the one in force after it
        self.known: set[int] = known or set()

    def copy(self) -> SlowRows:
        return SlowRows(dict(self.links), dict(self.procs), set(self.known))

    def fresh(self, ts: int, t: _Tick, procs: list) -> list[dict]:
        """The tick's link rows to store; its process rows to store appended to `procs` as tuples."""
        links, last_procs = self.links, self.procs
        nvl: list[dict] = []
        for r in t.nvlink_rows:
            g = r["gpu"]
            if links.get(g) is not r:
                links[g] = r
                nvl.append(r)
        first: dict[int, dict] = {}  # gpu -> its first process row this tick
        for r in t.process_rows:
            g = r["gpu"]
            if g not in first:
                first[g] = r
        for g, r in first.items():
            if last_procs.get(g) is not r:
                last_procs[g] = r
                procs += [(ts, p["gpu"], p["pid"], *map(p.get, _PROC_NAMES)) for p in t.process_rows
                          if p["gpu"] == g]
        if len(links) > len(t.nvlink_rows) or len(last_procs) > len(first) or len(self.known) < len(t.gpu_rows):
            self._gone(ts, t, nvl, procs)
        return nvl

    def _gone(self, ts: int, t: _Tick, nvl: list, procs: list) -> None:
        """GPUs of this tick whose stored link or process reading is no longer there: stored as gone."""
        in_tick = {r.get("gpu") for r in t.gpu_rows}
        with_links = {r["gpu"] for r in t.nvlink_rows}
        with_procs = {r["gpu"] for r in t.process_rows}
        for g in in_tick - self.known:
            self.known.add(g)
            if g not in with_links and g not in self.links:
                nvl.append({"gpu": g, **dict.fromkeys(_NAMES["nvlink"])})
            if g not in with_procs and g not in self.procs:
                procs.append((ts, g, NO_PROCESS_PID, *_NO_PROCESS))
        for g in [g for g in self.links if g in in_tick and g not in with_links]:
            del self.links[g]
            nvl.append({"gpu": g, **dict.fromkeys(_NAMES["nvlink"])})
        for g in [g for g in self.procs if g in in_tick and g not in with_procs]:
            del self.procs[g]
            procs.append((ts, g, NO_PROCESS_PID, *_NO_PROCESS))


def _jsonable(v: Any) -> Any:
    return json.dumps(v, default=str) if isinstance(v, (list, tuple, dict)) else _storable(v)


def _storable(v: Any) -> Any:
    """A text SQLite can store: a lone surrogate (a foreign process's argv or title read with surrogateescape)
    is not UTF-8, and the driver's refusal would drop the whole write; it is kept as its escape (`\\udce9`)."""
    if not isinstance(v, str) or v.isascii():
        return v
    try:
        v.encode()
    except UnicodeEncodeError:
        return v.encode(errors="backslashreplace").decode()
    return v


class StoreWriter:
    """See docs/contracts.md. Construct (opens, checks, migrates; on a full disk starts unopened and opens
    later, see _start_unopened), `start()`, submit, `close()`."""

    def __init__(self, path: str | os.PathLike, retention: retention_mod.RetentionPolicy | None = None,
                 queue_max: int = 600, *,
                 clock: Callable[[], float] = time.time, retry_interval_s: float = 1.0,
                 maintenance_interval_s: float = 60.0, batch_max_ticks: int = 1000,
                 retention_chunk: int = retention_mod.CHUNK_ROWS, integrity_check: bool = True,
                 wal_check_interval_s: float = WAL_CHECK_S, lock: bool = False, linger_s: float = 0.0,
                 on_event: Callable[[Event], None] | None = None, lag_quiet_s: float = LAG_QUIET_S,
                 lag_tell_s: float = LAG_TELL_S):
        self.path = Path(path)
        # The store's own events (store.*): with `on_event` (the agent's EventSink.put, injected because the store
        # may not import the agent) they take the agent's one path, which writes them back through `record`,
        # publishes and logs them; without it (tools, tests) they are written and logged here. Those made while
        # opening (a damaged file moved aside) wait for start(): the sink that takes them needs this writer.
        self.on_event = on_event
        self._held: list[Event] | None = [] if on_event is not None else None
        self.retention = retention if retention is not None else Retention()  # the config's defaults
        self.queue_max = max(1, int(queue_max))
        self.clock = clock
        self.retry_interval_s = retry_interval_s
        self.maintenance_interval_s = maintenance_interval_s
        self.batch_max_ticks = batch_max_ticks
        # ticks wait up to this long for the next ones, to be written together (see _wait); 0: each at once
        self.linger_s = max(0.0, float(linger_s))
        self._flushing = 0  # callers of flush() waiting: the thread writes at once
        # Monotonic time the queued ticks are written at (None: no tick queued nor expected). After a lingering
        # batch it is set one linger ahead before the next tick comes: the thread wakes then by itself, and the
        # ticks of that second are submitted without waking it (see submit_tick).
        self._due_at: float | None = None
        self._waiting_until: float | None = None  # when the thread's current wait ends; None: not waiting
        self.retention_chunk = retention_chunk
        self.moved_aside: Path | None = None  # where a damaged/foreign file went, if it did
        self.wal_check_interval_s = wal_check_interval_s

        self._cv = threading.Condition()
        self._ticks: deque[_Tick] = deque()
        self._ops: deque[_Op] = deque()
        # Non-tick writes held while the database refuses writes: events beyond this are dropped, oldest first
        # (a fault's events at one a second are 3,600 an hour); run rows, GPUs and bench results are never dropped.
        self.ops_max = OPS_MAX
        self._dropped_events = 0
        self._dropped_events_told = 0  # dropped events already counted in a store.writes_resumed
        self._busy = False  # a batch taken from the queues is being written
        self._writing_ops: list[_Op] = []  # the non-tick writes of that batch (seen by pending_events)
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._inline_lock = threading.Lock()
        self._checkpointer: Checkpointer | None = None

        self._dropped = 0
        self._lag = _LagDrops(lag_quiet_s, lag_tell_s)  # a lagging writer's drops, told once an episode
        self._slow = SlowRows()  # the NVLink/process readings stored last, per GPU (writer thread only)
        self._failed = 0  # ticks the database refused (a bad value): dropped, and the agent is unhealthy
        self._last_rejected: float | None = None  # monotonic time of the last refused tick
        self._written = 0
        self._commits = 0
        self._last_error: str | None = None
        self._last_error_ms: int | None = None
        self._last_commit_ms: int | None = None
        self._last_tick_ts: int | None = None
        self._trouble_since: float | None = None  # monotonic time the current transient failure began
        self._dropped_at_trouble = 0
        self._next_maintenance = 0.0
        self._maintenance_more = False
        self._last_maintain = 0.0
        self._next_wal_check = 0.0
        self._wal_unlinked: str | None = None  # what was found, kept for status until the agent restarts
        self._wal_unlinked_ms: int | None = None
        self._wal_recovered: bool | None = None
        self._conn_lost = False  # the connection was closed for a renewal and could not be reopened yet
        # a descriptor on the database file itself: its identity for the swap watch (rm, mv) and, with
        # `lock` (the agent), an exclusive flock: a second agent reaching the file by any path is refused
        self._lock = lock
        self._db_fd: int | None = None
        self._carried: swap.Carried | None = None  # rows to write into the file the path names now
        self._db_swapped: str | None = None  # what the last swap was, kept for status
        self._db_swapped_ms: int | None = None

        self._id_writes = 0  # transactions that may have added or deleted rows with ids (ops, retention)
        self._next_run_id = 1
        self._gpu_idx_seen: set[int] = set()  # NVML indices upserted by this writer (this agent process)
        self._integrity_check = integrity_check
        self._unopened: str | None = None  # why the database could not be opened yet (a full disk), see below
        self._open_wait = OPEN_RETRY_S[0]
        self._open_due = 0.0  # monotonic time of the next open attempt while unopened
        self._open_low = False  # the last attempt found (almost) no free space: retried at once when there is
        self.conn: sqlite3.Connection | None = None
        self.rollups: Rollups | None = None
        try:
            conn = self._open_held(integrity_check)  # the file locked before anything is written or migrated
        except DiskFull as exc:
            self._start_unopened(exc)
        else:
            self._use(conn)

    # ------------------------------------------------------------------------------------------ opening

    def _open_held(self, integrity_check: bool) -> sqlite3.Connection:
        """Hold (and lock) the file the path names, then open it; a damaged file moved aside, the fresh one held."""
        if self._db_fd is None:
            self._hold_file()
        aside = self.moved_aside
        conn = self._open(integrity_check)
        if self.moved_aside is not aside:
            self._hold_file()  # the path names the fresh file now
        return conn

    def _use(self, conn: sqlite3.Connection) -> None:
        """Take an open connection: what the writer reads from the file before writing into it."""
        self.conn = conn
        self._marks = swap.Marks.take(conn, None)
        # (connection, id writes) the marks' ids were read at: while both hold, only ticks were committed since
        # and the ids are still the newest (see _take_marks)
        self._marks_at: tuple[sqlite3.Connection, int] = (conn, self._id_writes)
        self.rollups = Rollups(conn)
        mask_run_flags(conn)  # secret env values an older agent stored in runs.flags (issue 24.3)
        top = conn.execute("SELECT COALESCE(MAX(id), 0) FROM runs").fetchone()[0] or 0
        with self._cv:
            self._next_run_id = max(self._next_run_id, top + 1)

    def _start_unopened(self, exc: DiskFull) -> None:
        """The database cannot be opened because its disk is full: start without it rather than raise.

        A stopping agent's clean close removes the -wal/-shm, and on a full disk SQLite cannot create a new -shm:
        refusing to start would have systemd give up after a few tries, leaving serving unsupervised. Writes are
        kept as during any write outage (ticks up to queue_max, oldest dropped and counted; events up to ops_max)
        while the thread retries the open (_retry_open), through the lost-connection path of _drain_once, so an
        open writer pays nothing for this. Other open failures (damage, permissions, a newer schema, a lock)
        still raise: those are the operator's to fix.
        """
        self._unopened = exc.reason
        self._conn_lost = True
        self._trouble_since = time.monotonic()
        self._open_due = self._trouble_since + self._open_wait
        self._open_low = _low_space(self.path)
        # the ids of runs started meanwhile stay above those in the file (read without -shm: see _peek_top_run_id)
        self._next_run_id = _peek_top_run_id(self.path) + 1
        msg = self._unavailable_msg(exc.reason)
        self._note_error(msg)
        self._event(Event(EventKind.STORE_WRITE_FAILED, Severity.ERROR, msg,
                          {"path": str(self.path), "error": str(exc), "opened": False}))

    def _unavailable_msg(self, why: str) -> str:
        return (f"history unavailable: {why}; the agent runs without it, keeping up to {self.queue_max} ticks in "
                f"memory (oldest dropped beyond that), and retries opening it every {OPEN_RETRY_S[0]:g}-"
                f"{OPEN_RETRY_S[1]:g} s and as soon as the file system has space")

    def _retry_open(self) -> bool:
        """One attempt at the open that failed at start (see _start_unopened), when due; True once open."""
        now = time.monotonic()
        if now < self._open_due and not (self._open_low and not _low_space(self.path)):
            return False
        conn = None
        try:
            conn = self._open_held(self._integrity_check)
            self._use(conn)
        except (StoreError, sqlite3.Error) as exc:  # still full, or now another problem: said, retried all the same
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
                self.conn = None
            self._unopened = exc.reason if isinstance(exc, DiskFull) else str(exc)
            self._open_wait = min(self._open_wait * 2, OPEN_RETRY_S[1])
            self._open_due = now + self._open_wait
            self._open_low = _low_space(self.path)
            self._note_error(self._unavailable_msg(self._unopened))
            return False
        conn.execute(f"PRAGMA wal_autocheckpoint = {FALLBACK_AUTOCHECKPOINT_PAGES}")
        self._unopened = None
        self._conn_lost = False
        if self._thread is not None and self._checkpointer is None:
            self._start_checkpointer()
        log.warning("%s: the history database is open; writing what was kept meanwhile", self.path)
        return True

    def _open(self, integrity_check: bool) -> sqlite3.Connection:
        try:
            return connect_rw(self.path, integrity=integrity_check)
        except NotOurDatabase as exc:
            reason = str(exc)
        aside = self._move_aside()
        conn = connect_rw(self.path, integrity=False)
        msg = f"{reason}; moved it to {aside} and started a fresh history database"
        self._last_error, self._last_error_ms = msg, _now_ms(self.clock)
        self._event(Event(EventKind.STORE_MOVED_ASIDE, Severity.ERROR, msg,
                          {"path": str(self.path), "moved_to": str(aside)}))
        return conn

    def _hold_file(self) -> None:
        """Open (creating it, as SQLite would) the database file and keep it open; lock it for the agent."""
        problem = sidecar_problem(self.path)
        if problem:
            raise StoreError(f"{self.path}: cannot open the history database: {problem}")
        create_file(self.path)
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot open the history database: {exc.strerror}") from None
        if self._lock:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holders = inproc.lock_holders(os.fstat(fd))
                os.close(fd)  # this process has no connection on it: no SQLite lock is dropped
                real = os.path.realpath(self.path)
                via = f" (reached through {self.path})" if real != os.path.abspath(self.path) else ""
                who = f"pid {', '.join(map(str, holders))}" if holders else "another process"
                raise StoreError(f"{real}{via}: the history database is locked by {who}, another lynxtop agent "
                                 "writing it; two agents must never write one database (their run ids "
                                 "collide): stop that agent or point [agent] database at another file") from None
        old, self._db_fd = self._db_fd, fd
        if old is not None:
            os.close(old)

    def _move_aside(self) -> Path:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 1
        while aside.exists():
            n += 1
            aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
        for src in sidecar_paths(self.path):  # the -wal belongs to the old file: it must never meet a new one
            if src.exists():
                try:
                    os.replace(src, Path(str(aside) + str(src)[len(str(self.path)):]))
                except OSError as exc:
                    raise StoreError(f"{self.path}: is damaged and cannot be moved aside to {aside}: "
                                     f"{exc.strerror}") from None
        self.moved_aside = aside
        return aside

    # ------------------------------------------------------------------------------------------ public API

    def start(self) -> None:
        self._hand_over_held()
        if self._thread is None:
            if self.conn is not None:  # unopened (a full disk): both when the retried open succeeds
                self.conn.execute(f"PRAGMA wal_autocheckpoint = {FALLBACK_AUTOCHECKPOINT_PAGES}")
                self._start_checkpointer()
            self._thread = threading.Thread(target=self._run, name="lynxtop-store-writer", daemon=True)
            self._thread.start()

    def submit_tick(self, ts_ms: int, gpu_rows: Iterable[dict] = (), host_row: dict | None = None,
                    serving_row: dict | None = None, nvlink_rows: Iterable[dict] = (),
                    process_rows: Iterable[dict] = ()) -> None:
        """Queue one sampling tick; never blocks. A full queue drops the oldest tick (counted in stats)."""
        tick = _Tick(int(ts_ms), list(gpu_rows or ()), host_row, serving_row, list(nvlink_rows or ()),
                     list(process_rows or ()))
        told: list[Event] = []
        with self._cv:
            self._ticks.append(tick)
            n = len(self._ticks)
            lost = 0
            while n > self.queue_max:
                self._ticks.popleft()
                lost += 1
                n -= 1
            if lost or self._lag.count:
                self._dropped += lost
                told = self._lag_events(lost)
            # The thread is woken only when it would otherwise look too late: a lingering one already waits
            # for this tick's second (10 Hz: one wake-up a second, not two), a busy one looks when done.
            if n >= self.batch_max_ticks:
                self._due_at = 0.0  # a full batch goes at once
            elif self._due_at is None:
                self._due_at = time.monotonic() + self.linger_s
            waiting = self._waiting_until
            if waiting is not None and waiting > self._due_at:
                self._waiting_until = None  # one notify per wait
                self._cv.notify()
        for event in told:  # outside the lock: the agent's sink writes them back through record()
            held = self._held is not None
            self._event(event)
            if held:  # not started: the sink takes it at start(); the log tells the operator now
                log.warning("%s", event.message)

    def _lag_events(self, lost: int) -> list[Event]:
        """The events of a lag episode that `lost` ticks dropped now add to, or that is due its telling or just
        ended (called holding the condition). Drops while writes fail or the file is not open yet are the outage's
        (store.write_failed, store.writes_resumed)."""
        now, lag = time.monotonic(), self._lag
        if self._trouble_since is not None or self._unopened is not None:
            if not lag.told:
                lag.forget()
            return []
        if lost:
            lag.hit(lost, now)
        if lag.to_tell(now):
            return [Event(EventKind.STORE_TICKS_DROPPED, Severity.WARNING,
                          f"{self.path}: the history writer lags behind the samples: its queue of {self.queue_max} "
                          "ticks is full and the oldest are dropped, with no write error (a slow disk or a busy "
                          f"CPU); store.writer_caught_up gives the count once none is dropped for {lag.quiet_s:g} s",
                          {"queue_max": self.queue_max, "dropped_total": self._dropped + self._failed})]
        done = None if lost else lag.close(now)
        if done is None:
            return []
        count, span, told = done
        return [Event(EventKind.STORE_WRITER_CAUGHT_UP, Severity.WARNING,
                      f"{self.path}: the history writer keeps up again; {count} ticks were dropped over {span:g} s "
                      "while it lagged" + ("" if told else " (a burst too short to be told when it began)"),
                      {"dropped_ticks": count, "span_s": span})]

    def _event(self, event: Event) -> None:
        """One of the store's own events: to `on_event` (held until start), else written and logged here."""
        if self._held is not None:
            self._held.append(event)
        elif self.on_event is not None:
            self.on_event(event)
        else:
            self.record(event)
            log.log(_LOG_LEVELS.get(str(event.severity), logging.INFO), "%s", event.message)

    def _hand_over_held(self) -> None:
        held, self._held = self._held or [], None
        for event in held:
            self._event(event)

    def record(self, event: Event) -> None:
        """Queue one event: the one way events reach the store. Kinds are stored by their dotted name
        (an old name is mapped, so new rows never need the reader's mapping); never blocks."""
        if str(event.severity) not in EVENT_SEVERITIES:
            raise ValueError(f"event severity {event.severity!r} is not one of {', '.join(EVENT_SEVERITIES)}")
        ts = int(event.ts_ms) if event.ts_ms is not None else _now_ms(self.clock)
        det = json.dumps(event.details, default=str) if event.details is not None else None
        row = (ts, event.run_id, canonical_kind(str(event.kind)), str(event.severity), _storable(event.message), det)
        self._enqueue_op(lambda c: c.execute(
            "INSERT INTO events (ts_ms, run_id, kind, severity, message, details) VALUES (?, ?, ?, ?, ?, ?)",
            row).lastrowid, droppable=True, event_row=row)

    def pending_events(self) -> list[Event]:
        """The events recorded but not written yet (queued, or in the batch being written), oldest queued first,
        as the database will hold them (id None) and marked `pending`: fresh copies, taken under the lock.

        Empty unless writes fail (a full disk, a read-only remount): then the events that explain the outage
        wait here, and `GET /v1/events` answers them beside the stored ones. Not for the tick's path: it copies
        the whole queue (at most `ops_max`). An event may be written just after this returns: a caller that
        then reads the database drops the copy the database already holds (see agent/api/pending.py).
        """
        with self._cv:  # a failed batch is put back in front before _writing_ops is cleared: each op once
            ops = {id(op): op for op in (*self._writing_ops, *self._ops)}.values()
            rows = [op.event_row for op in ops if op.event_row is not None and not op.future.done()]
        return [_pending_event(r) for r in rows]

    def create_run(self, run_id: int | None = None, **fields: Any) -> int:
        """Queue a run's row and return its id at once, without waiting for the disk.

        A run that starts is always recorded: its id comes from memory (above every id this writer has seen),
        and the row waits in the queue like any write while the disk is full or busy. With `run_id` given
        (a run adopted from serving.json whose row may never have reached the file) the row is written only
        if it is missing, and later ids stay above it.
        """
        values = self._run_values(fields)
        with self._cv:
            if run_id is None:
                run_id = self._next_run_id
            run_id = int(run_id)
            self._next_run_id = max(self._next_run_id, run_id + 1)
        values = {"id": run_id, **values}
        cols = list(values)
        sql = f"INSERT OR IGNORE INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
        params = [values[k] for k in cols]
        self._enqueue_op(lambda c: c.execute(sql, params))
        if self._thread is None:  # not started (tests, tools): written inline, as the other calls are
            with self._inline_lock:
                self._drain_once()
        return run_id

    def update_run(self, run_id: int, **fields: Any) -> None:
        values = self._run_values(fields)
        if not values:
            return
        sql = f"UPDATE runs SET {', '.join(f'{k} = ?' for k in values)} WHERE id = ?"
        self._enqueue_op(lambda c: c.execute(sql, [*values.values(), run_id]))

    def upsert_gpus(self, gpus: Iterable[dict], enumerated: int | None = None) -> None:
        """The GPUs' static facts, and which board each NVML index holds since when (store/gpu_identity.py).

        Boards at indices the file knows under other UUIDs are one `gpu.identity_changed` (warning), told here
        only for indices this writer stores for the first time: those changed while no agent ran (a board
        swapped on a powered-off node, a board gone and the ones after it shifted, the last board gone with no
        other taking its index, a gone board back). Later changes in the same process are the GPU sampler's to
        tell (agent/gpu/lost.py remembers the indices from its first open on): each change is told once. The
        event goes out after the transaction that records it commits. `enumerated`: NVML's device count, when
        the caller knows it (a board NVML lists but could not read is then not taken for gone)."""
        now = _now_ms(self.clock)
        rows = []
        for g in gpus:
            if not g.get("uuid"):
                raise ValueError("upsert_gpus: every GPU needs a 'uuid'")
            rows.append((g["uuid"], *(_jsonable(g.get(k)) for k in _GPU_FIELDS), now, now))
        if not rows:
            return
        idx_at = _GPU_FIELDS.index("idx") + 1
        found = {r[idx_at]: r[0] for r in rows if isinstance(r[idx_at], int)}
        with self._cv:
            told_before = set(self._gpu_idx_seen)  # a copy: the op may run after a later call grew the set
            self._gpu_idx_seen |= set(found)
        ident = gpu_identity.IDENTITY_COLUMNS
        cols = ("uuid", *_GPU_FIELDS, "first_seen_ms", "last_seen_ms", *ident)
        # a serial that could not be read this time keeps the one stored: the same UUID is the same board
        updates = ", ".join(f"{k} = COALESCE(excluded.{k}, {k})" if k == "serial" else f"{k} = excluded.{k}"
                            for k in (*_GPU_FIELDS, "last_seen_ms", *ident))
        sql = (f"INSERT INTO gpus ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))}) "
               f"ON CONFLICT (uuid) DO UPDATE SET {updates}")

        def write(c: sqlite3.Connection) -> list[dict]:
            cur = c.execute(f"SELECT uuid, idx, first_seen_ms, last_seen_ms, {', '.join(ident)} FROM gpus")
            names = [d[0] for d in cur.description]
            stored = [dict(zip(names, r, strict=True)) for r in cur]
            by_uuid = {r["uuid"]: r for r in stored}
            out = []
            for r in rows:
                was = by_uuid.get(r[0])
                since, hist = (now, None) if was is None else gpu_identity.moved(was, r[idx_at], now)
                out.append((*r, since, hist))
            c.executemany(sql, out)
            found_changes = gpu_identity.changes(stored, found, enumerated)
            now_at = set(found.values())
            for ch in found_changes:
                if "seen_until_ms" in ch:  # gone: it claims no index any more, so it is told once
                    ch["seen_until_ms"] = _last_read(c, ch["gpu"], by_uuid[ch["old_uuid"]].get("last_seen_ms"))
                    # the boards it had replaced there too: left at the index, the next start took them for gone
                    left = [r for r in stored if r["uuid"] not in now_at]  # a board found now was written above
                    c.executemany("UPDATE gpus SET idx = NULL, idx_history = ? WHERE uuid = ?",
                                  gpu_identity.gone(left, ch["gpu"], now, ch["seen_until_ms"]))
            return [ch for ch in found_changes if ch["gpu"] not in told_before]

        def tell(done: Future) -> None:
            if done.cancelled() or done.exception() is not None or not done.result():
                return
            found_changes = done.result()
            self._event(Event(EventKind.GPU_IDENTITY_CHANGED, Severity.WARNING, gpu_identity.message(found_changes),
                              {"changes": found_changes}, ts_ms=now))

        self._enqueue_op(write).future.add_done_callback(tell)

    def add_bench_result(self, result: dict, timeout: float = 30.0) -> int:
        """Store one benchmark result; known keys get columns, the rest go into `details` (JSON)."""
        known = {k: _jsonable(v) for k, v in result.items() if k in _BENCH_FIELDS}
        extra = {k: v for k, v in result.items() if k not in _BENCH_FIELDS}
        if isinstance(result.get("details"), dict):
            extra = {**result["details"], **{k: v for k, v in extra.items() if k != "details"}}
        known.setdefault("ts_ms", _now_ms(self.clock))
        known["details"] = json.dumps(extra, default=str) if extra else None
        cols = list(known)
        sql = f"INSERT INTO bench_results ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
        return self._call(lambda c: c.execute(sql, [known[k] for k in cols]).lastrowid, timeout)

    def alive(self) -> bool:
        """True while the writer thread runs (for the agent's health check and watchdog)."""
        t = self._thread
        return t is not None and t.is_alive()

    def stats(self) -> dict[str, Any]:
        with self._cv:
            return {
                "path": str(self.path),
                "queued": len(self._ticks) + len(self._ops),
                "dropped": self._dropped + self._failed,  # a refused tick is as lost as an overflowed one
                "failed": self._failed,
                "rejected": self._failed,
                "rejected_age_s": (None if self._last_rejected is None
                                   else round(time.monotonic() - self._last_rejected, 1)),
                "written_ticks": self._written,
                "tick_commits": self._commits,
                "last_error": self._last_error,
                "last_error_ms": self._last_error_ms,
                "last_commit_ms": self._last_commit_ms,
                "last_tick_ts_ms": self._last_tick_ts,
                "retrying": self._trouble_since is not None,
                "alive": self.alive(),
                "wal_unlinked": self._wal_unlinked,
                "wal_unlinked_ms": self._wal_unlinked_ms,
                "wal_recovered": self._wal_recovered,
                "db_swapped": self._db_swapped,
                "db_swapped_ms": self._db_swapped_ms,
                "unavailable": self._last_error if self._unopened is not None else None,  # never opened yet
            }

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything queued so far is written; False on timeout (for example a full disk)."""
        deadline = time.monotonic() + timeout
        with self._cv:
            if self._thread is None:
                return not (self._ticks or self._ops)
            self._flushing += 1
            self._cv.notify_all()  # a lingering thread stops waiting
            try:
                while self._ticks or self._ops or self._busy:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cv.wait(min(left, 0.05))
                return True
            finally:
                self._flushing -= 1

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued (up to `timeout`), stop the thread, close the database."""
        if self._thread is None and self._held:  # never started: nobody took the events of opening
            self.on_event, held, self._held = None, self._held, None
            for event in held:
                self._event(event)
        if self._thread is not None:
            self.flush(timeout)
            with self._cv:
                self._stopping = True
                self._cv.notify_all()
            self._thread.join(timeout=max(1.0, timeout))
            self._thread = None
            if self._checkpointer is not None:
                self._checkpointer.stop()
                self._checkpointer = None
        else:
            with self._inline_lock:
                with self._cv:
                    self._stopping = True  # lingering ticks go now (a linger would have left them queued forever)
                while (self._ticks or self._ops) and self._trouble_since is None:
                    self._drain_once()
        with self._cv:
            lost = len(self._ticks)
        if lost:
            log.error("%s: %d queued ticks were not written before shutdown", self.path, lost)
        if not self._conn_lost and inproc.unlinked_files(self.path, full=True):
            # the frames in a deleted WAL vanish with the last descriptor: copy them into the file first
            self._checkpoint_into_file()
        try:
            if self.conn is not None:
                self.conn.close()
        except sqlite3.Error:
            pass
        if self._db_fd is not None:
            os.close(self._db_fd)  # last: closing it earlier would drop SQLite's locks on the file
            self._db_fd = None

    def __enter__(self) -> StoreWriter:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ op helpers

    def _run_values(self, fields: dict[str, Any]) -> dict[str, Any]:
        unknown = set(fields) - _RUN_FIELDS
        if unknown:
            raise ValueError(f"unknown run field(s): {', '.join(sorted(unknown))}")
        out = {}
        for k, v in fields.items():
            if k == "flags":  # a secret-looking env value never reaches the file (nor a backup of it)
                v = redact_flags(v)
            elif k == "argv" and v is not None:  # a password in a URL argument (the flags' masking)
                v = redact_argv(v)
            if k in RUN_JSON_COLUMNS and v is not None:
                v = json.dumps(list(v) if isinstance(v, tuple) else v, default=str)
            elif isinstance(v, bool):
                v = int(v)
            out[k] = _storable(v)
        return out

    def _enqueue_op(self, fn: Callable[[sqlite3.Connection], Any], droppable: bool = False,
                    event_row: tuple | None = None) -> _Op:
        op = _Op(fn, droppable=droppable, event_row=event_row)
        with self._cv:
            self._ops.append(op)
            if len(self._ops) > self.ops_max:  # only while writes fail: the thread empties the queue otherwise
                self._drop_oldest_events()
            self._cv.notify()
        return op

    def _drop_oldest_events(self) -> None:
        """The queue of non-tick writes back to `ops_max` by dropping its oldest events (counted, reported by
        `store.writes_resumed`); called holding the condition. The ops ahead of them are few (runs, GPUs)."""
        while len(self._ops) > self.ops_max:
            i = next((i for i, op in enumerate(self._ops) if op.droppable), None)
            if i is None:
                return  # only writes a run's history depends on: kept, whatever their number
            op = self._ops[i]
            del self._ops[i]
            op.future.cancel()
            if self._dropped_events == self._dropped_events_told:
                log.warning("%s: %d writes held while the database refuses them; dropping the oldest events "
                            "from now on (counted in store.writes_resumed)", self.path, self.ops_max)
            self._dropped_events += 1

    def _call(self, fn: Callable[[sqlite3.Connection], Any], timeout: float) -> Any:
        if self._thread is None:  # not started (tests, tools): run inline on the same connection
            with self._inline_lock:
                self._drain_once()
                op = self._enqueue_op(fn)
                self._drain_once()
        else:
            op = self._enqueue_op(fn)
        try:
            return op.future.result(timeout)
        except TimeoutError:
            with self._cv:
                try:
                    self._ops.remove(op)  # withdrawn: it will not be written later behind the caller's back
                    withdrawn = True
                except ValueError:
                    withdrawn = False  # being written right now: its outcome is moments away
            if not withdrawn:
                try:
                    return op.future.result(10)
                except TimeoutError:
                    pass
            raise StoreError(f"{self.path}: the history database did not accept the write within {timeout:g} s "
                             f"({self._last_error or 'writer busy'})") from None

    # ------------------------------------------------------------------------------------------ the thread

    def _start_checkpointer(self) -> None:
        """The checkpoint thread, its rounds on the writer's commits when those come an interval apart."""
        self._checkpointer = Checkpointer(self.path, commit_every_s=self.linger_s)
        self._checkpointer.start()

    def _run(self) -> None:
        while True:
            with self._cv:
                self._wait()
                if self._stopping and not (self._ticks or self._ops):
                    return
            try:
                if time.monotonic() >= self._next_wal_check:
                    self._next_wal_check = time.monotonic() + self.wal_check_interval_s
                    if not self._watch_db():  # a swapped file comes first: its -wal goes with it
                        self._watch_wal()
                self._drain_once()
            except Exception as exc:  # never let the writer thread die
                log.exception("store writer: unexpected error")
                self._note_error(f"unexpected error: {exc!r}")
                time.sleep(self.retry_interval_s)
            if self._trouble_since is not None:
                with self._cv:
                    if not self._stopping:
                        self._cv.wait(self.retry_interval_s)
                    elif self._ticks or self._ops:
                        return  # closing while the disk is still full: give up, close() reports the loss

    def _wait(self) -> None:
        """Sleep until there is work: ops, a flush, closing, ticks due, or maintenance and the file checks.

        Ticks linger: they are written together when the oldest is at most `linger_s` old, so at 10 Hz a
        second of ticks is one transaction (a commit per tick was most of this thread's CPU, issue 29.3). While
        ticks keep coming the thread wakes once per linger by itself (`_due_at` is set a linger ahead after each
        batch) and submit_tick does not wake it; ticks that stop leave one wake-up with nothing to write, and
        the next tick then wakes the thread. Events and other ops, a flush, closing and a full batch do not
        wait. Called holding the condition.
        """
        while not (self._ops or self._stopping):
            now = time.monotonic()
            due = self._due_at
            if self._ticks and (due is None or due <= now or self._flushing):  # None: put back after a failure
                return
            if due is not None and due <= now:
                self._due_at = due = None  # a linger with no tick: the next one starts its own (and wakes us)
            if self._maintenance_more and not self._ticks:
                return
            until = due if due is not None else min(self._next_maintenance, self._next_wal_check)
            if until <= now:
                return
            self._waiting_until = until
            try:
                self._cv.wait(until - now)
            finally:
                self._waiting_until = None

    def _linger_left(self) -> float:
        """Seconds the queued ticks still wait (see _wait); called holding the condition."""
        if not self.linger_s or not self._ticks or self._ops or self._stopping or self._flushing \
                or len(self._ticks) >= self.batch_max_ticks or self._due_at is None:
            return 0.0
        return self._due_at - time.monotonic()

    def _drain_once(self) -> None:
        if self._conn_lost and not self._reconnect():
            if self._unopened is None:  # one never opened says why itself (_retry_open)
                self._keep_waiting(StoreError(f"{self.path}: the history database could not be reopened "
                                              f"({self._last_error})"))
            return
        with self._cv:
            # ticks that came after the thread looked (while it woke for maintenance) keep lingering
            n = min(len(self._ticks), self.batch_max_ticks) if self._linger_left() <= 0 else 0
            ops = list(self._ops)
            self._ops.clear()
            self._writing_ops = ops
            ticks = [self._ticks.popleft() for _ in range(n)]
            if n:  # the next batch: a backlog at once, else a linger from now (None: the next tick sets it)
                self._due_at = 0.0 if self._ticks else (time.monotonic() + self.linger_s if self.linger_s else None)
            self._busy = True
        try:
            ok = self._write_ops(ops)
            if not ok:
                with self._cv:  # ops hit a full disk or a damaged file: the ticks wait with them
                    self._ticks.extendleft(reversed(ticks))
                    self._due_at = 0.0  # and go with the retry, not a linger after it
            else:
                ok = self._write_ticks(ticks)
            if ok and self._trouble_since is not None:
                self._recovered()
            # Ticks first: derived work (rollups, retention) runs when the queue is drained, or every
            # few seconds while a backlog is written, so a catch-up never starves it nor delays samples.
            if ok and (not self._ticks or time.monotonic() - self._last_maintain >= MAINTAIN_EVERY_S):
                self._last_maintain = time.monotonic()
                self._maintain()
        finally:
            with self._cv:
                self._busy = False
                self._writing_ops = []
                self._cv.notify_all()

    def _write_ops(self, ops: list[_Op]) -> bool:
        if not ops:
            return True
        self._id_writes += 1  # rows with ids may change, whatever the outcome (see _take_marks)
        try:
            results = self._transaction(lambda c: [op.fn(c) for op in ops])
        except Exception as exc:  # not only sqlite3.Error: a huge int raises OverflowError in the driver
            if isinstance(exc, sqlite3.Error) and self._transient_or_damaged(exc, ops=ops):
                return False
            return self._write_ops_alone(ops)
        for op, res in zip(ops, results, strict=True):
            op.future.set_result(res)
        return True

    def _write_ops_alone(self, ops: list[_Op]) -> bool:
        """One transaction per op: a bad op fails its own future only; every other op is written.

        Whatever the bad op raises, the ops drained with it (an operator's `agent.stop`, a run's row) must
        not be lost with it. A disk that fails part-way keeps the ops not yet written for the retry.
        """
        for i, op in enumerate(ops):
            try:
                res = self._transaction(op.fn)
            except Exception as one:
                if isinstance(one, sqlite3.Error) and self._transient_or_damaged(one, ops=ops[i:]):
                    return False
                op.future.set_exception(StoreError(f"{self.path}: write refused: {type(one).__name__}: {one}"))
                self._note_error(f"a write was refused and dropped: {type(one).__name__}: {one}")
                continue
            op.future.set_result(res)
        return True

    def _write_ticks(self, ticks: list[_Tick]) -> bool:
        if not ticks:
            return True
        try:
            slow = self._slow.copy()
            rolled = self._transaction(lambda c: self._insert_ticks_marked(c, ticks, slow))
            self._slow = slow
        except Exception as exc:
            if isinstance(exc, sqlite3.Error) and self._transient_or_damaged(exc, ticks=ticks):
                return False
            good, rolled = [], {}
            for t in ticks:  # one bad row must not cost the whole batch
                try:
                    slow = self._slow.copy()
                    one = self._transaction(lambda c, t=t, s=slow: self._insert_ticks_marked(c, [t], s))
                    for kind, rows in one.items():
                        rolled.setdefault(kind, []).extend(rows)
                    good.append(t)
                    self._slow = slow
                except Exception as one:
                    with self._cv:
                        self._failed += 1
                        self._last_rejected = time.monotonic()
                    self._note_error(f"tick at {t.ts_ms} was rejected and dropped: {one}")
            ticks = good
        self._committed(ticks, rolled)
        return True

    def _insert_ticks_marked(self, c: sqlite3.Connection, ticks: list[_Tick],
                             slow: SlowRows) -> dict[str, list[tuple[int, list]]]:
        """_insert_ticks, then (same transaction) the rollup buckets of late rows in rollup_dirty: a crash right
        after the commit must not lose their re-roll (rollup.py). In-order ticks run no extra statement."""
        rolled = self._insert_ticks(c, ticks, slow)
        wm = self.rollups.wm
        for kind, rows in rolled.items():
            if rows:
                mark_late(c, wm, kind, [ts for ts, _ in rows])
        return rolled

    @staticmethod
    def _insert_ticks(c: sqlite3.Connection, ticks: list[_Tick], slow: SlowRows) -> dict[str, list[tuple[int, list]]]:
        """Insert the ticks' rows; returns per rolled kind (ts, its rows as inserted) per tick, for the
        in-memory rollups."""
        gpu, nvl, host, serving, procs = [], [], [], [], []
        per_tick: dict[str, list[tuple[int, list]]] = {"gpu": [], "host": [], "serving": []}
        gn, nn, hn, sn = _KEYED["gpu"], _KEYED["nvlink"], _NAMES["host"], _NAMES["serving"]
        for t in ticks:
            ts = t.ts_ms
            if t.gpu_rows:
                rows = _rows(ts, t.gpu_rows, _GET["gpu"], gn)
                per_tick["gpu"].append((ts, rows))
                gpu += rows
            if t.gpu_rows or t.nvlink_rows or t.process_rows:  # each slow reading stored once
                fresh = slow.fresh(ts, t, procs)
                if fresh:
                    nvl += _rows(ts, fresh, _GET["nvlink"], nn)
            if t.host_row is not None:
                h = [ts, *map(t.host_row.get, hn)]
                h[_PER_CORE] = _jsonable(h[_PER_CORE])
                host.append(h)
                per_tick["host"].append((ts, [h]))
            if t.serving_row is not None:
                s = (ts, *map(t.serving_row.get, sn))
                serving.append(s)
                per_tick["serving"].append((ts, [s]))
        for kind, rows in (("gpu", gpu), ("nvlink", nvl), ("host", host), ("serving", serving), ("processes", procs)):
            if rows:
                _executemany_tick_rows(c, kind, rows)
        return per_tick

    def _transaction(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            out = fn(c)
            c.execute("COMMIT")
        except BaseException:
            rollback(c)
            raise
        return out

    def _committed(self, ticks: list[_Tick], rolled: dict[str, list[tuple[int, list]]]) -> None:
        now = _now_ms(self.clock)
        for kind, rows in rolled.items():
            self.rollups.note_rows(kind, rows)
        if self._checkpointer is not None:
            self._checkpointer.poke()
        with self._cv:
            self._written += len(ticks)
            self._commits += 1
            self._last_commit_ms = now
            if ticks:
                top = max(t.ts_ms for t in ticks)
                self._last_tick_ts = top if self._last_tick_ts is None else max(self._last_tick_ts, top)

    # ------------------------------------------------------------------------------------------ faults

    def _transient_or_damaged(self, exc: sqlite3.Error, ops: list[_Op] | None = None,
                              ticks: list[_Tick] | None = None) -> bool:
        """Handle a failure that is not the data's fault; True when handled (items kept for a retry)."""
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        if code not in _TRANSIENT and code not in _DAMAGED:
            return False
        with self._cv:  # put everything back in front, oldest ticks dropped beyond the bound
            self._ops.extendleft(reversed(ops or []))
            if len(self._ops) > self.ops_max:
                self._drop_oldest_events()
            self._ticks.extendleft(reversed(ticks or []))
            if ticks:
                self._due_at = 0.0  # due: the retry writes them, not a linger after it
            while len(self._ticks) > self.queue_max:
                self._ticks.popleft()
                self._dropped += 1
        if code in _DAMAGED:
            self._recover_damaged(exc)
            return True
        if self._trouble_since is None:
            self._trouble_since = time.monotonic()
            self._dropped_at_trouble = self._dropped
            msg = (f"{self.path}: cannot write history ({exc}); keeping up to {self.queue_max} ticks in memory "
                   f"(oldest dropped beyond that) and retrying every {self.retry_interval_s:g} s")
            self._event(Event(EventKind.STORE_WRITE_FAILED, Severity.ERROR, msg, {"error": str(exc)}))
        self._note_error(str(exc))
        return True

    def _recovered(self) -> None:
        took = time.monotonic() - (self._trouble_since or time.monotonic())
        lost = self._dropped - self._dropped_at_trouble
        with self._cv:
            lost_events = self._dropped_events - self._dropped_events_told
            self._dropped_events_told = self._dropped_events
        self._trouble_since = None
        msg = f"{self.path}: history writes resumed after {took:.0f} s; {lost} ticks were dropped meanwhile"
        if lost_events:
            msg += f", and the oldest {lost_events} events (more than {self.ops_max} writes were held)"
        with self._cv:
            self._last_error = None
        self._event(Event(EventKind.STORE_WRITES_RESUMED, Severity.WARNING if lost or lost_events else Severity.INFO,
                          msg, {"dropped_ticks": lost, "dropped_events": lost_events}))

    def _recover_damaged(self, exc: sqlite3.Error) -> None:
        """The file went bad under us: move it aside and continue on a fresh one (queued data is kept)."""
        try:
            self.conn.close()
        except sqlite3.Error:
            pass
        reason = f"{self.path}: the database became unreadable while writing ({exc})"
        aside = self._move_aside()
        try:
            self.conn = connect_rw(self.path, integrity=False)
        except StoreError as err:
            self._conn_lost = True  # queued data waits; _drain_once retries the open
            self._note_error(f"{reason}; moved it to {aside} but cannot start a fresh one: {err}")
            return
        self.rollups = Rollups(self.conn)
        msg = f"{reason}; moved it to {aside} and started a fresh history database"
        self._note_error(msg)
        self._event(Event(EventKind.STORE_MOVED_ASIDE, Severity.ERROR, msg, {"moved_to": str(aside)}))

    def _keep_waiting(self, exc: Exception) -> None:
        """Enter (or stay in) the retry state without touching the queues (they are kept as they are)."""
        if self._trouble_since is None:
            self._trouble_since = time.monotonic()
            self._dropped_at_trouble = self._dropped
            log.error("%s", exc)
        self._note_error(str(exc))

    def _reconnect(self) -> bool:
        """Open the writer's connection again after a renewal or a move aside that could not reopen it."""
        if self._unopened is not None:
            return self._retry_open()
        if self._db_fd is None:  # the database path was swapped and the file there could not be opened yet
            return self._reopen_swapped()
        try:
            conn = connect_rw(self.path, integrity=False)
        except StoreError as exc:
            self._note_error(f"cannot reopen the history database: {exc}")
            return False
        conn.execute(f"PRAGMA wal_autocheckpoint = {FALLBACK_AUTOCHECKPOINT_PAGES}")
        self.conn = conn
        self.rollups.conn = conn
        self._conn_lost = False
        return True

    # ------------------------------------------------------------------------------------------ the file watch

    def _watch_db(self) -> bool:
        """Notice the database path no longer naming the writer's file (rm, mv) and move to the file there."""
        if self._conn_lost or self._db_fd is None:
            return False
        change = inproc.main_file_change(self.path, self._db_fd)
        if change is None:
            with contextlib.suppress(sqlite3.Error):  # what "since" means if the file is swapped later
                self._take_marks()
            return False
        self._swap(change)
        return True

    def _take_marks(self) -> None:
        """Marks of the newest rows now: the ids read again only when something but ticks was written since.

        Only this writer writes the tables with ids, by ops (events, runs, bench results) and retention; a tick
        batch touches none of them. Reading them took three queries (~0.1 ms, a third of the file checks every
        2 s at 1 Hz, issue 29.3); the ticks' mark is the writer's own newest tick.
        """
        at = (self.conn, self._id_writes)
        if self._last_tick_ts is None or self._marks_at != at:
            self._marks = swap.Marks.take(self.conn, self._last_tick_ts)
            self._marks_at = at
        else:
            self._marks = swap.Marks(self._marks.ids, self._last_tick_ts)

    def _swap(self, change: str) -> None:
        """Carry what was written since the last check into the file the path names now (fresh or restored).

        The old file's WAL frames are checkpointed into it and its -wal emptied before anything opens the path
        again: frames of one database replayed onto another file are what made a restored backup "malformed".
        """
        if self._checkpointer is not None:
            self._checkpointer.stop()
            self._checkpointer = None
        inproc.detach_readers(self.path, DETACH_TIMEOUT_S)  # they reconnect to the path by themselves
        try:
            self._carried = swap.read_since(self.conn, self._marks)
        except sqlite3.Error as exc:
            self._carried = None
            self._note_error(f"cannot read what was written since the database was swapped: {exc}")
        with contextlib.suppress(sqlite3.Error):
            self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        with contextlib.suppress(sqlite3.Error):
            self.conn.close()
        if self._db_fd is not None:
            os.close(self._db_fd)
            self._db_fd = None
        self._conn_lost = True
        carried = self._carried.count() if self._carried is not None else 0
        how, lost = {"replaced": ("was replaced by another file (a backup restored with mv?)", ""),
                     "moved": ("was moved away", "; its history up to then lives on under its new name"),
                     "unlinked": ("was deleted (no name left: nlink 0)", "; its history up to then is gone")}[change]
        reopened = self._reopen_swapped()
        if change == "replaced":
            then = ("the agent closed the old file, checked the new one and writes into it" if reopened
                    else "the new file cannot be opened yet; writes are kept in memory and retried")
        else:
            then = (f"the agent started a fresh database at {self.path}" if reopened
                    else f"a fresh database cannot be created at {self.path} yet; writes are kept in memory and "
                         "retried")
        msg = (f"{self.path} {how} while the agent had it open{lost}; {then}; the {carried} row(s) written since "
               "the agent last saw the file were carried over, nothing from then on is lost")
        with self._cv:
            self._db_swapped, self._db_swapped_ms = msg, _now_ms(self.clock)
        kind = EventKind.STORE_DB_REPLACED if change == "replaced" else EventKind.STORE_DB_UNLINKED
        self._event(Event(kind, Severity.CRITICAL if change == "unlinked" else Severity.WARNING, msg,
                          {"path": str(self.path), "change": change, "carried_rows": carried,
                           "reopened": reopened}))

    def _reopen_swapped(self) -> bool:
        """Open (and lock, and check) the file the path names now, and write the carried rows into it."""
        aside = self.moved_aside
        try:
            self._hold_file()
            conn = self._open(integrity_check=True)  # damaged: moved aside (an event), a fresh one started
            if self.moved_aside is not aside:
                self._hold_file()
        except StoreError as exc:
            if self._db_fd is not None:
                os.close(self._db_fd)
                self._db_fd = None
            self._note_error(f"cannot reopen the history database: {exc}")
            return False
        conn.execute(f"PRAGMA wal_autocheckpoint = {FALLBACK_AUTOCHECKPOINT_PAGES}")
        if self._carried is not None:
            try:
                try:
                    self._mark_carried(conn, self._carried)
                except sqlite3.Error as exc:  # the rows still go over: only their rollups may lag (as before)
                    self._note_error(f"the carried rows' late rollup buckets could not be marked: {exc}")
                swap.write(conn, self._carried)
            except sqlite3.Error as exc:
                self._note_error(f"the rows written since the database was swapped could not be carried over: {exc}")
            self._carried = None
        self.conn = conn
        self.rollups = Rollups(conn)
        with self._cv:
            top = conn.execute("SELECT COALESCE(MAX(id), 0) FROM runs").fetchone()[0] or 0
            self._next_run_id = max(self._next_run_id, top + 1)
        self._conn_lost = False
        self._marks = swap.Marks.take(conn, self._last_tick_ts)
        self._marks_at = (conn, self._id_writes)
        if self._thread is not None and self._checkpointer is None:
            self._start_checkpointer()
        return True

    # ------------------------------------------------------------------------------------------ the WAL watch

    def _watch_wal(self) -> None:
        """Notice a -wal/-shm unlinked under this process and renew every in-process connection."""
        if self._conn_lost:
            return
        at = time.monotonic()
        gone = inproc.unlinked_files(self.path)
        if self._checkpointer is not None:
            self._checkpointer.note_scan(bool(gone), at)  # one scan for both threads
        if not gone:
            return
        first = self._wal_unlinked is None or bool(self._wal_recovered)
        names = ", ".join(gone)
        if first:
            msg = (f"{self.path}: {names} unlinked while the agent had them open (an outside program "
                   "removed them, or opened the live database in a way that dropped the agent's locks); "
                   "commits since then were invisible to other programs and would have been lost at the next "
                   "restart")
            with self._cv:
                self._wal_unlinked, self._wal_unlinked_ms = msg, _now_ms(self.clock)
                self._wal_recovered = False
        with inproc.renewal_lock(self.path):
            recovered, how = self._renew(gone)
        with self._cv:
            self._wal_recovered = recovered
            base = (self._wal_unlinked or "").split("; recovery: ")[0]
            self._wal_unlinked = f"{base}; recovery: {how}"
            msg = self._wal_unlinked
        details = {"path": str(self.path), "unlinked": gone, "recovered": recovered}
        if first:  # one critical event per episode, written after the renewal so it lands in the live file
            self._event(Event(EventKind.STORE_WAL_UNLINKED, Severity.CRITICAL, msg, details))
        elif recovered:
            self._event(Event(EventKind.STORE_WAL_RECOVERED, Severity.WARNING, msg, details))
        else:  # a renewal that failed again: no event (one per episode), but the log says so
            log.error("%s: %s", self.path, how)

    def _checkpoint_into_file(self) -> bool:
        """Copy every frame of the writer's WAL into the main file; True when all of them went in."""
        try:
            busy, frames, done = self.conn.execute("PRAGMA wal_checkpoint(FULL)").fetchone()
        except sqlite3.Error as exc:
            self._note_error(f"checkpoint of an unlinked WAL failed: {exc}")
            return False
        return busy == 0 and frames == done

    def _renew(self, gone: list[str]) -> tuple[bool, str]:
        """Save the deleted WAL's frames into the file, then reconnect everything in this process.

        Order matters: the checkpointer and in-process readers let go first (SQLite shares one -shm mapping
        per process, so a new connection would attach to the deleted one while any old one is open); the
        writer's connection is closed only after a complete checkpoint (closing it with frames left in a
        deleted WAL would lose them).
        """
        if self._checkpointer is not None:
            self._checkpointer.stop()
            self._checkpointer = None
        detached, attached = inproc.detach_readers(self.path, DETACH_TIMEOUT_S)
        try:
            if not self._checkpoint_into_file():
                return False, "the checkpoint into the main file did not complete; retrying"
            if attached:
                return False, (f"saved the WAL's frames into the main file; {attached} reader(s) of this "
                               "process are still busy, reconnecting later")
            try:
                self.conn.close()
            except sqlite3.Error:
                pass
            self._conn_lost = True
            if not self._reconnect():
                return False, "saved the WAL's frames into the main file, but cannot reopen it; retrying"
        finally:
            if self._thread is not None and self._checkpointer is None and not self._conn_lost:
                self._start_checkpointer()
        left = inproc.unlinked_files(self.path, full=True)
        if left:
            return False, f"reconnected, but {', '.join(left)} still open deleted in this process; retrying"
        return True, (f"recovered: the WAL's frames were copied into the main file and the agent reconnected "
                      f"to the files on disk ({detached} reader(s) reconnected); no tick was lost")

    @staticmethod
    def _mark_carried(conn: sqlite3.Connection, carried: swap.Carried) -> None:
        """Mark the rollup buckets that carried samples reach below the new file's watermarks (rows it rolled
        up already), in a transaction of its own before swap.write: a crash between the two leaves a mark
        whose re-roll changes nothing, never rows without their mark. Nothing is written when none is late."""
        wm = load_watermarks(conn)
        todo = []
        for kind in ROLLUP_KINDS:
            cols, rows = carried.tables.get(SAMPLE_TABLES[kind].name, ([], []))
            if rows:
                at = cols.index("ts_ms")
                todo.append((kind, [r[at] for r in rows]))
        if not any(late_buckets(wm, kind, ts) for kind, ts in todo):
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            for kind, ts in todo:
                mark_late(conn, wm, kind, ts)
            conn.execute("COMMIT")
        except BaseException:
            rollback(conn)
            raise

    def _note_error(self, msg: str) -> None:
        with self._cv:
            self._last_error = msg
            self._last_error_ms = _now_ms(self.clock)

    # ------------------------------------------------------------------------------------------ maintenance

    def _maintain(self) -> None:
        """Bounded rollup and retention work between batches; failures are reported, data is kept."""
        try:
            more = False
            if self.rollups.pending():
                # late buckets whose rows retention deletes are dropped, not re-rolled (rollup.Rollups.step)
                expired = (retention_mod.cutoffs(self.retention, retention_mod.reference_ms(
                    self.conn, _now_ms(self.clock)), self.rollups.wm) if self.rollups.has_dirty() else None)
                more = self.rollups.step(expired)
            now = time.monotonic()
            if self._maintenance_more or now >= self._next_maintenance:
                self._id_writes += 1  # retention deletes events and runs (see _take_marks)
                _, rmore = retention_mod.step(self.conn, self.retention, _now_ms(self.clock), self.rollups.wm,
                                              self.retention_chunk)
                # closed intervals into chunks (issue 29.1), the newest sample capped at now as retention does
                _, cmore = compact.step(self.conn, self.rollups.wm, now_ms=_now_ms(self.clock))
                more = more or rmore or cmore
                self._next_maintenance = now + self.maintenance_interval_s
            self._maintenance_more = more
        except sqlite3.Error as exc:
            self._maintenance_more = False
            self._next_maintenance = time.monotonic() + self.retry_interval_s
            self._note_error(f"rollup/retention failed (will retry): {exc}")
