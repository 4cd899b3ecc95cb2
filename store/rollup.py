"""Incremental 1-minute and 1-hour rollups (min/avg/max per metric) computed from raw samples.

A watermark per rollup table (in `meta`) marks the end of the last bucket rolled up; only complete buckets
(a later sample exists) are rolled up. Both resolutions are computed from raw rows (raw outlives an hour by
far), which keeps every average exact. Late samples (below a watermark: a clock stepped back, rows carried
from a swapped database) mark their buckets dirty and they are recomputed; a minute whose older rows
compaction already moved into chunks (a clock stepped back more than three hours) is recomputed over its raw
and its compacted rows together. The marks are rows of `rollup_dirty`, committed in the late rows' own
transaction (`mark_late`, only when a row is late: in-order ticks pay nothing) and deleted in the step's
transaction that recomputes them, so a restart resumes exactly where the last commit left off: the watermarks
and the marks are both in the file (a crash or a failing step between a late tick and its re-roll lost it
before). A mark whose rows retention already deleted is dropped with a warning (`Rollups.step`'s `expired`).

1-minute rows are computed in memory from the rows the writer just committed: re-reading them from the table
cost ~4x more than the aggregation itself (profiled under benchmarks/store.py: the GROUP BY copies every wide
row into a sorter). The result is the row the SQL gives, value for value: INTEGER readings are rounded as the
INSERT stores them and their averages are sums below 2**53 (exact in any order) divided as SQLite divides;
REAL averages repeat SQLite's additions in its order (before SQLite 3.43; later versions roll such kinds by
SQL). Any bucket the memory did not see whole (rows stored before this writer started, a tick written twice,
a late row, an odd value) is computed by SQL. 1-hour rows always come from 1-minute rows by SQL (cheap).
"""

from __future__ import annotations

import logging
import sqlite3
import sys
from bisect import bisect_left
from operator import itemgetter

from lynxtop.store import compact
from lynxtop.store.schema import (
    COMPACTED,
    RESOLUTIONS,
    ROLLUP_KINDS,
    SAMPLE_TABLES,
    rollback,
    rollup_columns,
    rollup_metrics,
    rollup_table,
)

log = logging.getLogger(__name__)

MAX_SPAN_MS = 6 * 3_600_000  # bound one step's work so a long backlog never stalls the writer
_GPU = itemgetter(1)  # a per-GPU row's gpu
_EXACT = 2**52  # |reading| below this: v + 0.5 is exact in a double, so CAST(v + 0.5 AS INTEGER) is int(v + 0.5)
_SUM_EXACT = 2**53  # |partial sums| below this: a double sum of integers is exact in any order


def _meta_key(kind: str, res: str) -> str:
    return f"rollup_wm_{kind}_{res}"


def load_watermarks(conn: sqlite3.Connection) -> dict[tuple[str, str], int | None]:
    rows = dict(conn.execute("SELECT key, value FROM meta WHERE key LIKE 'rollup_wm_%'").fetchall())
    return {(k, r): (int(rows[_meta_key(k, r)]) if _meta_key(k, r) in rows else None)
            for k in ROLLUP_KINDS for r in RESOLUTIONS}


def late_buckets(wm: dict[tuple[str, str], int | None], kind: str, ts_list: list[int]) -> list[tuple[str, int]]:
    """(resolution, bucket start) of each bucket of `kind` that a sample in `ts_list` reaches below its
    watermark (already rolled up): empty for in-order samples, found by one min() per resolution."""
    if not ts_list:
        return []
    low = min(ts_list)
    out: list[tuple[str, int]] = []
    for res, bucket in RESOLUTIONS.items():
        w = wm[(kind, res)]
        if w is not None and low < w:
            out += [(res, b) for b in sorted({ts - ts % bucket for ts in ts_list if ts < w})]
    return out


_MARK_SQL = "INSERT OR IGNORE INTO rollup_dirty (kind, res, bucket_ms) VALUES (?, ?, ?)"
_UNMARK_SQL = "DELETE FROM rollup_dirty WHERE kind = ? AND res = ? AND bucket_ms = ?"


