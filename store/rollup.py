"""Incremental 1-minute and 1-hour rollups (min/avg/max per metric) computed from raw samples.

A watermark per rollup table (in `meta`) marks the end of the last bucket rolled up; only complete buckets
(a later sample exists) are rolled up, so a restart resumes exactly where the last commit left off. Both
resolutions are computed from raw rows (raw outlives an hour by far), which keeps every average exact.
Late samples (older than a watermark, for example a backlog written after a full disk) mark their bucket
dirty and it is recomputed.
"""

from __future__ import annotations

import sqlite3

from lynxtop.store.schema import (
    RESOLUTIONS,
    ROLLUP_KINDS,
    SAMPLE_TABLES,
    rollback,
    rollup_columns,
    rollup_metrics,
    rollup_table,
)

MAX_SPAN_MS = 6 * 3_600_000  # bound one step's work so a long backlog never stalls the writer


def _meta_key(kind: str, res: str) -> str:
    return f"rollup_wm_{kind}_{res}"


def load_watermarks(conn: sqlite3.Connection) -> dict[tuple[str, str], int | None]:
    rows = dict(conn.execute("SELECT key, value FROM meta WHERE key LIKE 'rollup_wm_%'").fetchall())
    return {(k, r): (int(rows[_meta_key(k, r)]) if _meta_key(k, r) in rows else None)
            for k in ROLLUP_KINDS for r in RESOLUTIONS}


def _select_sql(kind: str, res: str) -> str:
    """1m from raw rows; 1h from 1m rows (exact: averages weighted by their non-NULL counts)."""
    t = SAMPLE_TABLES[kind]
    bucket = RESOLUTIONS[res]
    metrics = [c for c, _, _ in rollup_metrics(kind)]
    key = ["ts_ms", "gpu"] if t.per_gpu else ["ts_ms"]
    target = ", ".join(key + [c for c, _ in rollup_columns(kind)])
    if res == "1m":
        source = t.name
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

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn
        self.wm = load_watermarks(conn)
        self.max_ts: dict[str, int | None] = {
            k: conn.execute(f"SELECT max(ts_ms) FROM {SAMPLE_TABLES[k].name}").fetchone()[0] for k in ROLLUP_KINDS
        }
        self.dirty: dict[tuple[str, str], set[int]] = {(k, r): set() for k in ROLLUP_KINDS for r in RESOLUTIONS}

    def note_many(self, kind: str, ts_list: list[int]) -> None:
        """Record the sample times of a committed batch (late ones mark their buckets for a re-roll)."""
        if not ts_list:
            return
        top = max(ts_list)
        cur = self.max_ts[kind]
        if cur is None or top > cur:
            self.max_ts[kind] = top
        low = min(ts_list)
        for res, bucket in RESOLUTIONS.items():
            wm = self.wm[(kind, res)]
            if wm is not None and low < wm:
                self.dirty[(kind, res)].update(ts - ts % bucket for ts in ts_list if ts < wm)

    def pending(self) -> bool:
        for (kind, res), wm in self.wm.items():
            if self.dirty[(kind, res)]:
                return True
            top = self.max_ts[kind]
            if top is not None and (wm is None or top - top % RESOLUTIONS[res] > wm):
                return True
        return False

    def step(self) -> bool:
        """Roll up complete buckets past each watermark (bounded); True when more work remains.

        Per kind, 1-minute buckets first (from raw), then the hours those complete (from 1-minute rows).
        """
        more = False
        new_wm = dict(self.wm)
        self.conn.execute("BEGIN IMMEDIATE")
        try:
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
                        if first is None:
                            break
                        wm = first - first % bucket
                    end = limit - limit % bucket
                    if end - wm > MAX_SPAN_MS:
                        end = wm + MAX_SPAN_MS - MAX_SPAN_MS % bucket
                        more = True
                    for start in sorted(self.dirty[(kind, res)]):  # late samples: recompute first
                        self.conn.execute(_SQL[(kind, res)], (start, start + bucket))
                    if end > wm:
                        self.conn.execute(_SQL[(kind, res)], (wm, end))
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
        self.wm = new_wm
        for d in self.dirty.values():
            d.clear()
        return more
