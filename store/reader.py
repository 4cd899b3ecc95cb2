"""Read-only access to the history database for the dashboard, `lynxtop runs` and export.

Readers open the file with `mode=ro`, so they can never take the write lock; in WAL mode they never block
the writer. Every query here fetches its (bounded) result at once so no read transaction stays open and
starves checkpoints: the connection is in autocommit mode, and the queries that must see raw rows and compacted
chunks as one state run in one short explicit transaction (`snapshot()`). Export reads in pages, each in its own
snapshot (store/export.py); only `stream()` keeps a cursor, and its caller drains it at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from lynxtop.contract.columns import lowest_bucket_column
from lynxtop.contract.events import Event, canonical_kind, stored_kinds
from lynxtop.contract.records import RecordError, RunInfo
from lynxtop.contract.redact import redact_flags
from lynxtop.store import compact, gpu_identity, inproc
from lynxtop.store.errors import NotOurDatabase, StoreAccessError, StoreError
from lynxtop.store.rollup import aggregate_sql, merge_rows
from lynxtop.store.schema import (
    BUSY_TIMEOUT_MS,
    COMPACTED,
    GPU_FACT_COLUMNS,
    NO_PROCESS_PID,
    RESOLUTIONS,
    RUN_JSON_COLUMNS,
    SAMPLE_TABLES,
    access_problem,
    check_identity,
    chunk_table,
    open_error,
    rollup_metrics,
    rollup_table,
    schema_version,
    sidecar_problem,
    tune,
)

SERIES_TABLES = ("gpu", "host", "serving")
LATEST_TABLES = ("gpu", "nvlink", "host", "serving", "processes")
SLOW_TABLES = ("nvlink", "processes")  # readings stored once, when read (store/writer.py SlowRows)
RAW_SUMMARY_MAX_MS = 6 * 3_600_000  # longer runs are summarised from 1-minute rollups
# A one-shot read (_raw_q: a summary, a raw series) keeps the chunk rows it decoded for the next read only up to
# this many: a chart's window or a page's interval is reused, a 6-hour summary's ~200,000 rows are not kept in a
# long-lived process (the agent) until some later read happens to replace them.
DECODED_KEEP_ROWS = 20_000


class NoHistory(StoreError):
    """The file holds no history at all: the agent has created it but not its tables yet (not damage)."""


def _table_name(table: str) -> str:
    """The SQL table behind a reader's table name ("processes" is stored as gpu_processes)."""
    return "gpu_processes" if table == "processes" else SAMPLE_TABLES[table].name


@dataclass(frozen=True)
class _SeriesQuery:
    """One series request, as the raw, rollup and tail queries share it."""

    table: str
    cols: list[str]
    gpu: int | None  # a per-GPU table's one GPU; None: all of them

    @property
    def per_gpu(self) -> bool:
        return SAMPLE_TABLES[self.table].per_gpu

    @property
    def key(self) -> str:
        return "ts_ms, gpu" if self.per_gpu else "ts_ms"

    @property
    def gpu_sql(self) -> str:
        return "" if self.gpu is None else " AND gpu = ?"

    @property
    def gpu_param(self) -> tuple:
        return () if self.gpu is None else (self.gpu,)


def _like_literal(text: str) -> str:
    """`text` for a LIKE pattern with ESCAPE '\\': its %, _ and \\ matched as themselves."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _dicts(cur: sqlite3.Cursor) -> list[dict[str, Any]]:
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]  # noqa: B905 (same length by construction)


def _decode_run(row: dict[str, Any]) -> dict[str, Any]:
    for k in RUN_JSON_COLUMNS:
        if isinstance(row.get(k), str):
            try:
                row[k] = json.loads(row[k])
            except ValueError:
                pass
    if row.get("simulated") is not None:
        row["simulated"] = bool(row["simulated"])
    if "flags" in row:  # a row written before secret env values were masked is served masked
        row["flags"] = redact_flags(row["flags"])
    return row


def _no_readings(rows: list[dict[str, Any]], cols: list[str], have: list[str]) -> list[dict[str, Any]]:
    """Aggregated rows given the stats of the metrics of `cols` not in `have` (columns the file lacks): none."""
    if len(have) < len(cols):
        for c in cols:
            if c not in have:
                for r in rows:
                    r.update({f"{c}_min": None, f"{c}_avg": None, f"{c}_max": None, f"{c}_n": 0})
    return rows


# A run's serving summary: (output name, column, how) in output order; "avg" ignores NULL readings, "sum" is
# NULL when every reading is, "max" the largest reading. store/reader.py _serving_summary computes them.
SERVING_SUMMARY: tuple[tuple[str, str, str], ...] = (
    ("requests_per_s", "requests_per_s", "avg"), ("prompt_tokens_per_s", "prompt_tokens_per_s", "avg"),
    ("generation_tokens_per_s", "generation_tokens_per_s", "avg"), ("requests_finished", "requests_finished", "sum"),
    ("prompt_tokens", "prompt_tokens", "sum"), ("generation_tokens", "generation_tokens", "sum"),
    ("ttft_p50_ms", "ttft_p50_ms", "avg"), ("ttft_p99_ms", "ttft_p99_ms", "avg"),
    ("ttft_p99_max_ms", "ttft_p99_ms", "max"), ("tpot_p50_ms", "tpot_p50_ms", "avg"),
    ("tpot_p99_ms", "tpot_p99_ms", "avg"), ("tpot_p99_max_ms", "tpot_p99_ms", "max"),
    ("itl_p99_ms", "itl_p99_ms", "avg"), ("e2e_p99_ms", "e2e_p99_ms", "avg"),
    ("kv_cache_usage_max_pct", "kv_cache_usage_pct", "max"), ("preemptions", "preemptions", "sum"),
) + tuple(
    # The bound of the lowest histogram bucket of each series summarised above: a percentile at or below it is
    # known only to be below it (contract/quantile.py), so Compare shows "<10.0 ms", as the Serving panel does, not
    # the figure interpolated from 0. vLLM's buckets are fixed per process (one run); ticks without percentiles
    # store NULL. Should it differ between ticks, the largest is the one that holds for all: every tick's figure in
    # its lowest bucket is at most its own bound, so at most the largest (the smallest would pass a figure made up
    # under a larger bound as measured). The 1-minute rollups keep each minute's max, so both paths agree.
    (lowest_bucket_column(series), lowest_bucket_column(series), "max") for series in ("ttft", "tpot", "itl", "e2e")
)
_SUMMARY_SOURCES = tuple(dict.fromkeys((c, op) for _, c, op in SERVING_SUMMARY))  # each aggregate read once


def _summary_of(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """SERVING_SUMMARY from partial aggregates of disjoint row sets (raw rows, 1-minute rollups): averages
    weighted by their readings, sums and maxima of the parts' that have readings (NULL when none has)."""
    out: dict[str, Any] = {"samples": int(sum(p["samples"] or 0 for p in parts))}
    for name, c, op in SERVING_SUMMARY:
        if op == "avg":
            n = sum(p[f"{c}_n"] or 0 for p in parts)
            out[name] = sum(p[f"{c}_t"] or 0.0 for p in parts) / n if n else None
            continue
        vals = [p[f"{c}_{op}"] for p in parts if p[f"{c}_{op}"] is not None]
        out[name] = (sum(vals) if op == "sum" else max(vals)) if vals else None
    return out