def mark_late(conn: sqlite3.Connection, wm: dict[tuple[str, str], int | None], kind: str,
              ts_list: list[int]) -> int:
    """Inside the caller's transaction (the one that writes these samples): record the buckets they reach below
    a watermark in rollup_dirty, so the re-roll survives a crash after the commit. No statement when none is
    late. Returns the number of buckets marked."""
    late = late_buckets(wm, kind, ts_list)
    if late:
        conn.executemany(_MARK_SQL, [(kind, res, b) for res, b in late])
    return len(late)


def load_dirty(conn: sqlite3.Connection) -> dict[tuple[str, str], set[int]]:
    """The marks left by late samples not yet re-rolled (a crash, a step that kept failing, then a restart).

    A file not migrated to schema 4 has no marks; rows of a kind or resolution this version does not roll
    are left where they are."""
    out: dict[tuple[str, str], set[int]] = {(k, r): set() for k in ROLLUP_KINDS for r in RESOLUTIONS}
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'rollup_dirty'").fetchone():
        for kind, res, b in conn.execute("SELECT kind, res, bucket_ms FROM rollup_dirty"):
            if (kind, res) in out and type(b) is int:
                out[(kind, res)].add(b)
    return out


def _select_sql(kind: str, res: str, source: str | None = None) -> str:
    """1m from raw rows; 1h from 1m rows (exact: averages weighted by their non-NULL counts).

    `source` replaces the raw table of a 1m rollup (a table of the same columns: see Rollups._roll_with_chunks).
    """
    t = SAMPLE_TABLES[kind]
    bucket = RESOLUTIONS[res]
    metrics = [c for c, _, _ in rollup_metrics(kind)]
    key = ["ts_ms", "gpu"] if t.per_gpu else ["ts_ms"]
    target = ", ".join(key + [c for c, _ in rollup_columns(kind)])
    if res == "1m":
        source = source or t.name
        stats = "".join(f", min({c}), avg({c}), max({c}), count({c})" for c in metrics)
        samples = "count(*)"
    else:
        source = rollup_table(kind, "1m")
        stats = "".join(f", min({c}_min), sum({c}_avg * {c}_n) / sum({c}_n), max({c}_max), sum({c}_n)"
                        for c in metrics)
        samples = "sum(samples)"
    group = "1, 2" if t.per_gpu else "1"
    gpu = ", gpu" if t.per_gpu else ""
    return (f"INSERT OR REPLACE INTO {rollup_table(kind, res)} ({target}) "
            f"SELECT (ts_ms / {bucket}) * {bucket}{gpu}, {samples}{stats} FROM {source} "
            f"WHERE ts_ms >= ? AND ts_ms < ? GROUP BY {group}")


_SQL = {(k, r): _select_sql(k, r) for k in ROLLUP_KINDS for r in RESOLUTIONS}
# A late sample's minute whose other rows compaction moved into chunks is rolled up over raw and decoded chunk
# rows together: they are put, in key order (the raw table's order), into this TEMP table of the raw table's
# columns, and the same SELECT reads it (the same values, the same additions in the same order).
_SCRATCH = {k: f"_reroll_{SAMPLE_TABLES[k].name}" for k in ROLLUP_KINDS}
_SQL_SCRATCH = {k: _select_sql(k, "1m", f"temp.{_SCRATCH[k]}") for k in ROLLUP_KINDS}
# SQLite before 3.43 sums a group's doubles one by one in the order it reads them (the table's order: its
# GROUP BY sorter is stable), so a REAL average is reproduced by the same additions in time order; 3.43 and
# later use a compensated sum, and kinds with REAL metrics are then rolled up by SQL only.
_SEQUENTIAL_SUM = sqlite3.sqlite_version_info < (3, 43, 0)
MEMORY_KINDS = tuple(k for k in ROLLUP_KINDS
                     if all(t == "INTEGER" or (t == "REAL" and _SEQUENTIAL_SUM) for _, t, _ in rollup_metrics(k)))


