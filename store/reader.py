"""Read-only access to the history database for the dashboard, `lynxtop runs` and export.

Readers open the file with `mode=ro`, so they can never take the write lock; in WAL mode they never block
the writer. Every query here fetches its (bounded) result at once so no read transaction stays open and
starves checkpoints; only `stream()` keeps a cursor, for export, and the caller drains it.
"""

from __future__ import annotations

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

from lynxtop.contract.events import Event, canonical_kind, stored_kinds
from lynxtop.contract.records import RecordError, RunInfo
from lynxtop.contract.redact import redact_flags
from lynxtop.store import compact, inproc
from lynxtop.store.errors import NotOurDatabase, StoreAccessError, StoreError
from lynxtop.store.rollup import aggregate_sql, merge_rows
from lynxtop.store.schema import (
    BUSY_TIMEOUT_MS,
    COMPACTED,
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
        self._conn: sqlite3.Connection | None = self._connect()
        inproc.register(self.path, self)

    def _connect(self) -> sqlite3.Connection:
        self._cols = {}  # a new connection may see another file (a swapped database)
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
            conn = sqlite3.connect(f"file:{quote(str(self.path.resolve()))}?{params}", uri=True,
                                   check_same_thread=False)
        except sqlite3.Error as exc:
            raise open_error(exc, self.path) from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            check_identity(conn, self.path, integrity=False)
            tune(conn, mmap=True)
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
            if "no such table" in str(exc) and schema_version(self.conn) == 0:
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
        unchanged. Call it, and run the SQL, under the reader's lock.
        """
        if table not in COMPACTED:
            return sql
        with self._lock:
            conn = self.conn
            if not compact.has_chunks(conn, table, start_ms, end_ms):
                return sql
            cols = compact.columns(conn, table)
            dec = f"_dec_{table}"
            conn.execute(f"CREATE TEMP TABLE IF NOT EXISTS {dec} AS SELECT * FROM main.{table} WHERE 0")
            have = compact.columns(conn, dec, "temp")
            if have != cols:  # a column was added since (a newer writer migrated the file)
                conn.execute(f"DROP TABLE temp.{dec}")
                conn.execute(f"CREATE TEMP TABLE {dec} AS SELECT * FROM main.{table} WHERE 0")
            conn.execute(f"DELETE FROM temp.{dec}")
            try:
                rows = compact.decode_rows(conn, table, start_ms, end_ms, cols, gpu)
            except compact.codec.CodecError as exc:  # a newer lynxtop's format, or damage: say which
                raise StoreError(f"{self.path}: a compacted chunk of {table} cannot be read: {exc}") from None
            rows = self._raw_wins(conn, table, cols, rows, gpu)
            conn.executemany(f"INSERT INTO temp.{dec} VALUES ({', '.join('?' * len(cols))})", rows)
        union = f"(SELECT * FROM main.{table} UNION ALL SELECT * FROM temp.{dec}) AS {table}"
        return sql.replace(f"FROM {table} ", f"FROM {union} ")

    @staticmethod
    def _raw_wins(conn: sqlite3.Connection, table: str, cols: list[str], rows: list[tuple],
                  gpu: int | None) -> list[tuple]:
        """Decoded chunk rows less those whose key a raw row also has: the raw row wins (a clock stepped back
        wrote it after its interval was compacted; the next pass merges it so, store/compact.py merge).

        One index range probe over the decoded span; raw rows there are rare (compaction deleted the ones it
        moved), so it normally finds none and the rows are returned as they are."""
        if not rows:
            return rows
        ts = cols.index("ts_ms")
        lo, hi = min(r[ts] for r in rows), max(r[ts] for r in rows) + 1
        key = COMPACTED[table]
        idx = [cols.index(k) for k in key]
        gpu_sql, gpu_arg = ("", ()) if gpu is None or "gpu" not in key else (" AND gpu = ?", (gpu,))
        raw = {tuple(k) for k in conn.execute(f"SELECT {', '.join(key)} FROM main.{table} "
                                              f"WHERE ts_ms >= ? AND ts_ms < ?{gpu_sql}", (lo, hi, *gpu_arg))}
        if not raw:
            return rows
        return [r for r in rows if tuple(r[i] for i in idx) not in raw]

    def _raw_q(self, sql: str, params: tuple | list, table: str, start_ms: int, end_ms: int,
               gpu: int | None = None) -> list[dict[str, Any]]:
        """_q over raw rows and compacted chunks alike (one reader for both forms)."""
        try:
            with self._lock:
                return self._q(self.with_chunks(sql, table, start_ms, end_ms, gpu), params)
        except sqlite3.DatabaseError as exc:
            raise NotOurDatabase(f"{self.path}: cannot read the history database: {exc}") from None

    def _watermark(self, kind: str, res: str) -> int | None:
        rows = self._q("SELECT value FROM meta WHERE key = ?", (f"rollup_wm_{kind}_{res}",))
        return int(rows[0]["value"]) if rows else None

    # ------------------------------------------------------------------------------------------ runs

    def runs(self, limit: int = 50) -> list[RunInfo]:
        """Newest first."""
        return [self._record(RunInfo, "runs", _decode_run(r))
                for r in self._q("SELECT * FROM runs ORDER BY id DESC LIMIT ?", (int(limit),))]

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
        summary["serving"] = self._raw_q(
            "SELECT count(*) AS samples, avg(requests_per_s) AS requests_per_s, "
            "avg(prompt_tokens_per_s) AS prompt_tokens_per_s, "
            "avg(generation_tokens_per_s) AS generation_tokens_per_s, sum(requests_finished) AS requests_finished, "
            "sum(prompt_tokens) AS prompt_tokens, sum(generation_tokens) AS generation_tokens, "
            "avg(ttft_p50_ms) AS ttft_p50_ms, avg(ttft_p99_ms) AS ttft_p99_ms, max(ttft_p99_ms) AS ttft_p99_max_ms, "
            "avg(tpot_p50_ms) AS tpot_p50_ms, avg(tpot_p99_ms) AS tpot_p99_ms, max(tpot_p99_ms) AS tpot_p99_max_ms, "
            "avg(itl_p99_ms) AS itl_p99_ms, avg(e2e_p99_ms) AS e2e_p99_ms, "
            "max(kv_cache_usage_pct) AS kv_cache_usage_max_pct, sum(preemptions) AS preemptions "
            "FROM serving_samples WHERE run_id = ?", (int(run_id),), "serving_samples",
            start if start is not None else 0, end + 1)[0]
        summary["gpus"] = self._gpu_summary(start, end) if start is not None else []
        run["summary"] = summary
        return self._record(RunInfo, "runs", run)

    def _record(self, cls: Any, table: str, row: dict[str, Any]) -> Any:
        """`cls.from_json(row)`; a row that is not a valid record (a newer agent's kind) is a StoreError naming it."""
        try:
            return cls.from_json(row)
        except RecordError as exc:
            raise StoreError(f"{self.path}: {table} row {row.get('id')} cannot be read by this lynxtop: {exc}") \
                from None

    def _gpu_summary(self, start: int, end: int) -> list[dict[str, Any]]:
        """Per GPU over [start, end): 1-minute rollups up to their watermark for long runs, raw after it."""
        wm = self._watermark("gpu", "1m")
        split = start
        if end - start > RAW_SUMMARY_MAX_MS and wm is not None:
            split = max(start, min(wm - wm % RESOLUTIONS["1m"], end))
        parts: list[dict[str, Any]] = []
        if split > start:
            parts += self._q(
                "SELECT gpu, sum(samples) AS samples, sum(util_gpu_pct_avg * util_gpu_pct_n) AS util, "
                "sum(util_gpu_pct_n) AS util_n, sum(sm_active_pct_avg * sm_active_pct_n) AS sm, "
                "sum(sm_active_pct_n) AS sm_n, sum(power_w_avg * power_w_n) AS power, sum(power_w_n) AS power_n, "
                "max(mem_used_bytes_max) AS mem, max(temp_c_max) AS temp, "
                "min(energy_j_min) AS e0, max(energy_j_max) AS e1 FROM gpu_1m "
                "WHERE ts_ms >= ? AND ts_ms < ? GROUP BY gpu", (start, split))
        parts += self._raw_q(
            "SELECT gpu, count(*) AS samples, total(util_gpu_pct) AS util, count(util_gpu_pct) AS util_n, "
            "total(sm_active_pct) AS sm, count(sm_active_pct) AS sm_n, total(power_w) AS power, "
            "count(power_w) AS power_n, max(mem_used_bytes) AS mem, max(temp_c) AS temp, "
            "min(energy_j) AS e0, max(energy_j) AS e1 FROM gpu_samples WHERE ts_ms >= ? AND ts_ms < ? GROUP BY gpu",
            (split, end), "gpu_samples", split, end)
        merged: dict[int, dict[str, Any]] = {}
        for p in parts:
            m = merged.setdefault(p["gpu"], {"samples": 0, "util": 0.0, "util_n": 0, "sm": 0.0, "sm_n": 0,
                                             "power": 0.0, "power_n": 0, "mem": None, "temp": None, "e0": None,
                                             "e1": None})
            for k in ("samples", "util", "util_n", "sm", "sm_n", "power", "power_n"):
                m[k] += p[k] or 0
            for k, f in (("mem", max), ("temp", max), ("e0", min), ("e1", max)):
                if p[k] is not None:
                    m[k] = p[k] if m[k] is None else f(m[k], p[k])
        out = []
        for gpu in sorted(merged):
            m = merged[gpu]
            out.append({
                "gpu": gpu, "samples": m["samples"],
                "util_gpu_pct": m["util"] / m["util_n"] if m["util_n"] else None,
                "sm_active_pct": m["sm"] / m["sm_n"] if m["sm_n"] else None,
                "power_w": m["power"] / m["power_n"] if m["power_n"] else None,
                "mem_used_max_bytes": m["mem"], "temp_max_c": m["temp"],
                "energy_j": m["e1"] - m["e0"] if m["e0"] is not None else None,
            })
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
               after_id: int | None = None) -> list[Event]:
        """Oldest first. With since_ms/after_id: the first `limit` from there (paging forward);
        without: the newest `limit`."""
        where, params = [], []
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
        """Static GPU facts, by index."""
        return self._q("SELECT * FROM gpus ORDER BY idx, uuid")

    def bench_results(self, limit: int = 50, bench_id: str | None = None) -> list[dict[str, Any]]:
        """Newest first; `bench_id` keeps one `lynxtop bench` sweep."""
        where, args = ("WHERE bench_id = ? ", (bench_id,)) if bench_id is not None else ("", ())
        rows = self._q(f"SELECT * FROM bench_results {where}ORDER BY id DESC LIMIT ?", (*args, int(limit)))
        for r in rows:
            if r.get("details"):
                r["details"] = json.loads(r["details"])
        return rows

    # ------------------------------------------------------------------------------------------ export

    def stream(self, sql: str, params: tuple = ()) -> tuple[list[str], Iterator[tuple]]:
        """A cursor for export (constant memory). Drain or close it soon: it holds a read snapshot."""
        try:
            cur = self.conn.execute(sql, params)
        except sqlite3.DatabaseError as exc:
            if "no such table" in str(exc) and schema_version(self.conn) == 0:  # as _q: a file not set up yet
                raise NoHistory(f"{self.path}: no history recorded yet (the agent has created the file but not "
                                "its tables)") from None
            raise NotOurDatabase(f"{self.path}: cannot read the history database: {exc}") from None
        return [d[0] for d in cur.description], cur