def usual_load_ms(reader: Any, profile: str, exclude_run: int | None = None, last: int = 3) -> int | None:
    """How long `profile` usually takes to load: the median `ready_ms - started_ms` of its last `last` loads that
    became ready (one: that one), other than `exclude_run` (the load under way); None when it has none. `reader`:
    anything with `runs(limit, text)` (a StoreReader, the dashboard's reader of another node's history), so the
    question costs one query of the runs table, never a scan of samples."""
    took: list[int] = []
    for run in reader.runs(limit=50, text=profile):
        if run.profile != profile or run.id == exclude_run or run.ready_ms is None or run.started_ms is None:
            continue
        if run.ready_ms > run.started_ms:  # a clock stepped between the two reads as no load time
            took.append(run.ready_ms - run.started_ms)
        if len(took) >= last:
            break
    if not took:
        return None
    took.sort()
    mid = len(took) // 2
    return took[mid] if len(took) % 2 else (took[mid - 1] + took[mid]) // 2


class StoreReader:
    """See docs/contracts.md. Raises StoreError (message names the path) when the file is absent or bad."""

    def __init__(self, path: str | os.PathLike, sample_interval_s: float = 1.0):
        self.path = Path(path)
        self.sample_interval_ms = max(1, int(sample_interval_s * 1000))
        if not self.path.exists():
            raise StoreError(f"{self.path}: no history database here (the agent creates it when it starts; "
                             "check --database or [agent] database)")
        self._lock = threading.RLock()  # held while the connection is in use; detach() waits for it
        self.note: str | None = None  # how the file had to be opened, for the user (read-only directory)
        self._cols: dict[str, frozenset[str]] = {}  # each table's columns in this file, as last read (columns())
        self._decoded: dict[str, tuple] = {}  # what each temp table of decoded chunks holds (with_chunks)
        self._decoded_rows: dict[str, int] = {}  # and how many rows
        self._conn: sqlite3.Connection | None = self._connect()
        inproc.register(self.path, self)

    def _connect(self) -> sqlite3.Connection:
        self._cols = {}  # a new connection may see another file (a swapped database)
        self._decoded = {}  # and has no temp tables yet
        self._decoded_rows = {}
        problem = sidecar_problem(self.path)
        if problem:
            raise StoreError(f"{self.path}: cannot open the history database: {problem}")
        try:
            return self._open_uri("mode=ro")
        except StoreAccessError as exc:
            refused = exc
        # A clean database (no -wal with content) in a directory this process may not write: `mode=ro` still
        # needs to create the -wal and -shm of a WAL database, and fails. Nothing can be writing it (a writer
        # keeps a -wal while open), so it is read as an immutable file, and the caller says so (self.note).
        wal = Path(f"{self.path}-wal")
        if wal.exists() and wal.stat().st_size > 0:
            raise refused
        try:
            conn = self._open_uri("mode=ro&immutable=1")
        except StoreError:
            raise refused from None
        why = access_problem(self.path) or "SQLite cannot create its -wal and -shm beside it"
        self.note = (f"{self.path}: opened read-only as an immutable file ({why}); "
                     "what a writer adds from now on is not seen")
        return conn

    def _open_uri(self, params: str) -> sqlite3.Connection:
        # Through SQLite only: a plain open()+close() of the file here would drop the POSIX locks of every
        # connection in this process, the agent's writer included (SQLite's "How To Corrupt", 2.2).
        try:
            # Autocommit: the driver's implicit BEGIN before the temp table's writes (with_chunks) left a read
            # transaction open after the query, so the reader kept that snapshot (saw no newer rows, held back
            # every checkpoint) for as long as it stayed open; transactions here are explicit (snapshot()).
            conn = sqlite3.connect(f"file:{quote(str(self.path.resolve()))}?{params}", uri=True,
                                   check_same_thread=False, isolation_level=None)
        except sqlite3.Error as exc:
            raise open_error(exc, self.path) from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            check_identity(conn, self.path, integrity=False, reader=True)
            tune(conn, mmap=True)
            # the decoded chunks' temp tables live in memory: without this a table emptied keeps its pages (the
            # largest read's size) for the life of the connection; with it, emptying gives them back
            conn.execute("PRAGMA temp.auto_vacuum = FULL")
        except sqlite3.Error as exc:
            conn.close()
            raise open_error(exc, self.path, "read") from None
        except BaseException:
            conn.close()
            raise
        return conn

    @property
    def conn(self) -> sqlite3.Connection:
        """The connection, reopened if the writer detached it (see store/inproc.py)."""
        with self._lock:
            if self._conn is None:
                with inproc.renewal_lock(self.path):
                    self._conn = self._connect()
            return self._conn

    def detach(self, timeout: float) -> bool:
        """Close the connection so the writer can renew the process's view of the files; the next query
        reconnects. False if a query held the connection for longer than `timeout`."""
        if not self._lock.acquire(timeout=timeout):
            return False
        try:
            if self._conn is not None:
                try:
                    self._conn.close()
                except sqlite3.Error:
                    pass
                self._conn = None
            return True
        finally:
            self._lock.release()

    def close(self) -> None:
        inproc.unregister(self.path, self)
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """One short read transaction, under the reader's lock: what runs inside sees one state of the file (raw
        rows and the chunks they were compacted into alike), and the snapshot ends with the block, so nothing
        holds back the writer's checkpoints between queries. Inside another snapshot: part of that one."""
        with self._lock:
            conn = self.conn
            if conn.in_transaction:
                yield conn
                return
            conn.execute("BEGIN")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                self._decoded = {}  # the temp tables' rows are rolled back with the rest
                self._decoded_rows = {}
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ helpers

    def _q(self, sql: str, params: tuple | list = ()) -> list[dict[str, Any]]:
        try:
            with self._lock:
                return _dicts(self.conn.execute(sql, params))
        except sqlite3.DatabaseError as exc:
            if "no such table" in str(exc) and schema_version(self.conn, self.path) == 0:
                return []  # the agent has created the file but not the tables yet
            raise NotOurDatabase(f"{self.path}: cannot read the history database: {exc}") from None

    def columns(self, table: str, wanted: Iterable[str] = ()) -> frozenset[str]:
        """The columns SQL table `table` has in this file; empty when the file has no such table (yet).

        A file written before a metric was added lacks its column until a writer opens it (readers open
        read-only and never add it), so queries select NULL for what this does not list. Cached per connection
        and read again (one PRAGMA) only when one of `wanted` is missing: a writer may have added it since.
        """
        have = self._cols.get(table)
        if have is not None and have.issuperset(wanted):
            return have
        try:
            with self._lock:
                have = frozenset(r[1] for r in self.conn.execute(f"PRAGMA main.table_info({table})"))
        except sqlite3.DatabaseError:
            return frozenset()  # not readable: the query itself then says why
        if have:
            self._cols[table] = have
        return have

    def _select(self, table: str, cols: list[str]) -> str:
        """`cols` for a SELECT list from SQL table `table`: NULL AS c for a column this file lacks."""
        have = self.columns(table, cols)
        if not have:  # no such table (a file the agent has not set up yet): the query says so
            return ", ".join(cols)
        return ", ".join(c if c in have else f"NULL AS {c}" for c in cols)

    def with_chunks(self, sql: str, table: str, start_ms: int, end_ms: int, gpu: int | None = None) -> str:
        """`sql` reading `table` as its raw rows plus the compacted chunks overlapping [start_ms, end_ms).

        Only those chunks are decoded, into a TEMP table of the same columns (a read-only connection may
        write its own temp schema); `FROM table ` becomes a UNION ALL of both. A decoded row whose key a raw row
        also has (a clock stepped back, before the next compaction pass merged it) is left out: the raw row
        wins, as in compaction's merge and the rollups' re-roll, so every key is read once. The columns are the
        file's own: `sql` selects NULL for any it lacks (columns()). Without such chunks, `sql` is returned
        unchanged. Call it, and run the SQL, inside one snapshot(): chunks and raw rows of one state.

        The temp table is kept while the same chunks (compared by a digest of their blobs) and the same raw keys
        over them are asked for again: consecutive export pages inside one ten-minute interval (10 Hz: 48,000
        rows of 8 GPUs) decode it once, not once a page.
        """
        source = self.chunk_source(table, start_ms, end_ms, gpu)
        return sql if source == table else sql.replace(f"FROM {table} ", f"FROM {source} ")

    def chunk_source(self, table: str, start_ms: int, end_ms: int, gpu: int | None = None) -> str:
        """What with_chunks() puts after FROM: `table` itself when no chunk overlaps [start_ms, end_ms), else the
        UNION ALL of its raw rows and the decoded chunks (loaded into the temp table now, or kept from before)."""
        if table not in COMPACTED:
            return table
        with self._lock:
            conn = self.conn
            heads = self._chunk_heads(conn, table, start_ms, end_ms, gpu)
            if not heads:
                return table
            cols = compact.columns(conn, table)
            raw = self._raw_keys(conn, table, min(h[0] for h in heads), max(h[2] for h in heads), gpu)
            state = (tuple(cols), gpu, tuple((s, g, e, hashlib.blake2b(d, digest_size=16).digest())
                                             for s, g, e, d in heads), raw)
            dec = f"_dec_{table}"
            if self._decoded.get(table) != state:
                self._load_decoded(conn, table, dec, cols, [d for *_, d in heads], raw)
                self._decoded[table] = state
        return f"(SELECT * FROM main.{table} UNION ALL SELECT * FROM temp.{dec}) AS {table}"

    @staticmethod
    def _chunk_heads(conn: sqlite3.Connection, table: str, start_ms: int, end_ms: int,
                     gpu: int | None) -> list[tuple[int, int, int, bytes]]:
        """(start_ms, gpu, end_ms, data) of the chunks overlapping [start_ms, end_ms), in compact.chunk_blobs' order;
        none in a file of schema 2 (no chunk tables: opened read-only before the writer migrated it)."""
        sql = (f"SELECT start_ms, gpu, end_ms, data FROM {chunk_table(table)} WHERE start_ms > ? AND start_ms < ? "
               "AND end_ms > ?" + ("" if gpu is None else " AND gpu = ?") + " ORDER BY start_ms, gpu")
        try:
            return conn.execute(sql, (start_ms - compact.CHUNK_MS, end_ms, start_ms,
                                      *(() if gpu is None else (gpu,)))).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []
            raise

    @staticmethod
    def _raw_keys(conn: sqlite3.Connection, table: str, lo: int, hi: int, gpu: int | None) -> frozenset[tuple]:
        """The keys of the raw rows in [lo, hi): one index range probe over the decoded span; raw rows there are
        rare (compaction deleted the ones it moved), so it normally finds none."""
        key = COMPACTED[table]
        gpu_sql, gpu_arg = ("", ()) if gpu is None or "gpu" not in key else (" AND gpu = ?", (gpu,))
        return frozenset(tuple(k) for k in conn.execute(f"SELECT {', '.join(key)} FROM main.{table} "
                                                        f"WHERE ts_ms >= ? AND ts_ms < ?{gpu_sql}", (lo, hi, *gpu_arg)))

    def _load_decoded(self, conn: sqlite3.Connection, table: str, dec: str, cols: list[str], blobs: list[bytes],
                      raw: frozenset[tuple]) -> None:
        """Fill temp table `dec` with the rows of `blobs`, less those whose key a raw row has (the raw row wins: a
        clock stepped back wrote it after its interval was compacted; the next pass merges it so, compact.merge).
        Indexed by the key, so a page of an export reads its slice in order instead of sorting the whole table."""
        conn.execute(f"CREATE TEMP TABLE IF NOT EXISTS {dec} AS SELECT * FROM main.{table} WHERE 0")
        if compact.columns(conn, dec, "temp") != cols:  # a column was added since (a newer writer migrated the file)
            conn.execute(f"DROP TABLE temp.{dec}")
            conn.execute(f"CREATE TEMP TABLE {dec} AS SELECT * FROM main.{table} WHERE 0")
        conn.execute(f"CREATE INDEX IF NOT EXISTS temp.{dec}_key ON {dec} ({', '.join(COMPACTED[table])})")
        conn.execute(f"DELETE FROM temp.{dec}")
        self._decoded.pop(table, None)  # until it is filled
        self._decoded_rows.pop(table, None)
        rows: list[tuple] = []
        try:
            for blob in blobs:
                rows += compact.decode_blob(blob, cols)
        except compact.codec.CodecError as exc:  # a newer lynxtop's format, or damage: say which
            raise StoreError(f"{self.path}: a compacted chunk of {table} cannot be read: {exc}") from None
        if raw:
            idx = [cols.index(k) for k in COMPACTED[table]]
            rows = [r for r in rows if tuple(r[i] for i in idx) not in raw]
        conn.executemany(f"INSERT INTO temp.{dec} VALUES ({', '.join('?' * len(cols))})", rows)
        self._decoded_rows[table] = len(rows)

    def chunk_window(self, table: str, lo: int, stop: int, rows: int) -> int:
        """Where a page of `table` read from `lo` should end so that it decodes about `rows` compacted rows: the end
        of the first ten-minute intervals from `lo` whose chunks hold that many, or `stop` when fewer are left."""
        if table not in COMPACTED:
            return stop
        try:
            with self._lock:
                groups = self.conn.execute(
                    f"SELECT start_ms, sum(rows) FROM {chunk_table(table)} WHERE start_ms > ? AND start_ms < ? "
                    "AND end_ms > ? GROUP BY start_ms ORDER BY start_ms LIMIT 64",
                    (lo - compact.CHUNK_MS, stop, lo)).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return stop
            raise
        total = 0
        for start, n in groups:
            total += n
            if total >= rows:
                return min(stop, start + compact.CHUNK_MS)
        return stop if len(groups) < 64 else min(stop, groups[-1][0] + compact.CHUNK_MS)

    def chunk_rows(self, table: str, start_ms: int, end_ms: int) -> int:
        """How many rows the compacted chunks of `table` add to its raw rows in [start_ms, end_ms), each key once
        (an export's total, without decoding every chunk): a chunk inside the range with no raw row over its span
        counts its `rows`; the chunks at the range's edges, and any with a late raw row, are decoded and counted."""
        if table not in COMPACTED:
            return 0
        key = COMPACTED[table]
        per_gpu = "gpu" in key
        with self.snapshot() as conn:
            try:
                heads = conn.execute(f"SELECT id, start_ms, gpu, end_ms, rows FROM {chunk_table(table)} "
                                     "WHERE start_ms > ? AND start_ms < ? AND end_ms > ?",
                                     (start_ms - compact.CHUNK_MS, end_ms, start_ms)).fetchall()
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    return 0
                raise
            cols = compact.columns(conn, table) if heads else []
            total = 0
            for cid, s, g, e, n in heads:
                raw = self._raw_keys(conn, table, s, e, g if per_gpu else None)
                if start_ms <= s and e <= end_ms and not raw:
                    total += n
                    continue
                blob = conn.execute(f"SELECT data FROM {chunk_table(table)} WHERE id = ?", (cid,)).fetchone()[0]
                try:
                    decoded = compact.decode_blob(blob, cols)
                except compact.codec.CodecError as exc:
                    raise StoreError(f"{self.path}: a compacted chunk of {table} cannot be read: {exc}") from None
                ts, idx = cols.index("ts_ms"), [cols.index(k) for k in key]
                total += sum(1 for r in decoded
                             if start_ms <= r[ts] < end_ms and tuple(r[i] for i in idx) not in raw)
            return total

    def _raw_q(self, sql: str, params: tuple | list, table: str, start_ms: int, end_ms: int,
               gpu: int | None = None) -> list[dict[str, Any]]:
        """_q over raw rows and compacted chunks alike (one reader for both forms)."""
        try:
            with self.snapshot() as conn:
                rows = self._q(self.with_chunks(sql, table, start_ms, end_ms, gpu), params)
                if self._decoded_rows.get(table, 0) > DECODED_KEEP_ROWS:  # too large to keep (see there)
                    self._decoded.pop(table, None)
                    self._decoded_rows.pop(table, None)
                    conn.execute(f"DELETE FROM temp._dec_{table}")
                return rows
        except sqlite3.DatabaseError as exc:
            raise NotOurDatabase(f"{self.path}: cannot read the history database: {exc}") from None

    def _watermark(self, kind: str, res: str) -> int | None:
        rows = self._q("SELECT value FROM meta WHERE key = ?", (f"rollup_wm_{kind}_{res}",))
        return int(rows[0]["value"]) if rows else None

    # ------------------------------------------------------------------------------------------ runs

    def runs(self, limit: int = 50, text: str | None = None) -> list[RunInfo]:
        """Newest first. `text`: the runs whose "id profile end" holds it, in SQL before the limit (the History
        view filtered the newest 200 and missed older runs, s21). `end` is what the view's end column shows: the
        end reason, else "running" or "ended"; ASCII letters match in any case (SQLite's LIKE), % and _ as
        themselves."""
        where, params = "", []
        if text:
            where = ("WHERE (CAST(id AS TEXT) || ' ' || COALESCE(profile, '') || ' ' || COALESCE(NULLIF(end_reason, "
                     "''), CASE WHEN COALESCE(ended_ms, 0) = 0 THEN 'running' ELSE 'ended' END)) LIKE ? ESCAPE '\\' ")
            params.append(f"%{_like_literal(text)}%")
        return [self._record(RunInfo, "runs", _decode_run(r))
                for r in self._q(f"SELECT * FROM runs {where}ORDER BY id DESC LIMIT ?", (*params, int(limit)))]

    def run(self, run_id: int, summary: bool = True) -> RunInfo | None:
        """A run with `summary`: duration, load time, throughput, latency, and per-GPU activity."""
        rows = self._q("SELECT * FROM runs WHERE id = ?", (int(run_id),))
        if not rows:
            return None
        run = _decode_run(rows[0])
        if not summary:
            return self._record(RunInfo, "runs", run)
        start = run.get("started_ms")
        end = run.get("ended_ms") or int(time.time() * 1000)
        summary: dict[str, Any] = {
            "duration_s": (end - start) / 1000 if start is not None else None,
            "load_s": (run["ready_ms"] - start) / 1000 if start is not None and run.get("ready_ms") else None,
            "ended": run.get("ended_ms") is not None,
        }
        summary["serving"] = self._serving_summary(int(run_id), start, end)
        summary["gpus"] = self._gpu_summary(start, end) if start is not None else []
        run["summary"] = summary
        return self._record(RunInfo, "runs", run)

    def _rolled_minutes(self, table: str, start: int, end: int) -> tuple[int, int]:
        """(first, split) of a run's summary over [start, end): [first, split) are whole minutes read from the
        table's 1-minute rollups (a run longer than RAW_SUMMARY_MAX_MS, up to their watermark and its last whole
        minute), the rest raw; split == first: all raw (a short run, or no rollups yet)."""
        minute = RESOLUTIONS["1m"]
        first = -(-start // minute) * minute  # the run's first whole minute
        wm = self._watermark(table, "1m") if end - start > RAW_SUMMARY_MAX_MS else None
        if wm is None:
            return first, first
        return first, max(first, min(wm - wm % minute, end - end % minute))  # whole minutes, before its end

    def _serving_summary(self, run_id: int, start: int | None, end: int) -> dict[str, Any]:
        """The run's serving rows summarised (SERVING_SUMMARY). A run longer than RAW_SUMMARY_MAX_MS reads its
        whole minutes up to the serving rollups' watermark from serving_1m (60x fewer rows, nothing decoded: a day
        at 1 Hz is 86,400 raw rows, ~6 s and ~60 MB of decoded chunks), and only the partial minute at its start and
        the rows past the watermark (or its last minute) raw. Serving rows carry no run id in their rollups, but
        one run serves at a time and a serving row is written only for the run being served, so the minutes wholly
        inside the run's span hold its rows only; the raw parts keep the run_id filter (rows at the edges)."""
        lo = start if start is not None else 0
        first, split = self._rolled_minutes("serving", lo, end)
        raw_have = self.columns("serving_samples")
        raw_cols = ", ".join(
            (f"0.0 AS {c}_t, 0 AS {c}_n" if op == "avg" else f"NULL AS {c}_{op}")
            if raw_have and c not in raw_have  # a file older than the metric (the bounds came in s17): none
            else f"total({c}) AS {c}_t, count({c}) AS {c}_n" if op == "avg" else f"{op}({c}) AS {c}_{op}"
            for c, op in _SUMMARY_SOURCES)
        raw = f"SELECT count(*) AS samples, {raw_cols} FROM serving_samples WHERE run_id = ?"
        if split <= first:  # short run, or no rollups yet: all raw, as before
            return _summary_of([self._raw_q(raw, (run_id,), "serving_samples", lo, end + 1)[0]])
        parts = []
        if first > lo:  # the partial minute the run starts in (and rows of it stamped before its start)
            parts.append(self._raw_q(raw + " AND ts_ms < ?", (run_id, first), "serving_samples", lo, first)[0])
        have = self.columns("serving_1m")
        roll = []
        for c, op in _SUMMARY_SOURCES:
            if have and not {f"{c}_avg", f"{c}_n", f"{c}_max"} <= have:  # a file older than the metric
                roll.append(f"0.0 AS {c}_t, 0 AS {c}_n" if op == "avg" else f"NULL AS {c}_{op}")
            elif op == "avg":  # weighted by the minutes' readings
                roll.append(f"total({c}_avg * {c}_n) AS {c}_t, total({c}_n) AS {c}_n")
            elif op == "sum":  # a minute's sum of integer readings is its average times their count, rounded
                roll.append(f"sum(CAST(round({c}_avg * {c}_n) AS INTEGER)) AS {c}_sum")
            else:
                roll.append(f"max({c}_max) AS {c}_max")
        parts += self._q(f"SELECT total(samples) AS samples, {', '.join(roll)} FROM serving_1m "
                         "WHERE ts_ms >= ? AND ts_ms < ?", (first, split))
        parts.append(self._raw_q(raw + " AND ts_ms >= ?", (run_id, split), "serving_samples", split, end + 1)[0])
        return _summary_of(parts)

    def _record(self, cls: Any, table: str, row: dict[str, Any]) -> Any:
        """`cls.from_json(row)`; a row that is not a valid record (a newer agent's kind) is a StoreError naming it."""
        try:
            return cls.from_json(row)
        except RecordError as exc:
            raise StoreError(f"{self.path}: {table} row {row.get('id')} cannot be read by this lynxtop: {exc}") \
                from None

    # A run's per-GPU summary: (output name, column, how) in output order; "avg" ignores NULL readings, "max" is the
    # largest reading, "span" the counter's largest less its smallest reading (energy used over the run).
    GPU_SUMMARY: tuple[tuple[str, str, str], ...] = (
        ("util_gpu_pct", "util_gpu_pct", "avg"), ("sm_active_pct", "sm_active_pct", "avg"),
        ("power_w", "power_w", "avg"), ("mem_used_max_bytes", "mem_used_bytes", "max"),
        ("temp_max_c", "temp_c", "max"), ("energy_j", "energy_j", "span"),
    )

    def _gpu_summary(self, start: int, end: int) -> list[dict[str, Any]]:
        """Per GPU over [start, end). GPU rows carry no run id: the summary is every GPU row in the span. A run
        longer than RAW_SUMMARY_MAX_MS reads its whole minutes up to the GPU rollups' watermark from gpu_1m, and
        raw only the partial minute it starts in and the rows past the watermark or its last whole minute (as
        _serving_summary): a rollup minute is counted only when it lies wholly inside the span, so another run's
        rows sharing the run's first or last minute are never counted, and the result equals the raw one."""
        first, split = self._rolled_minutes("gpu", start, end)
        raw_have = self.columns("gpu_samples")
        raw_cols = ["gpu", "count(*) AS samples"]
        for _, c, op in self.GPU_SUMMARY:
            if raw_have and c not in raw_have:  # a file older than the metric: no readings
                raw_cols.append(f"0.0 AS {c}_t, 0 AS {c}_n" if op == "avg" else f"NULL AS {c}_max, NULL AS {c}_min")
            elif op == "avg":
                raw_cols.append(f"total({c}) AS {c}_t, count({c}) AS {c}_n")
            else:
                raw_cols.append(f"max({c}) AS {c}_max, min({c}) AS {c}_min")
        raw = f"SELECT {', '.join(raw_cols)} FROM gpu_samples WHERE ts_ms >= ? AND ts_ms < ? GROUP BY gpu"
        if split <= first:  # short run, or no rollups yet: all raw
            parts = self._raw_q(raw, (start, end), "gpu_samples", start, end)
        else:
            parts = []
            if first > start:  # the partial minute the run starts in
                parts += self._raw_q(raw, (start, first), "gpu_samples", start, first)
            roll_have = self.columns("gpu_1m")
            roll = ["gpu", "sum(samples) AS samples"]
            for _, c, op in self.GPU_SUMMARY:
                if roll_have and not {f"{c}_min", f"{c}_avg", f"{c}_max", f"{c}_n"} <= roll_have:
                    roll.append(f"0.0 AS {c}_t, 0 AS {c}_n" if op == "avg" else f"NULL AS {c}_max, NULL AS {c}_min")
                elif op == "avg":  # weighted by the minutes' readings
                    roll.append(f"total({c}_avg * {c}_n) AS {c}_t, sum({c}_n) AS {c}_n")
                else:  # exact: the minutes' own extremes
                    roll.append(f"max({c}_max) AS {c}_max, min({c}_min) AS {c}_min")
            parts += self._q(f"SELECT {', '.join(roll)} FROM gpu_1m WHERE ts_ms >= ? AND ts_ms < ? GROUP BY gpu",
                             (first, split))
            parts += self._raw_q(raw, (split, end), "gpu_samples", split, end)
        by_gpu: dict[int, list[dict[str, Any]]] = {}
        for p in parts:
            by_gpu.setdefault(p["gpu"], []).append(p)
        return [self._gpu_summary_of(gpu, by_gpu[gpu]) for gpu in sorted(by_gpu)]

    @classmethod
    def _gpu_summary_of(cls, gpu: int, parts: list[dict[str, Any]]) -> dict[str, Any]:
        """One GPU's GPU_SUMMARY from partial aggregates of disjoint row sets (raw rows, 1-minute rollups):
        averages weighted by their readings, extremes of the parts that have readings (NULL when none has)."""
        out: dict[str, Any] = {"gpu": gpu, "samples": int(sum(p["samples"] or 0 for p in parts))}
        for name, c, op in cls.GPU_SUMMARY:
            if op == "avg":
                n = sum(p[f"{c}_n"] or 0 for p in parts)
                out[name] = sum(p[f"{c}_t"] or 0.0 for p in parts) / n if n else None
                continue
            hi = [p[f"{c}_max"] for p in parts if p[f"{c}_max"] is not None]
            lo = [p[f"{c}_min"] for p in parts if p[f"{c}_min"] is not None]
            if op == "max":
                out[name] = max(hi) if hi else None
            else:
                out[name] = max(hi) - min(lo) if hi and lo else None
        return out

    # ------------------------------------------------------------------------------------------ series

    def choose_resolution(self, start_ms: int, end_ms: int, max_points: int = 2000) -> str:
        span = max(0, end_ms - start_ms)
        if span / self.sample_interval_ms <= max_points:
            return "raw"
        if span / RESOLUTIONS["1m"] <= max_points:
            return "1m"
        return "1h"

    def series(self, table: str, columns: list[str] | tuple[str, ...] | None, start_ms: int, end_ms: int,
               gpu: int | None = None, max_points: int = 2000,
               resolution: str | None = None) -> tuple[str, list[dict[str, Any]]]:
        """Rows in [start_ms, end_ms) at raw, 1m or 1h, whichever keeps each series within ~max_points.

        Rollup answers include the not-yet-rolled-up tail, aggregated on the fly from raw rows, so a chart
        always reaches the latest sample.
        """
        if table not in SERIES_TABLES:
            raise ValueError(f"unknown series table {table!r} (known: {', '.join(SERIES_TABLES)})")
        res = resolution or self.choose_resolution(start_ms, end_ms, max_points)
        if res != "raw" and res not in RESOLUTIONS:
            raise ValueError(f"unknown resolution {res!r} (known: raw, {', '.join(RESOLUTIONS)})")
        t = SAMPLE_TABLES[table]
        allowed = [m[0] for m in (t.metrics if res == "raw" else rollup_metrics(table))]
        cols = list(columns) if columns else allowed
        bad = [c for c in cols if c not in allowed]
        if bad:
            raise ValueError(f"unknown column(s) for {table} at {res}: {', '.join(bad)}")
        q = _SeriesQuery(table, cols, int(gpu) if t.per_gpu and gpu is not None else None)
        if res == "raw":
            sql = (f"SELECT {q.key}, {self._select(t.name, cols)} FROM {t.name} "
                   f"WHERE ts_ms >= ? AND ts_ms < ?{q.gpu_sql} ORDER BY {q.key}")
            return res, self._raw_q(sql, (start_ms, end_ms, *q.gpu_param), t.name, start_ms, end_ms, q.gpu)
        return res, self._rollup_series(q, res, start_ms, end_ms)

    def _rollup_series(self, q: _SeriesQuery, res: str, start_ms: int, end_ms: int) -> list[dict[str, Any]]:
        """Stored rollup rows up to the watermark, then the tail aggregated on the fly."""
        bucket = RESOLUTIONS[res]
        first = start_ms - start_ms % bucket
        wm = self._watermark(q.table, res)
        rows: list[dict[str, Any]] = []
        if wm is not None and wm > first:
            table = rollup_table(q.table, res)
            stats = self._select(table, [f"{c}_{s}" for c in q.cols for s in ("min", "avg", "max")])
            rows = self._q(f"SELECT {q.key}, samples, {stats} FROM {rollup_table(q.table, res)} "
                           f"WHERE ts_ms >= ? AND ts_ms < ?{q.gpu_sql} ORDER BY {q.key}",
                           (first, min(end_ms, wm), *q.gpu_param))
        tail = self._series_tail(q, res, max(first, wm) if wm is not None else first, end_ms)
        return rows + tail

    def _series_tail(self, q: _SeriesQuery, res: str, tail_from: int, end_ms: int) -> list[dict[str, Any]]:
        """The tail past the watermark: from 1-minute rows where they exist (hours), then from raw samples."""
        bucket = RESOLUTIONS[res]
        tail: list[dict[str, Any]] = []
        raw_from = tail_from
        if res == "1h":
            wm_1m = self._watermark(q.table, "1m")
            mid_end = min(end_ms, wm_1m) if wm_1m is not None else tail_from
            if mid_end > tail_from:
                have = self._present(rollup_table(q.table, "1m"), q.cols, "_n")
                sql = aggregate_sql(q.table, have, bucket, "1m").replace("{gpu_filter}", q.gpu_sql)
                tail = _no_readings(self._q(sql, (tail_from, mid_end, *q.gpu_param)), q.cols, have)
                raw_from = mid_end
        if raw_from < end_ms:
            name = SAMPLE_TABLES[q.table].name
            have = self._present(name, q.cols)
            sql = aggregate_sql(q.table, have, bucket).replace("{gpu_filter}", q.gpu_sql)
            rows = self._raw_q(sql, (raw_from, end_ms, *q.gpu_param), name, raw_from, end_ms, q.gpu)
            tail = self._merge_tail(tail, _no_readings(rows, q.cols, have), q.cols, q.per_gpu)
        for r in tail:  # n served the exact merge; rows keep one shape
            for c in q.cols:
                del r[f"{c}_n"]
        return tail

    def _present(self, table: str, cols: list[str], suffix: str = "") -> list[str]:
        """The metrics of `cols` whose column (name + suffix) SQL table `table` has (all when it is unknown)."""
        have = self.columns(table, [c + suffix for c in cols])
        return [c for c in cols if c + suffix in have] if have else cols

    @staticmethod
    def _merge_tail(a: list[dict[str, Any]], b: list[dict[str, Any]], cols: list[str],
                    per_gpu: bool) -> list[dict[str, Any]]:
        """Join two partial tails; the bucket they share (at most one per GPU) is combined exactly."""
        if not a:
            return b
        def key(r: dict[str, Any]) -> tuple:
            return (r["ts_ms"], r["gpu"]) if per_gpu else (r["ts_ms"],)

        merged = {key(r): r for r in a}
        for r in b:
            k = key(r)
            merged[k] = merge_rows(merged[k], r, cols) if k in merged else r
        return [merged[k] for k in sorted(merged)]

    # ------------------------------------------------------------------------------------------ events etc.

    def events(self, since_ms: int | None = None, until_ms: int | None = None, kinds: list[str] | None = None,
               severities: list[str] | None = None, run_id: int | None = None, limit: int = 500,
               after_id: int | None = None, kind_family: str | None = None,
               text: str | None = None) -> list[Event]:
        """Oldest first. With since_ms/after_id: the first `limit` from there (paging forward);
        without: the newest `limit`.

        Every filter is applied in SQL, before the limit: filtering the newest `limit` rows afterwards missed
        older matches behind a flood of others (s21). `kind_family` ("gpu.") keeps every kind under it, older
        names included; `text` is a substring of "kind message" (the kind by its dotted name), ASCII letters
        matched in any case (SQLite's LIKE)."""
        from lynxtop.contract.events import LEGACY_KINDS

        where, params = [], []
        if kind_family:
            old = [name for name, new in LEGACY_KINDS.items() if new.value.startswith(kind_family)]
            legacy = f" OR kind IN ({', '.join('?' * len(old))})" if old else ""
            where.append(f"(kind LIKE ? ESCAPE '\\'{legacy})")
            params += [_like_literal(kind_family) + "%", *old]
        if text:
            cases = " ".join("WHEN ? THEN ?" for _ in LEGACY_KINDS)
            where.append(f"((CASE kind {cases} ELSE kind END) || ' ' || message) LIKE ? ESCAPE '\\'")
            params += [x for name, new in LEGACY_KINDS.items() for x in (name, new.value)]
            params.append(f"%{_like_literal(text)}%")
        if since_ms is not None:
            where.append("ts_ms >= ?")
            params.append(int(since_ms))
        if until_ms is not None:
            where.append("ts_ms < ?")
            params.append(int(until_ms))
        if after_id is not None:
            where.append("id > ?")
            params.append(int(after_id))
        if run_id is not None:
            where.append("run_id = ?")
            params.append(int(run_id))
        if kinds:  # a kind is found under its dotted name and under the names older agents stored
            kinds = list(dict.fromkeys(k for kind in kinds for k in stored_kinds(canonical_kind(kind))))
        for col, values in (("kind", kinds), ("severity", severities)):
            if values:
                where.append(f"{col} IN ({', '.join('?' * len(values))})")
                params += list(values)
        cond = f" WHERE {' AND '.join(where)}" if where else ""
        forward = since_ms is not None or after_id is not None
        order = "ts_ms, id" if forward else "ts_ms DESC, id DESC"
        rows = self._q(f"SELECT * FROM events{cond} ORDER BY {order} LIMIT ?", (*params, int(limit)))
        if not forward:
            rows.reverse()
        for r in rows:
            if r.get("details"):
                try:
                    r["details"] = json.loads(r["details"])
                except ValueError:
                    pass
            if not isinstance(r.get("details"), dict | None):
                r["details"] = {"stored": r["details"]}  # not an object: kept, under a name, never dropped
        return [self._record(Event, "events", r) for r in rows]  # an old kind's dotted name: Event.from_json

    def latest(self, table: str, n: int = 1, gpu: int | None = None) -> list[dict[str, Any]]:
        """Newest first: the last n rows (host, serving) or every GPU's rows of the last n ticks."""
        if table not in LATEST_TABLES:
            raise ValueError(f"unknown table {table!r} (known: {', '.join(LATEST_TABLES)})")
        name = _table_name(table)
        if table in ("host", "serving"):
            return self._q(f"SELECT * FROM {name} ORDER BY ts_ms DESC LIMIT ?", (int(n),))
        if table in SLOW_TABLES and int(n) <= 1:  # a reading stored once: each GPU's newest (docs/store.md)
            top = self._q(f"SELECT max((SELECT max(ts_ms) FROM gpu_samples), (SELECT max(ts_ms) FROM {name})) AS ts")
            if top and top[0]["ts"] is not None:
                rows = self.slow_at(table, top[0]["ts"], gpu)
                return sorted(rows, key=lambda r: (-r["ts_ms"], r["gpu"], r.get("pid", 0)))
        if gpu is not None and table != "processes":
            return self._q(f"SELECT * FROM {name} WHERE gpu = ? ORDER BY ts_ms DESC LIMIT ?", (int(gpu), int(n)))
        # the n newest tick times by n index probes (max() below a bound), never a scan
        oldest = None
        for _ in range(max(1, int(n))):
            below = "" if oldest is None else " WHERE ts_ms < ?"
            row = self._q(f"SELECT max(ts_ms) AS ts FROM {name}{below}", () if oldest is None else (oldest,))
            if not row or row[0]["ts"] is None:
                break
            oldest = row[0]["ts"]
        if oldest is None:
            return []
        gpu_sql, params = (" AND gpu = ?", (int(gpu),)) if gpu is not None else ("", ())
        return self._q(f"SELECT * FROM {name} WHERE ts_ms >= ?{gpu_sql} ORDER BY ts_ms DESC, gpu",
                       (oldest, *params))

    def slow_at(self, table: str, ts_ms: int, gpu: int | None = None) -> list[dict[str, Any]]:
        """The NVLink per-link or process readings in force at `ts_ms`: each GPU's newest at or before it.

        These readings are taken about once a second and stored once, at the tick that read them (the ticks
        between carried the same reading); a process list read empty is stored as one row with pid
        NO_PROCESS_PID and a link reading gone as an all-NULL row, so the newest row is always the reading
        then shown live. The GPUs are those of the GPU tick at or before `ts_ms` (index probes, no scan)."""
        if table not in SLOW_TABLES:
            raise ValueError(f"unknown table {table!r} (readings kept between ticks: {', '.join(SLOW_TABLES)})")
        name = _table_name(table)
        if gpu is not None:
            gpus = [int(gpu)]
        else:
            tick = self._q("SELECT max(ts_ms) AS ts FROM gpu_samples WHERE ts_ms <= ?", (int(ts_ms),))
            at = tick[0]["ts"] if tick else None
            gpus = [] if at is None else [r["gpu"] for r in self._q(
                "SELECT gpu FROM gpu_samples WHERE ts_ms = ? ORDER BY gpu", (at,))]
            if not gpus:  # that tick compacted (or none stored): the GPUs the table's chunks name
                gpus = self._chunk_gpus(name)
        out: list[dict[str, Any]] = []
        newest = (f"SELECT * FROM {name} WHERE gpu = ? AND ts_ms = "
                  f"(SELECT max(ts_ms) FROM {name} WHERE gpu = ? AND ts_ms <= ? AND ts_ms >= ?)")
        for g in gpus:
            lo = self._chunks_from(name, g, int(ts_ms))
            rows = self._raw_q(newest, (g, g, int(ts_ms), lo), name, lo, int(ts_ms) + 1, g)
            if table == "processes":
                out += sorted((r for r in rows if r["pid"] != NO_PROCESS_PID), key=lambda r: r["pid"])
            else:
                out += [r for r in rows if any(r[c] is not None for c in r if c not in ("ts_ms", "gpu"))]
        return out

    def _chunk_gpus(self, table: str) -> list[int]:
        try:
            with self._lock:
                return [r[0] for r in self.conn.execute(f"SELECT DISTINCT gpu FROM {chunk_table(table)} ORDER BY gpu")]
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []
            raise NotOurDatabase(f"{self.path}: cannot read the history database: {exc}") from None

    def _chunks_from(self, table: str, gpu: int, ts_ms: int) -> int:
        """Where a "newest at or before ts_ms" search starts: the second-newest compacted chunk of the GPU that
        starts by then (the newest may hold only later rows), or 0 (raw rows only: no chunk is decoded)."""
        try:
            with self._lock:
                starts = _dicts(self.conn.execute(f"SELECT start_ms FROM {chunk_table(table)} WHERE gpu = ? "
                                                  "AND start_ms <= ? ORDER BY start_ms DESC LIMIT 2", (gpu, ts_ms)))
        except sqlite3.OperationalError as exc:  # a file of schema 2 (no chunk tables) opened read-only
            if "no such table" in str(exc):
                return 0
            raise NotOurDatabase(f"{self.path}: cannot read the history database: {exc}") from None
        return min(r["start_ms"] for r in starts) if starts else 0

    def gpus(self) -> list[dict[str, Any]]:
        """Static GPU facts, by index; a board replaced at an index (still a row there) comes before the board that
        holds it now, so `{g["idx"]: g for g in gpus()}` keeps the current one (it kept whichever UUID sorted
        last). The identity columns are read through `gpu_identities()`."""
        rows = self._gpu_rows()
        rows.sort(key=lambda r: (r["idx"] is None, r["idx"] or 0, r["idx_since_ms"] or r["first_seen_ms"] or 0,
                                 r["uuid"]))
        for r in rows:
            for k in gpu_identity.IDENTITY_COLUMNS:
                r.pop(k, None)
        return rows

    def gpu_identities(self) -> list[dict[str, Any]]:
        """Which board each NVML index held when: {gpu, uuid, since_ms, until_ms} by index then start (until None:
        the last board known there). History is keyed by index; a segment change is another board's readings
        (a replacement, a shift after a board fell off the bus: store/gpu_identity.py)."""
        return gpu_identity.segments(self._gpu_rows())

    def gpu_uuid_at(self, gpu: int, ts_ms: int) -> str | None:
        """The board behind index `gpu` at `ts_ms` (None: unknown then, never guessed)."""
        return gpu_identity.uuid_at(self.gpu_identities(), gpu, ts_ms)

    def _gpu_rows(self) -> list[dict[str, Any]]:
        """Every `gpus` row; the identity columns NULL in a file whose writer did not add them yet."""
        wanted = [n for n, _ in GPU_FACT_COLUMNS]
        return self._q(f"SELECT uuid, {self._select('gpus', wanted)} FROM gpus ORDER BY idx, uuid")

    def bench_results(self, limit: int = 50, bench_id: str | None = None,
                      run_ids: Iterable[int] | None = None) -> list[dict[str, Any]]:
        """Newest first; `bench_id` keeps one `lynxtop bench` sweep, `run_ids` those runs' results (in SQL, before
        the limit: the newest `limit` of all runs hid older runs' curves from a comparison)."""
        conds: list[str] = []
        args: list[Any] = []
        if bench_id is not None:
            conds.append("bench_id = ?")
            args.append(bench_id)
        if run_ids is not None:
            ids = [int(r) for r in run_ids]
            conds.append(f"run_id IN ({', '.join('?' * len(ids))})" if ids else "0")
            args += ids
        where = f"WHERE {' AND '.join(conds)} " if conds else ""
        rows = self._q(f"SELECT * FROM bench_results {where}ORDER BY id DESC LIMIT ?", (*args, int(limit)))
        for r in rows:
            if r.get("details"):
                r["details"] = json.loads(r["details"])
        return rows

    # ------------------------------------------------------------------------------------------ export

    def stream(self, sql: str, params: tuple = ()) -> tuple[list[str], Iterator[tuple]]:
        """A cursor (constant memory). Drain or close it at once: while it is open it holds a read snapshot, and the
        writer's checkpoints cannot reset the WAL behind it. Export reads in pages instead (fetch, snapshot)."""
        try:
            cur = self.conn.execute(sql, params)
        except sqlite3.DatabaseError as exc:
            raise self._read_error(exc) from None
        return [d[0] for d in cur.description], cur

    def fetch(self, sql: str, params: tuple = ()) -> list[tuple]:
        """All rows of `sql` (an export's page: bounded by its LIMIT), with stream()'s errors; run it in a snapshot()
        together with the with_chunks() that made `sql`."""
        try:
            with self._lock:
                return self.conn.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as exc:
            raise self._read_error(exc) from None

    def lines(self, sql: str, params: tuple = ()) -> tuple[list[str], tuple]:
        """The first column of every row of `sql` (an export's page of CSV lines: bounded by its LIMIT) and the
        other columns of its last row (the key to continue after), with stream()'s errors. Run it in a snapshot()
        with the chunk_source() that made `sql`."""
        out: list[str] = []
        last: tuple = ()
        try:
            with self._lock:
                cur = self.conn.execute(sql, params)
                while rows := cur.fetchmany(500):  # a few hundred row tuples at a time beside the lines
                    out += [r[0] for r in rows]
                    last = rows[-1][1:]
        except sqlite3.DatabaseError as exc:
            raise self._read_error(exc) from None
        return out, tuple(last)

    def newest(self, table: str, column: str = "ts_ms") -> int | None:
        """The newest `column` of SQL table `table`, its compacted chunks included (an export's fixed end)."""
        with self.snapshot() as conn:
            top = self.fetch(f"SELECT max({column}) FROM {table}")[0][0]
            if table in COMPACTED:
                with contextlib.suppress(sqlite3.OperationalError):  # schema 2: no chunk table
                    last = conn.execute(f"SELECT max(end_ms) - 1 FROM {chunk_table(table)}").fetchone()[0]
                    if last is not None and (top is None or last > top):
                        top = last
        return top

    def _read_error(self, exc: sqlite3.DatabaseError) -> StoreError:
        if "no such table" in str(exc) and schema_version(self.conn, self.path) == 0:  # as _q: a file not set up yet
            return NoHistory(f"{self.path}: no history recorded yet (the agent has created the file but not "
                             "its tables)")
        return NotOurDatabase(f"{self.path}: cannot read the history database: {exc}")