def _rolled(kind: str) -> tuple[tuple[int, bool], ...]:
    """(position in an inserted row, is REAL) of each rolled metric, in rollup_metrics order."""
    t = SAMPLE_TABLES[kind]
    at = {name: i for i, name in enumerate(t.key + tuple(m[0] for m in t.metrics))}
    return tuple((at[name], typ == "REAL") for name, typ, _ in rollup_metrics(kind))


_ROLLED = {k: _rolled(k) for k in MEMORY_KINDS}
_INTEGER_ONLY = frozenset(k for k in MEMORY_KINDS if not any(real for _, real in _ROLLED[k]))


def _insert_1m_sql(kind: str) -> str:
    key = ["ts_ms", "gpu"] if SAMPLE_TABLES[kind].per_gpu else ["ts_ms"]
    cols = key + [c for c, _ in rollup_columns(kind)]
    marks = ", ".join("?" * len(cols))
    return f"INSERT OR REPLACE INTO {rollup_table(kind, '1m')} ({', '.join(cols)}) VALUES ({marks})"


_INSERT_1M = {k: _insert_1m_sql(k) for k in MEMORY_KINDS}


class _Odd(Exception):
    """A reading the memory path cannot reproduce exactly (text, NaN, inf, huge): SQL computes the bucket."""


def _stats(x: tuple | list) -> tuple:
    """min, avg, max, n of one INTEGER column's readings as the table stores them (None = NULL)."""
    first = x[0]
    # A reading that did not change over the minute (a GPU's total memory, power limit, clocks, ECC counts:
    # a third of its columns) costs one count() instead of sum, min and max (~1 us against ~5 us a column).
    # Only a plain int in range qualifies: count() also counts equal floats and bools, which round to it anyway.
    if (type(first) is int and 0 <= first < _EXACT and first == x[-1] and x.count(first) == len(x)
            and first * len(x) < _SUM_EXACT):
        return first, float(first * len(x)) / len(x), first, len(x)
    try:
        try:
            s = sum(x)  # a None raises: cheaper than looking for one first (`None in x` compares each value)
        except TypeError:
            x = [v for v in x if v is not None]
            if not x:
                return None, None, None, 0
            s = sum(x)
        lo, hi = min(x), max(x)
        if type(s) is not int or lo < 0 or hi >= _EXACT:  # a float, or where v + 0.5 rounds: as CAST does
            x = [int(v + 0.5) for v in x]
            s, lo, hi = sum(x), min(x), max(x)
    except (TypeError, ValueError, OverflowError):
        raise _Odd from None
    n = len(x)
    if max(-lo, hi) * n >= _SUM_EXACT:
        raise _Odd
    return lo, float(s) / n, hi, n


# CPython before 3.12 sums floats one by one from a float start (`acc += v` in C); 3.12 compensates.
_SEQUENTIAL_PY_SUM = sys.version_info < (3, 12)


def _sum_in_order(x: tuple | list) -> float:
    """0.0 + x[0] + x[1] + ... as doubles, left to right (a TypeError for text or None)."""
    if _SEQUENTIAL_PY_SUM:
        return sum(x, 0.0)  # the same additions in C: ~10x cheaper than the loop
    acc = 0.0
    for v in x:
        acc += v
    return acc


def _stats_real(x: tuple | list) -> tuple:
    """min, avg, max, n of one REAL column's readings in time order, summed as SQLite < 3.43 sums them."""
    try:
        acc = _sum_in_order(x)  # a None raises: cheaper than looking for one first
    except TypeError:
        x = [v for v in x if v is not None]
        if not x:
            return None, None, None, 0
        acc = None
    try:
        if acc is None:
            acc = _sum_in_order(x)
        lo, hi = min(x), max(x)
    except TypeError:  # text: the column's affinity may have made it a number; SQL knows
        raise _Odd from None
    if acc - acc != 0 or any(type(m) is not float and abs(m) >= _SUM_EXACT for m in (lo, hi)):
        raise _Odd  # NaN or an infinity (stored as NULL), or an integer a double cannot hold
    return lo, acc / len(x), hi, len(x)


