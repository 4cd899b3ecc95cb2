"""Incremental 1-minute and 1-hour rollups (min/avg/max per metric) computed from raw samples.

A watermark per rollup table (in `meta`) marks the end of the last bucket rolled up; only complete buckets
(a later sample exists) are rolled up, so a restart resumes exactly where the last commit left off. Both
resolutions are computed from raw rows (raw outlives an hour by far), which keeps every average exact.
Late samples (older than a watermark, for example a backlog written after a full disk) mark their bucket
dirty and it is recomputed.
"""

from __future__ import annotations

import sqlite3

from lynxtop.store.schema import RESOLUTIONS, ROLLUP_KINDS, SAMPLE_TABLES, rollback, rollup_metrics, rollup_table

MAX_SPAN_MS = 6 * 3_600_000  # bound one step's work so a long backlog never stalls the writer


def _meta_key(kind: str, res: str) -> str:
    return f"rollup_wm_{kind}_{res}"


def load_watermarks(conn: sqlite3.Connection) -> dict[tuple[str, str], int | None]:
    rows = dict(conn.execute("SELECT key, value FROM meta WHERE key LIKE 'rollup_wm_%'").fetchall())
    return {(k, r): (int(rows[_meta_key(k, r)]) if _meta_key(k, r) in rows else None)
            for k in ROLLUP_KINDS for r in RESOLUTIONS}


def _select_sql(kind: str, res: str) -> str:
    t = SAMPLE_TABLES[kind]
    bucket = RESOLUTIONS[res]
    stats = "".join(f", min({c}), avg({c}), max({c})" for c, _, _ in rollup_metrics(kind))
    key = f"(ts_ms / {bucket}) * {bucket}" + (", gpu" if t.per_gpu else "")
    group = "1, 2" if t.per_gpu else "1"
    return (f"INSERT OR REPLACE INTO {rollup_table(kind, res)} SELECT {key}, count(*){stats} FROM {t.name} "
            f"WHERE ts_ms >= ? AND ts_ms < ? GROUP BY {group}")


_SQL = {(k, r): _select_sql(k, r) for k in ROLLUP_KINDS for r in RESOLUTIONS}


def aggregate_sql(kind: str, columns: list[str], bucket_ms: int) -> str:
    """On-the-fly rollup of raw rows in [?, ?) with the same shape as a rollup table (for the reader's tail)."""
    t = SAMPLE_TABLES[kind]
    stats = "".join(f", min({c}) AS {c}_min, avg({c}) AS {c}_avg, max({c}) AS {c}_max" for c in columns)
    gpu = ", gpu" if t.per_gpu else ""
    return (f"SELECT (ts_ms / {bucket_ms}) * {bucket_ms} AS ts_ms{gpu}, count(*) AS samples{stats} FROM {t.name} "
            f"WHERE ts_ms >= ? AND ts_ms < ?{{gpu_filter}} GROUP BY 1{', 2' if gpu else ''} ORDER BY 1{gpu}")


class Rollups:
    """Owned by the writer thread; `step` does one bounded transaction of work and says whether more remains."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn
        self.wm = load_watermarks(conn)
        self.max_ts: dict[str, int | None] = {
            k: conn.execute(f"SELECT max(ts_ms) FROM {SAMPLE_TABLES[k].name}").fetchone()[0] for k in ROLLUP_KINDS
        }
        self.dirty: dict[tuple[str, str], set[int]] = {(k, r): set() for k in ROLLUP_KINDS for r in RESOLUTIONS}

    def note(self, kind: str, ts_ms: int) -> None:
        """Record a committed sample time (called by the writer after each commit)."""
        cur = self.max_ts[kind]
        if cur is None or ts_ms > cur:
            self.max_ts[kind] = ts_ms
        for res, bucket in RESOLUTIONS.items():
            wm = self.wm[(kind, res)]
            if wm is not None and ts_ms < wm:
                self.dirty[(kind, res)].add(ts_ms - ts_ms % bucket)

    def pending(self) -> bool:
        for (kind, res), wm in self.wm.items():
            if self.dirty[(kind, res)]:
                return True
            top = self.max_ts[kind]
            if top is not None and (wm is None or top - top % RESOLUTIONS[res] > wm):
                return True
        return False

    def step(self) -> bool:
        """Roll up complete buckets past each watermark (bounded); True when more work remains."""
        more = False
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            new_wm = dict(self.wm)
            for (kind, res), wm in self.wm.items():
                bucket = RESOLUTIONS[res]
                top = self.max_ts[kind]
                if top is None:
                    continue
                if wm is None:
                    first = self.conn.execute(f"SELECT min(ts_ms) FROM {SAMPLE_TABLES[kind].name}").fetchone()[0]
                    wm = first - first % bucket
                end = top - top % bucket
                if end - wm > MAX_SPAN_MS:
                    end = wm + MAX_SPAN_MS - MAX_SPAN_MS % bucket
                    more = True
                if end > wm:
                    self.conn.execute(_SQL[(kind, res)], (wm, end))
                    new_wm[(kind, res)] = end
                    self.conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                                      (_meta_key(kind, res), str(end)))
                for start in sorted(self.dirty[(kind, res)]):
                    self.conn.execute(_SQL[(kind, res)], (start, start + bucket))
            self.conn.execute("COMMIT")
        except BaseException:
            rollback(self.conn)
            raise
        self.wm = new_wm
        for d in self.dirty.values():
            d.clear()
        return more