def aggregate_bucket(kind: str, bucket: int, rows: list[tuple]) -> list[tuple]:
    """1-minute rollup rows of one bucket from its raw rows (ts, [gpu,] readings...), as _select_sql makes them.

    Raises _Odd when a value is one the SQL path must handle.
    """
    per_gpu = SAMPLE_TABLES[kind].per_gpu
    rolled = _ROLLED[kind]
    if per_gpu and kind in _INTEGER_ONLY:
        out = _aggregate_regular(bucket, rows, rolled)
        if out is not None:
            return out
    if any(real for _, real in rolled):
        rows = sorted(rows, key=itemgetter(0))  # SQLite adds doubles in time order
    groups: dict[object, list[tuple]] = {}
    if per_gpu:
        for r in rows:
            g = groups.get(r[1])
            if g is None:
                groups[r[1]] = g = []
            g.append(r)
    else:
        groups[None] = rows
    out = []
    for gpu, grp in groups.items():
        if per_gpu and type(gpu) is not int:  # stored through the column's affinity: let SQL group it
            raise _Odd
        cols = list(zip(*grp, strict=True))
        rec: list = [bucket, gpu, len(grp)] if per_gpu else [bucket, len(grp)]
        for i, real in rolled:
            rec += _stats_real(cols[i]) if real else _stats(cols[i])
        out.append(tuple(rec))
    return out


def _aggregate_regular(bucket: int, rows: list[tuple], rolled: tuple[tuple[int, bool], ...]) -> list[tuple] | None:
    """aggregate_bucket of per-GPU INTEGER readings whose ticks all hold the same GPUs in the same order (what
    the sampler writes), column by column; None for any other layout (grouped row by row then).

    One zip of the bucket and a slice per GPU replace the grouping and a zip per GPU, and a column that did
    not change on any GPU (a third of them) costs one count() for all GPUs (issue 29.2: the grouping and
    _stats per GPU and column were ~30 % of the writer's time). Each GPU's slice holds its readings in the
    order the grouping gave them and goes through the same _stats: the rows are the ones aggregate_bucket gave.
    """
    n = len(rows)
    cols = list(zip(*rows, strict=True))
    gcol = cols[1]
    try:
        k = gcol.index(gcol[0], 1)  # GPUs per tick: the first GPU's next row starts the second tick
    except ValueError:
        k = n
    gpus = gcol[:k]
    for g in gpus:
        if type(g) is not int:
            return None
    if n % k or len(set(gpus)) != k or gcol != gpus * (n // k):
        return None
    m = n // k  # rows per GPU
    recs = [[bucket, g, m] for g in gpus]
    for i, _ in rolled:
        col = cols[i]
        v = col[0]
        if (type(v) is int and col[-1] == v and 0 <= v < _EXACT and v * m < _SUM_EXACT  # last first: a varying
                and col.count(v) == n):  # column is seldom equal at both ends, and count() scans all of it
            st = (v, float(v * m) / m, v, m)  # what _stats' shortcut gives each GPU
            for rec in recs:
                rec += st
            continue
        for j, rec in enumerate(recs):
            rec += _stats(col[j::k])
    return [tuple(r) for r in recs]


class _Memory:
    """The 1-minute buckets of one kind past its watermark that this writer saw whole, as raw rows then as
    rollup rows; `sql` holds the buckets it did not (computed by SQL when complete)."""

    def __init__(self, sql_until: int | None):
        self.sql_until = sql_until  # buckets below: rows stored before this writer started, SQL rolls them
        self.open: dict[int, list[tuple]] = {}  # bucket -> raw rows (bucket not complete yet)
        self.seen: dict[int, set[int]] = {}  # bucket -> sample times in it (a repeat replaced a row: SQL)
        self.ready: dict[int, list[tuple]] = {}  # bucket -> rollup rows, written by the next step
        self.sql: set[int] = set()


def aggregate_sql(kind: str, columns: list[str], bucket_ms: int, source: str = "raw") -> str:
    """On-the-fly rollup of rows in [?, ?) shaped like a rollup table (for the reader's not-yet-rolled tail).

    source "raw" aggregates samples; "1m" aggregates 1-minute rows (exact, weighted by their n).
    The SQL holds a `{gpu_filter}` placeholder for an optional "AND gpu = ?".
    """
    t = SAMPLE_TABLES[kind]
    if source == "raw":
        name, samples = t.name, "count(*)"
        stats = "".join(f", min({c}) AS {c}_min, avg({c}) AS {c}_avg, max({c}) AS {c}_max, count({c}) AS {c}_n"
                        for c in columns)
    else:
        name, samples = rollup_table(kind, source), "sum(samples)"
        stats = "".join(f", min({c}_min) AS {c}_min, sum({c}_avg * {c}_n) / sum({c}_n) AS {c}_avg, "
                        f"max({c}_max) AS {c}_max, sum({c}_n) AS {c}_n" for c in columns)
    gpu = ", gpu" if t.per_gpu else ""
    return (f"SELECT (ts_ms / {bucket_ms}) * {bucket_ms} AS ts_ms{gpu}, {samples} AS samples{stats} FROM {name} "
            f"WHERE ts_ms >= ? AND ts_ms < ?{{gpu_filter}} GROUP BY 1{', 2' if gpu else ''} ORDER BY 1{gpu}")


def merge_rows(a: dict, b: dict, columns: list[str]) -> dict:
    """Combine two partial rollup rows of one bucket (exact: averages weighted by n)."""
    out = dict(a)
    out["samples"] = (a["samples"] or 0) + (b["samples"] or 0)
    for c in columns:
        mins = [x for x in (a[f"{c}_min"], b[f"{c}_min"]) if x is not None]
        maxs = [x for x in (a[f"{c}_max"], b[f"{c}_max"]) if x is not None]
        na, nb = a[f"{c}_n"] or 0, b[f"{c}_n"] or 0
        out[f"{c}_min"] = min(mins) if mins else None
        out[f"{c}_max"] = max(maxs) if maxs else None
        out[f"{c}_n"] = na + nb
        out[f"{c}_avg"] = ((a[f"{c}_avg"] or 0) * na + (b[f"{c}_avg"] or 0) * nb) / (na + nb) if na + nb else None
    return out


class Rollups:
    """Owned by the writer thread; `step` does one bounded transaction of work and says whether more remains."""

    def __init__(self, conn: sqlite3.Connection, *, in_memory: bool = True):
        self.conn = conn
        self.wm = load_watermarks(conn)
        self.max_ts: dict[str, int | None] = {
            k: conn.execute(f"SELECT max(ts_ms) FROM {SAMPLE_TABLES[k].name}").fetchone()[0] for k in ROLLUP_KINDS
        }
        # late buckets to recompute: those a crash or a failing step left in the file, then those noted since
        self.dirty: dict[tuple[str, str], set[int]] = load_dirty(conn)
        self.idle: dict[tuple[str, str], int] = {}  # see pending()
        self._decoded: dict[str, tuple[list[str], dict[bytes, list[tuple]]]] = {}  # see _roll_with_chunks
        self._decoded_used: set[str] = set()
        bucket = RESOLUTIONS["1m"]
        self.memory: dict[str, _Memory] = {}
        if in_memory:
            for k in MEMORY_KINDS:
                top = self.max_ts[k]
                self.memory[k] = _Memory(None if top is None else top - top % bucket + bucket)

    def note_rows(self, kind: str, ticks: list[tuple[int, list[tuple]]]) -> None:
        """Record a committed batch of a memory kind: (ts, its raw rows as inserted) per tick, in any order.

        The rows are kept (references, not copies) until their minute is complete, then aggregated.
        """
        mem = self.memory.get(kind)
        if mem is None:
            self.note_many(kind, [ts for ts, _ in ticks])
            return
        if not ticks:
            return
        self.note_many(kind, [ts for ts, _ in ticks])  # the top, and late rows below the watermark
        bucket = RESOLUTIONS["1m"]
        wm = self.wm[(kind, "1m")]
        per_gpu = SAMPLE_TABLES[kind].per_gpu
        for ts, rows in ticks:
            b = ts - ts % bucket
            if (wm is not None and ts < wm) or ts < 0 or (mem.sql_until is not None and b < mem.sql_until):
                continue  # dirty (note_many), or rolled by SQL anyway
            if b in mem.sql:
                continue
            if b in mem.ready:  # a row for a minute already aggregated: SQL recomputes it
                del mem.ready[b]
                mem.sql.add(b)
                continue
            seen = mem.seen.get(b)
            if seen is None:
                mem.seen[b] = seen = set()
                mem.open[b] = []
            if ts in seen or (per_gpu and len(set(map(_GPU, rows))) != len(rows)):  # a row replaced another
                del mem.open[b], mem.seen[b]
                mem.sql.add(b)
                continue
            seen.add(ts)
            mem.open[b].extend(rows)
        top = self.max_ts[kind]
        if top is None:
            return
        current = top - top % bucket
        for b in [b for b in mem.open if b < current]:  # complete: a later sample exists
            rows = mem.open.pop(b)
            del mem.seen[b]
            try:
                mem.ready[b] = aggregate_bucket(kind, b, rows)
            except _Odd:
                mem.sql.add(b)

    def note_many(self, kind: str, ts_list: list[int]) -> None:
        """Record the sample times of a committed batch (late ones mark their buckets for a re-roll)."""
        if not ts_list:
            return
        top = max(ts_list)
        cur = self.max_ts[kind]
        if cur is None or top > cur:
            self.max_ts[kind] = top
        for res, b in late_buckets(self.wm, kind, ts_list):
            self.dirty[(kind, res)].add(b)

    def pending(self) -> bool:
        for mem in self.memory.values():
            if mem.ready:
                return True
        for (kind, res), wm in self.wm.items():
            if self.dirty[(kind, res)]:
                return True
            limit = self.max_ts[kind] if res == "1m" else self.wm[(kind, "1m")]  # as step() rolls them
            if limit is None:
                continue
            if wm is None:  # never rolled: a step finds out, once per bucket the limit enters (not per batch)
                # A step rolls nothing until the limit leaves the first sample's bucket; asked at every new
                # limit, a fresh database's first minute (and first hour) cost an empty transaction a tick.
                seen, bucket = self.idle.get((kind, res)), RESOLUTIONS[res]
                if seen is None or limit - limit % bucket != seen - seen % bucket:
                    return True
            elif limit - limit % RESOLUTIONS[res] > wm:
                return True
        return False

    def has_dirty(self) -> bool:
        return any(self.dirty.values())

    @staticmethod
    def _drop_expired(dirty: dict[tuple[str, str], set[int]], expired: dict[str, int]) -> None:
        """Forget dirty buckets that reach below what retention deletes (`expired`: table -> rows below it are
        deleted, retention.cutoffs). Their other rows are gone or going: a re-roll would replace a whole
        bucket's rollup by one of the late rows alone, so the rollup is kept as it is and the late rows go
        with retention. Only a clock stepped back past a retention limit gets here."""
        for (kind, res), starts in dirty.items():
            source = SAMPLE_TABLES[kind].name if res == "1m" else rollup_table(kind, "1m")
            cut = expired.get(source)
            if cut is None:
                continue
            old = sorted(b for b in starts if b < cut)
            if old:
                log.warning("rollup: %s keeps its rows of %d %s bucket(s) from %d to %d ms (late samples came in "
                            "them): %s rows below %d ms are past retention, a re-roll would count the late "
                            "ones alone", rollup_table(kind, res), len(old), res, old[0], old[-1], source, cut)
                starts.difference_update(old)

    def step(self, expired: dict[str, int] | None = None) -> bool:
        """Roll up complete buckets past each watermark (bounded); True when more work remains.

        Per kind, 1-minute buckets first (from raw), then the hours those complete (from 1-minute rows).
        Dirty buckets are recomputed first and their rollup_dirty rows deleted in the same transaction;
        `expired` (retention.cutoffs' table -> cutoff) drops those whose source rows retention deletes.
        """
        more = False
        marked = [(k, r, b) for (k, r), starts in self.dirty.items() for b in starts]  # all leave the file
        new_wm = dict(self.wm)
        done: dict[str, int] = {}  # memory kinds: the end of the minutes written from memory
        idle: dict[tuple[str, str], int] = {}  # never-rolled resolutions: the limit they were looked at with
        self._decoded_used.clear()
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            dirty = self.dirty
            if marked:
                if expired:  # on copies: a failed step keeps every mark, in memory as in the file
                    dirty = {key: set(starts) for key, starts in self.dirty.items()}
                    self._drop_expired(dirty, expired)
                self.conn.executemany(_UNMARK_SQL, marked)
            for kind in ROLLUP_KINDS:
                top = self.max_ts[kind]
                if top is None:
                    continue
                limit = top  # 1m: up to the newest sample; 1h: up to the 1m watermark
                for res in ("1m", "1h"):
                    bucket = RESOLUTIONS[res]
                    wm = self.wm[(kind, res)]
                    if wm is None:
                        src = SAMPLE_TABLES[kind].name if res == "1m" else rollup_table(kind, "1m")
                        first = self.conn.execute(f"SELECT min(ts_ms) FROM {src}").fetchone()[0]
                        idle[(kind, res)] = limit  # unless rolled below
                        if first is None:
                            break
                        wm = first - first % bucket
                    end = limit - limit % bucket
                    if end - wm > MAX_SPAN_MS:
                        end = wm + MAX_SPAN_MS - MAX_SPAN_MS % bucket
                        more = True
                    if res == "1m":  # late samples: recompute first
                        self._reroll_1m(kind, dirty[(kind, res)])
                    else:
                        for start in sorted(dirty[(kind, res)]):
                            self.conn.execute(_SQL[(kind, res)], (start, start + bucket))
                    if end > wm:
                        mem = self.memory.get(kind) if res == "1m" else None
                        if mem is None:
                            self.conn.execute(_SQL[(kind, res)], (wm, end))
                        else:
                            done[kind] = end
                            self._write_memory(kind, mem, wm, end)
                        new_wm[(kind, res)] = end
                        self.conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                                          (_meta_key(kind, res), str(end)))
                    limit = new_wm[(kind, res)] if new_wm[(kind, res)] is not None else limit
                    if new_wm[(kind, res)] is None:
                        break
            self.conn.execute("COMMIT")
        except BaseException:
            rollback(self.conn)
            raise
        finally:
            for table in [t for t in self._decoded if t not in self._decoded_used]:
                del self._decoded[table]  # no minute of it re-rolled over chunks this step: not kept
        self.wm = new_wm
        self.idle.update({key: lim for key, lim in idle.items() if new_wm[key] is None})
        for d in self.dirty.values():
            d.clear()
        for kind, end in done.items():  # only now: a failed step keeps them for the retry
            mem = self.memory[kind]
            for b in [b for b in mem.ready if b < end]:
                del mem.ready[b]
            mem.sql = {b for b in mem.sql if b >= end}
        return more

    def _reroll_1m(self, kind: str, starts: set[int]) -> None:
        """Recompute the 1-minute buckets `starts` (late samples arrived in them) from all their rows.

        A bucket no compacted chunk overlaps (the common case: one index lookup for all of them says so) is
        rolled up from the raw table as before; one that compaction already moved rows of into chunks is
        rolled up over both (_roll_with_chunks), never over the late raw rows alone.
        """
        if not starts:
            return
        bucket = RESOLUTIONS["1m"]
        table = SAMPLE_TABLES[kind].name
        todo = sorted(starts)
        near = compact.has_chunks(self.conn, table, todo[0], todo[-1] + bucket)
        for start in todo:
            if near and compact.has_chunks(self.conn, table, start, start + bucket):
                try:
                    self._roll_with_chunks(kind, start, start + bucket)
                except compact.codec.CodecError as exc:  # damage or a newer format: retrying cannot help
                    log.warning("rollup: %s minute %d keeps its rollup: a chunk cannot be read (%s)", table,
                                start, exc)
            else:
                self.conn.execute(_SQL[(kind, "1m")], (start, start + bucket))

    def _roll_with_chunks(self, kind: str, start: int, end: int) -> None:
        """The 1-minute rows of [start, end) over its raw rows and its compacted rows, the raw row winning on an
        equal key (as compaction's merge and INSERT OR REPLACE do): the rows the SQL rollup gives when all of
        them are raw, value for value. Raises codec.CodecError for a chunk it cannot decode, before it writes
        anything (the bucket then keeps the rows it had: never replaced by a partial bucket)."""
        conn = self.conn
        table = SAMPLE_TABLES[kind].name
        scratch = _SCRATCH[kind]
        cols = compact.columns(conn, table)
        conn.execute(f"CREATE TEMP TABLE IF NOT EXISTS {scratch} AS SELECT * FROM main.{table} WHERE 0")
        if compact.columns(conn, scratch, "temp") != cols:  # a column was added since (a migration)
            conn.execute(f"DROP TABLE temp.{scratch}")
            conn.execute(f"CREATE TEMP TABLE {scratch} AS SELECT * FROM main.{table} WHERE 0")
        idx = [cols.index(k) for k in COMPACTED[table]]
        ts = cols.index("ts_ms")
        # Decoding is most of the cost (~90 ms for a minute of 8 GPUs: a chunk holds ten minutes), and after a
        # clock stepped back every batch brings a late sample to the same chunks: the blobs last decoded (this
        # table's, for the last minute re-rolled) are kept with their rows while steps keep re-rolling such
        # minutes, and reused while a blob is unchanged (step() drops them after a step that re-rolls none).
        cached = self._decoded.get(table)
        known = cached[1] if cached is not None and cached[0] == cols else {}
        decoded: dict[bytes, list[tuple]] = {}
        rows: dict[tuple, tuple] = {}
        at = itemgetter(ts)
        for blob in compact.chunk_blobs(conn, table, start, end):
            got = known.get(blob)
            if got is None:
                got = compact.decode_blob(blob, cols)
            decoded[blob] = got
            # a chunk's rows are in key order, time first: this minute's are one slice of them
            for r in got[bisect_left(got, start, key=at):bisect_left(got, end, key=at)]:
                rows[tuple(r[i] for i in idx)] = r
        self._decoded[table] = (cols, decoded)
        self._decoded_used.add(table)
        for r in conn.execute(f"SELECT {', '.join(cols)} FROM main.{table} WHERE ts_ms >= ? AND ts_ms < ?",
                              (start, end)):
            rows[tuple(r[i] for i in idx)] = r
        try:
            conn.executemany(f"INSERT INTO temp.{scratch} VALUES ({', '.join('?' * len(cols))})",
                             [rows[k] for k in sorted(rows)])  # key order: the order the raw table is read in
            conn.execute(_SQL_SCRATCH[kind], (start, end))
        finally:
            conn.execute(f"DELETE FROM temp.{scratch}")

    def _write_memory(self, kind: str, mem: _Memory, wm: int, end: int) -> None:
        """Write the 1-minute rows of [wm, end): SQL for minutes the memory did not see whole, else its rows."""
        bucket = RESOLUTIONS["1m"]
        sql = _SQL[(kind, "1m")]
        if mem.sql_until is not None and mem.sql_until > wm:
            self.conn.execute(sql, (wm, min(end, mem.sql_until)))
        for b in sorted(mem.sql):
            if wm <= b < end and (mem.sql_until is None or b >= mem.sql_until):
                self.conn.execute(sql, (b, b + bucket))
        rows = [r for b in sorted(mem.ready) if b < end for r in mem.ready[b]]
        if rows:
            self.conn.executemany(_INSERT_1M[kind], rows)
