"""Benchmark of the history store: synthetic 8 GPUs at 1 Hz with every GPU metric.

Measures, in one run on a fresh temporary database:
  ingest_rows_per_s       GPU rows/s through StoreWriter (host + serving rows too, rollups maintained)
  ingest_with_rollups_rows_per_s  the same until the rollups are written too (median part, with its spread)
  bare_executemany_rows_per_s     the ceiling: plain executemany of the same rows as prepared tuples into the
                          same tables (SQLite + CPython's driver alone), measured between the parts
  bare_nan_executemany_rows_per_s the same with each missing reading bound as NaN (SQLite stores NULL): CPython's
                          sqlite3 adapts a bound None through a slow lookup (~1 us), which the writer never
                          binds (literal NULLs); the rows stored are checked equal (bare_nan_same_rows)
  sqlite_only_rows_per_s  the floor: SQLite alone storing the same rows by INSERT ... SELECT from temporary
                          tables (no value bound through Python), same transactions, same parts
  bytes_per_value         raw_bytes_per_value (below) plus the 1m/1h rollup bytes of the same rows, per raw
                          GPU value; uncompacted_bytes_per_value: gpu_samples' b-tree and rollups before
  query_24h_ms            median StoreReader.series over 24 h for 8 GPUs (5 chart columns; 1-minute rollups)
  query_30d_ms            median over 30 days (1-hour rollups)
  export_ratio_vs_sqlite3 our CSV export rows/s / `sqlite3 -csv` rows/s for the same SELECT (same run)
  raw_bytes_per_value     after compaction (store/compact.py) of every closed ten-minute interval: the bytes
                          of gpu_samples_chunks (index and page overhead included) per raw GPU value they
                          hold (the per-chunk median and spread beside it; _whole_table adds the rows not
                          yet closed, the last rollup hour here); bytes_per_value adds the rollups;
                          tables_bytes_per_value gives every sample table's figure before and after.
                          Ingest, export and the first query figures are taken before compaction
                          (the writer's own compaction is held off during the ingest), then export and the
                          queries are run again on the compacted file.

The 29 days before the raw day are generated directly as rollup rows by SQL (30 days of raw rows would
take an hour to generate); the last 24 h are real raw rows written through the writer.
Prints progress lines, then ONE JSON object on the last line.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lynxtop.contract.columns import GPU_METRICS, HOST_METRICS, NVLINK_METRICS, SERVING_METRICS, names
from lynxtop.store import compact
from lynxtop.store.export import build_query, export_table
from lynxtop.store.reader import StoreReader
from lynxtop.store.rollup import load_watermarks
from lynxtop.store.schema import COMPACTED, chunk_table, connect_rw, rollup_columns, rollup_metrics
from lynxtop.store.writer import StoreWriter

GPUS = 8
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
CHART_COLUMNS = ["util_gpu_pct", "sm_active_pct", "mem_used_bytes", "power_w", "temp_c"]
TARGETS = {"ingest_rows_per_s": 100_000, "ingest_with_rollups_rows_per_s": 150_000,
           "bytes_per_value": 1.5, "raw_bytes_per_value": 1.2, "query_24h_ms": 100.0, "query_30d_ms": 300.0,
           "export_ratio_vs_sqlite3": 0.7}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def synthetic_gpu_rows(pool_ticks: int, seed: int = 1) -> list[list[dict]]:
    """Realistic magnitudes for a serving H200 (values repeat every `pool_ticks` ticks)."""
    rng = random.Random(seed)
    pool = []
    energy = [50_000_000 + g * 1_000 for g in range(GPUS)]
    util = [80] * GPUS
    for _ in range(pool_ticks):
        rows = []
        for g in range(GPUS):
            util[g] = max(0, min(100, util[g] + rng.randint(-6, 6)))
            u = util[g]
            power = 150 + u * 5.4 + rng.random() * 20
            energy[g] += int(power)
            rows.append({
                "gpu": g, "lost": 0, "util_gpu_pct": u, "util_mem_pct": u // 2, "sm_active_pct": u * 7 // 10,
                "sm_occupancy_pct": u // 3, "tensor_active_pct": u // 2, "dram_bw_pct": u * 6 // 10,
                "fp16_active_pct": u // 4, "fp32_active_pct": u // 20,
                "pcie_tx_bytes_per_s": rng.randint(1_000_000, 900_000_000),
                "pcie_rx_bytes_per_s": rng.randint(1_000_000, 900_000_000),
                "nvlink_tx_bytes_per_s": u * 2_500_000_000 // 10 + rng.randint(0, 10**8),
                "nvlink_rx_bytes_per_s": u * 2_500_000_000 // 10 + rng.randint(0, 10**8),
                "mem_used_bytes": 133_000_000_000 + rng.randint(0, 2_000_000_000),
                "mem_total_bytes": 150_754_820_096, "mem_reserved_bytes": 609_681_408,
                # whole watts, as the sampler makes them (agent/gpu/readers.py rounds NVML's mW): a float here
                # sent every statement down the rounding path real GPU rows never take (session 25)
                "power_w": round(power), "power_limit_w": 700, "energy_j": energy[g], "temp_c": 40 + u // 4,
                "sm_clock_mhz": 1980, "mem_clock_mhz": 3201, "throttle_reasons": 0 if u < 90 else 4,
                "ecc_corrected": 0, "ecc_uncorrected": 0, "remapped_rows_pending": 0, "remapped_rows_failed": 0,
            })
        pool.append(rows)
    return pool


def synthetic_nvlink_rows(pool_ticks: int, seed: int = 2) -> list[list[dict]]:
    rng = random.Random(seed)
    cols = names(NVLINK_METRICS)
    return [[{"gpu": g, **{c: rng.randint(0, 3_000_000_000) for c in cols}} for g in range(GPUS)]
            for _ in range(pool_ticks)]


def host_row(i: int) -> dict:
    return {"cpu_pct": 12.5, "cpu_per_core_pct": None, "load1": 3.1, "load5": 3.0, "load15": 2.9,
            "mem_used_bytes": 400_000_000_000 + i, "mem_available_bytes": 1_500_000_000_000,
            "mem_total_bytes": 2_000_000_000_000, "disk_free_bytes": 3_000_000_000_000,
            "vllm_procs": 10, "vllm_cpu_pct": 180.0, "vllm_rss_bytes": 60_000_000_000}


def serving_row(i: int) -> dict:
    return {"run_id": 1, "scrape_ok": 1, "requests_per_s": 3.5, "generation_tokens_per_s": 2400.0,
            "requests_running": 40, "requests_waiting": 2, "kv_cache_usage_pct": 62.5,
            "ttft_p50_ms": 180.0, "ttft_p99_ms": 900.0 + i % 50, "tpot_p50_ms": 22.0, "tpot_p99_ms": 41.0}


def generate_rollups(db: Path, start_ms: int, end_ms: int) -> int:
    """Fill gpu_1m and gpu_1h for [start, end) with plausible values, in SQL (C speed), and set the
    watermarks there, as a database that has been recording for a month would have them."""
    conn = sqlite3.connect(db, isolation_level=None)
    total = 0
    for table, step in (("gpu_1m", 60_000), ("gpu_1h", HOUR_MS)):
        base = "abs(random()) % 100"
        n = step // 1000
        stats = [s for _ in rollup_metrics("gpu") for s in (base, f"{base} + 0.5", base, str(n))]
        cols = ", ".join(["ts_ms", "gpu"] + [c for c, _ in rollup_columns("gpu")])
        conn.execute("BEGIN")
        conn.execute(
            f"WITH RECURSIVE t(ts) AS (SELECT ? UNION ALL SELECT ts + ? FROM t WHERE ts + ? < ?), "
            f"g(gpu) AS (SELECT 0 UNION ALL SELECT gpu + 1 FROM g WHERE gpu < {GPUS - 1}) "
            f"INSERT INTO {table} ({cols}) SELECT ts, gpu, {n}, {', '.join(stats)} FROM t, g",
            (start_ms, step, step, end_ms))
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                     (f"rollup_wm_gpu_{table[4:]}", str(end_ms)))
        conn.execute("COMMIT")
        total += conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    conn.close()
    return total


def table_bytes(db: Path, tables: list[str]) -> int:
    conn = sqlite3.connect(db)
    q = f"SELECT sum(pgsize) FROM dbstat WHERE name IN ({', '.join('?' * len(tables))})"
    n = conn.execute(q, tables).fetchone()[0] or 0
    conn.close()
    return n


def median_ms(fn, repeat: int) -> float:
    fn()  # warm the page cache: the dashboard queries a file it reads every second
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


MIN_HOURS = 2


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hours", type=float, default=24, help="hours of raw 1 Hz samples to write (default 24)")
    ap.add_argument("--nvlink", action="store_true", help="also write per-link NVLink rows every tick")
    ap.add_argument("--keep", metavar="DIR", help="keep the database in DIR")
    args = ap.parse_args()
    if not args.hours >= MIN_HOURS:  # NaN too
        ap.error(f"--hours {args.hours:g}: at least {MIN_HOURS} (the compacted figures need an hour's rollups "
                 "closed before the newest hour: with less, nothing is compacted and nothing is measured)")
    return args


PARTS = 5  # timed parts of the ingest (and of the bare ceiling); their median is the figure, min-max the spread


def _wait_drain(w: StoreWriter) -> None:
    """Sleep until the writer ends a batch (it notifies its condition then) or 20 ms pass.

    A plain 20 ms sleep (a busy poll steals the GIL from the writer) saw the end of a part up to 20 ms late, a
    few percent of a 0.2 s part; the writer's own notification ends the wait on time without polling."""
    with w._cv:
        w._cv.wait(0.02)


def _wait_rollups(w: StoreWriter) -> None:
    """Until every tick is written and the rollups they complete are too (bounded steps may need several)."""
    deadline = time.monotonic() + 600
    while True:
        if not w.flush(max(1.0, deadline - time.monotonic())):
            raise SystemExit("writer did not finish within 600 s")
        if not w.rollups.pending() or time.monotonic() > deadline:  # read-only peek at the writer's state
            return
        _wait_drain(w)


def _bare_part(conn: sqlite3.Connection, rows: dict[str, list[tuple]], batch: int) -> float:
    """Seconds for plain executemany of prepared tuples into the same tables, one transaction per `batch`
    ticks as the writer commits them: what SQLite and CPython's driver alone cost for this schema."""
    sql = {}
    for kind, table in (("gpu", "gpu_samples"), ("host", "host_samples"), ("serving", "serving_samples")):
        cols = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
        sql[kind] = f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
    t = time.perf_counter()
    n = len(rows["host"])
    for lo in range(0, n, batch):
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(sql["gpu"], rows["gpu"][lo * GPUS:(lo + batch) * GPUS])
        conn.executemany(sql["host"], rows["host"][lo:lo + batch])
        conn.executemany(sql["serving"], rows["serving"][lo:lo + batch])
        conn.execute("COMMIT")
    return time.perf_counter() - t


def _sqlite_only_part(conn: sqlite3.Connection, rows: dict[str, list[tuple]], batch: int) -> tuple[float, float]:
    """Wall and CPU seconds for SQLite alone to store the part: the rows are first copied (untimed) into
    temporary tables, then moved by INSERT ... SELECT in the writer's transactions. No value passes through
    Python: the floor of any way into SQLite for this schema (the driver's binding is what bare adds)."""
    tables = {"gpu": "gpu_samples", "host": "host_samples", "serving": "serving_samples"}
    for kind, table in tables.items():
        conn.execute(f"DROP TABLE IF EXISTS temp.src_{kind}")
        conn.execute(f"CREATE TEMP TABLE src_{kind} AS SELECT * FROM main.{table} LIMIT 0")
        conn.executemany(f"INSERT INTO temp.src_{kind} VALUES ({', '.join('?' * len(rows[kind][0]))})", rows[kind])
    t, c = time.perf_counter(), time.process_time()
    n = len(rows["host"])
    for lo in range(0, n, batch):
        conn.execute("BEGIN IMMEDIATE")
        for kind, table in tables.items():
            per = GPUS if kind == "gpu" else 1
            conn.execute(f"INSERT INTO main.{table} SELECT * FROM temp.src_{kind} WHERE rowid > ? AND rowid <= ?",
                         (lo * per, (lo + batch) * per))
        conn.execute("COMMIT")
    return time.perf_counter() - t, time.process_time() - c


def _bare_rows(pool, hosts, servs, raw_start: int, lo: int, hi: int) -> dict[str, list[tuple]]:
    """The part's rows as tuples in table column order (built before the clock starts)."""
    gcols = ["gpu", *names(GPU_METRICS)]
    hcols, scols = names(HOST_METRICS), names(SERVING_METRICS)
    out: dict[str, list[tuple]] = {"gpu": [], "host": [], "serving": []}
    for i in range(lo, hi):
        ts = raw_start + i * 1000
        out["gpu"] += [(ts, *(r.get(c) for c in gcols)) for r in pool[i % 3600]]
        out["host"].append((ts, *(hosts[i % 60].get(c) for c in hcols)))
        out["serving"].append((ts, *(servs[i % 60].get(c) for c in scols)))
    return out


_NAN = float("nan")


def _nan_rows(rows: dict[str, list[tuple]]) -> dict[str, list[tuple]]:
    """The same rows with each missing reading (None) as NaN, which SQLite stores as NULL: CPython's sqlite3 binds
    a None through its adaptation lookup (~1 us a value on this machine, against ~0.06 us for a float), so bare
    executemany of rows with None measures that lookup more than SQLite (a serving row of mostly missing readings
    cost ~8x a GPU row). The writer never binds a None (literal NULLs per pattern, store/writer.py); this is the
    ceiling it is compared with."""
    return {k: [tuple(_NAN if v is None else v for v in r) for r in rs] for k, rs in rows.items()}


def _spread(xs: list[float]) -> str:
    return f"median {statistics.median(xs):,.0f}, spread {min(xs):,.0f}-{max(xs):,.0f}"


def _ingest(db: Path, raw_start: int, end: int, ticks: int, nvlink: bool) -> dict:
    """Write `ticks` ticks in PARTS timed parts, each followed by the same part as bare executemany into a
    second database of the same schema (the ceiling, measured under the same load moments later)."""
    pool = synthetic_gpu_rows(3600)
    nvl = synthetic_nvlink_rows(600) if nvlink else None
    hosts = [host_row(i) for i in range(60)]
    servs = [serving_row(i) for i in range(60)]
    # Each part is timed from its first submit until its last tick is committed (ingest), and until the
    # rollups it completes are written too (ingest with rollups); the machine is shared and noisy, so the
    # median part is the figure and the spread is reported. CPU seconds of the process (writer, checkpointer,
    # this submitting thread) give a rate that other processes' load disturbs far less.
    w = StoreWriter(db, queue_max=ticks + 10, clock=lambda: end / 1000)
    w.start()
    bare_db = db.with_name("bare.db")
    StoreWriter(bare_db).close()  # the same schema, page size and pragmas
    bare = connect_rw(bare_db, integrity=False)
    floor_db = db.with_name("sqlite_only.db")
    StoreWriter(floor_db).close()
    floor = connect_rw(floor_db, integrity=False)
    floor_rates, floor_cpu = [], []
    parts = [(k * ticks // PARTS, (k + 1) * ticks // PARTS) for k in range(PARTS)]
    rates, with_rollups, cpu_rates, bare_rates, bare_cpu = [], [], [], [], []
    nan_rates, nan_cpu = [], []
    bare_nan_db = db.with_name("bare_nan.db")
    StoreWriter(bare_nan_db).close()
    bare_nan = connect_rw(bare_nan_db, integrity=False)
    total_s = 0.0
    for lo, hi in parts:
        t, c = time.perf_counter(), time.process_time()
        for i in range(lo, hi):
            w.submit_tick(raw_start + i * 1000, pool[i % 3600], hosts[i % 60], servs[i % 60],
                          nvl[i % 600] if nvl else ())
        while w.stats()["written_ticks"] < hi:  # every tick committed (durable)
            _wait_drain(w)
        rates.append((hi - lo) * GPUS / (time.perf_counter() - t))
        _wait_rollups(w)  # and the derived rollups caught up
        part_s = time.perf_counter() - t
        total_s += part_s
        with_rollups.append((hi - lo) * GPUS / part_s)
        cpu_rates.append((hi - lo) * GPUS / (time.process_time() - c))
        bare_rows = _bare_rows(pool, hosts, servs, raw_start, lo, hi)
        c = time.process_time()
        bare_rates.append((hi - lo) * GPUS / _bare_part(bare, bare_rows, w.batch_max_ticks))
        bare_cpu.append((hi - lo) * GPUS / (time.process_time() - c))
        nan_rows = _nan_rows(bare_rows)
        c = time.process_time()
        nan_rates.append((hi - lo) * GPUS / _bare_part(bare_nan, nan_rows, w.batch_max_ticks))
        nan_cpu.append((hi - lo) * GPUS / (time.process_time() - c))
        wall, cpu = _sqlite_only_part(floor, bare_rows, w.batch_max_ticks)
        floor_rates.append((hi - lo) * GPUS / wall)
        floor_cpu.append((hi - lo) * GPUS / cpu)
    st = w.stats()
    w.close()
    bare.close()
    floor.close()
    same = _same_rows(bare_db, bare_nan_db)
    bare_nan.close()
    rows = ticks * GPUS
    ingest = statistics.median(rates)
    log(f"ingest: {rows} GPU rows in {PARTS} parts: committed {_spread(rates)} rows/s; with rollups caught up "
        f"{_spread(with_rollups)} rows/s ({rows / total_s:,.0f} over the whole run; per process CPU second "
        f"{_spread(cpu_rates)}); {st['tick_commits']} commits, dropped {st['dropped']}")
    log(f"bare executemany of the same rows into the same tables (the ceiling): {_spread(bare_rates)} rows/s "
        f"(per CPU second {_spread(bare_cpu)}); ingest with rollups / bare = "
        f"{statistics.median(with_rollups) / statistics.median(bare_rates):.2f} "
        f"(per CPU second {statistics.median(cpu_rates) / statistics.median(bare_cpu):.2f})")
    log(f"bare executemany with missing readings bound as NaN (stored NULL, no None adaptation): "
        f"{_spread(nan_rates)} rows/s (per CPU second {_spread(nan_cpu)}); ingest with rollups / that = "
        f"{statistics.median(cpu_rates) / statistics.median(nan_cpu):.2f} per CPU second; same rows stored: {same}")
    log(f"SQLite alone (INSERT ... SELECT of the same rows, no Python per value): {_spread(floor_rates)} rows/s "
        f"(per CPU second {_spread(floor_cpu)})")
    return {"ingest": ingest, "rows": rows, "total_s": total_s, "with_rollups": with_rollups,
            "cpu": cpu_rates, "bare": bare_rates, "bare_cpu": bare_cpu, "floor": floor_rates, "floor_cpu": floor_cpu,
            "bare_nan": nan_rates, "bare_nan_cpu": nan_cpu, "bare_nan_same": same}


def _same_rows(a: Path, b: Path) -> bool:
    """Whether two databases hold the same sample rows (NULL where one bound None and the other NaN)."""
    conn = sqlite3.connect(a)
    try:
        conn.execute("ATTACH DATABASE ? AS other", (str(b),))
        return all(conn.execute(f"SELECT (SELECT count(*) FROM main.{t}) = (SELECT count(*) FROM other.{t}) AND NOT "
                                f"EXISTS (SELECT * FROM main.{t} EXCEPT SELECT * FROM other.{t})").fetchone()[0]
                   for t in ("gpu_samples", "host_samples", "serving_samples"))
    finally:
        conn.close()


def _count(db: Path, sql: str, args: tuple = ()) -> int:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, args).fetchone()[0]
    finally:
        conn.close()


def _storage(db: Path, raw_start: int, ticks: int, nvlink: bool) -> dict:
    """Bytes per stored value: the raw table, plus the rollup bytes that come from this run's rows."""
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    raw_rows = (_count(db, "SELECT count(*) FROM gpu_samples")  # raw rows and compacted ones alike
                + _count(db, "SELECT coalesce(sum(rows), 0) FROM gpu_samples_chunks"))
    real_1m = _count(db, "SELECT count(*) FROM gpu_1m WHERE ts_ms >= ?", (raw_start,))
    real_1h = _count(db, "SELECT count(*) FROM gpu_1h WHERE ts_ms >= ?", (raw_start,))
    values = raw_rows * len(GPU_METRICS)
    raw_bytes = table_bytes(db, ["gpu_samples", "gpu_samples_chunks", "gpu_samples_chunks_start"])
    # rollup bytes attributable to this day: the tables' bytes pro rata to the rows that come from it
    n1m, n1h = _count(db, "SELECT count(*) FROM gpu_1m"), _count(db, "SELECT count(*) FROM gpu_1h")
    roll_bytes = (table_bytes(db, ["gpu_1m"]) * real_1m / max(1, n1m)
                  + table_bytes(db, ["gpu_1h"]) * real_1h / max(1, n1h))
    log(f"storage: gpu_samples {raw_bytes / values:.2f} B/value + rollups {roll_bytes / values:.2f} B/value "
        f"({raw_rows} rows x {len(GPU_METRICS)} metrics); file {db.stat().st_size / 1e6:.0f} MB")
    out = {"bpv": (raw_bytes + roll_bytes) / values, "raw_bpv": raw_bytes / values, "extra": {},
           "roll_bpv": roll_bytes / values}
    chunked = _count(db, "SELECT coalesce(sum(rows), 0) FROM gpu_samples_chunks") * len(GPU_METRICS)
    if chunked:  # the compacted history alone, as stored (page and index overhead included)
        out["chunk_bpv"] = table_bytes(db, ["gpu_samples_chunks", "gpu_samples_chunks_start"]) / chunked
    if nvlink:
        out["extra"]["nvlink_bytes_per_value"] = round(table_bytes(db, ["nvlink_samples"]) /
                                                       (ticks * GPUS * len(NVLINK_METRICS)), 2)
    return out


def _table_figures(db: Path) -> dict[str, float]:
    """Bytes per value of every sample table: its rows plus its chunks (and their index), over rows x metrics."""
    out = {}
    for table in COMPACTED:
        cols = _count(db, f"SELECT count(*) FROM pragma_table_info('{table}')")
        rows = (_count(db, f"SELECT count(*) FROM {table}")
                + _count(db, f"SELECT coalesce(sum(rows), 0) FROM {chunk_table(table)}"))
        key = 2 if table != "host_samples" and table != "serving_samples" else 1  # ts_ms (and gpu) are keys
        key += table == "gpu_processes"
        size = table_bytes(db, [table, chunk_table(table), f"{chunk_table(table)}_start"])
        if rows:
            out[table] = round(size / (rows * (cols - key)), 2)
    return out


def _compact(db: Path, tmp: Path, raw_start: int, end: int, before_csv: bytes) -> dict:
    """Compact every closed interval (none kept raw), then the figures, the export and the queries again."""
    conn = connect_rw(db)
    t = time.perf_counter()
    moved = 0
    while True:
        n, more = compact.step(conn, load_watermarks(conn), intervals=64, keep_raw_ms=0)
        moved += n
        if not more:
            break
    took = time.perf_counter() - t
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("VACUUM")  # the freed raw pages, which a live file reuses for new rows, out of the figure
    per_chunk = [size / (rows * len(GPU_METRICS)) for size, rows in
                 conn.execute("SELECT length(data), rows FROM gpu_samples_chunks")]
    conn.close()
    log(f"compaction: {moved} rows in {took:.1f} s ({moved / took:,.0f} rows/s)")
    r = StoreReader(db)
    out = tmp / "compacted.csv"
    with open(os.devnull, "w") as devnull:
        export_table(r, "gpu", "raw", raw_start, end, out, force=True, progress_stream=devnull)
    same = out.read_bytes() == before_csv
    q24, q30 = _queries(r, end)
    r.close()
    log(f"export after compaction identical to before: {same}")
    return {"per_chunk": per_chunk, "same": same, "q24": q24, "q30": q30, "rows_per_s": moved / took}


def _queries(r: StoreReader, end: int) -> tuple[float, float]:
    """Median time of the dashboard's 24-hour and 30-day GPU charts."""
    res24, rows24 = r.series("gpu", CHART_COLUMNS, end - DAY_MS, end)
    q24 = median_ms(lambda: r.series("gpu", CHART_COLUMNS, end - DAY_MS, end), 7)
    res30, rows30 = r.series("gpu", CHART_COLUMNS, end - 30 * DAY_MS, end)
    q30 = median_ms(lambda: r.series("gpu", CHART_COLUMNS, end - 30 * DAY_MS, end), 7)
    log(f"query 24 h: {res24}, {len(rows24)} rows, median {q24:.1f} ms; "
        f"30 d: {res30}, {len(rows30)} rows, median {q30:.1f} ms")
    return q24, q30


def _export(r: StoreReader, db: Path, tmp: Path, raw_start: int, end: int) -> tuple[float, bool]:
    """The same SELECT through our exporter and through the sqlite3 shell: (speed ratio, identical output)."""
    q = build_query("gpu", "raw", raw_start, end)
    ours = tmp / "ours.csv"
    t = time.perf_counter()
    with open(os.devnull, "w") as devnull:
        n_ours = export_table(r, "gpu", "raw", raw_start, end, ours, force=True, progress_stream=devnull)
    ours_s = time.perf_counter() - t
    sql = q.plain_sql.replace("?", str(raw_start), 1).replace("?", str(end), 1)
    theirs = tmp / "sqlite3.csv"
    sqlite3_bin = shutil.which("sqlite3") or "/usr/bin/sqlite3"
    t = time.perf_counter()
    with open(theirs, "w") as f:
        subprocess.run([sqlite3_bin, "-readonly", "-csv", "-header", str(db), sql], stdout=f, check=True,
                       timeout=600)
    theirs_s = time.perf_counter() - t
    with open(theirs, "rb") as f:
        n_theirs = sum(1 for _ in f) - 1
    ratio = (n_ours / ours_s) / (n_theirs / theirs_s)
    same = ours.read_bytes() == theirs.read_bytes().replace(b"\r\n", b"\n")
    log(f"export: ours {n_ours / ours_s:,.0f} rows/s, sqlite3 {n_theirs / theirs_s:,.0f} rows/s, "
        f"ratio {ratio:.2f}; identical output: {same}")
    return ratio, same


def _run(args: argparse.Namespace, tmp: Path) -> dict:
    db = tmp / "bench.db"
    for p in tmp.glob("bench.db*"):
        p.unlink()
    ticks = int(args.hours * 3600)
    now = int(time.time() * 1000)
    now -= now % 1000
    raw_start = now - ticks * 1000
    raw_start -= raw_start % HOUR_MS  # hour-aligned so synthetic and real rollups meet cleanly
    end = raw_start + ticks * 1000

    StoreWriter(db).close()
    t = time.perf_counter()
    n_roll = generate_rollups(db, end - 30 * DAY_MS, raw_start)
    with sqlite3.connect(db) as conn:  # start from a settled WAL, as a database in service would
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    log(f"generated {n_roll} synthetic rollup rows (29 days) in {time.perf_counter() - t:.1f} s")
    compact.KEEP_RAW_MS = 10 ** 15  # the writer compacts nothing during the ingest (its figures stay comparable)
    ing = _ingest(db, raw_start, end, ticks, args.nvlink)
    sto = _storage(db, raw_start, ticks, args.nvlink)
    tables_before = _table_figures(db)
    gc.collect()  # the generator's heap is not the dashboard's: keep GC passes out of the queries
    r = StoreReader(db)
    q24, q30 = _queries(r, end)
    ratio, same = _export(r, db, tmp, raw_start, end)
    r.close()
    cmp = _compact(db, tmp, raw_start, end, (tmp / "ours.csv").read_bytes())
    sto_after = _storage(db, raw_start, ticks, args.nvlink)
    tables_after = _table_figures(db)
    result = {
        "ingest_rows_per_s": round(ing["ingest"]),
        "bytes_per_value": round(sto_after["chunk_bpv"] + sto_after["roll_bpv"], 2),
        "query_24h_ms": round(q24, 1),
        "query_30d_ms": round(q30, 1),
        "export_ratio_vs_sqlite3": round(ratio, 2),
        **sto["extra"],
        "raw_bytes_per_value": round(sto_after["chunk_bpv"], 2),
        "raw_bytes_per_value_whole_table": round(sto_after["raw_bpv"], 2),  # with the not yet closed rows
        "raw_bytes_per_value_chunks": {"median": round(statistics.median(cmp["per_chunk"]), 3),
                                       "spread": [round(min(cmp["per_chunk"]), 3), round(max(cmp["per_chunk"]), 3)]},
        "uncompacted_bytes_per_value": round(sto["bpv"], 2),
        "uncompacted_raw_bytes_per_value": round(sto["raw_bpv"], 2),
        "tables_bytes_per_value": {"before": tables_before, "after": tables_after},
        "compaction_rows_per_s": round(cmp["rows_per_s"]),
        "query_24h_ms_after": round(cmp["q24"], 1),
        "query_30d_ms_after": round(cmp["q30"], 1),
        "export_identical_after_compaction": cmp["same"],
        "ingest_with_rollups_rows_per_s": round(statistics.median(ing["with_rollups"])),
        "ingest_with_rollups_spread": [round(min(ing["with_rollups"])), round(max(ing["with_rollups"]))],
        "ingest_with_rollups_cpu_rows_per_s": round(statistics.median(ing["cpu"])),
        "bare_executemany_rows_per_s": round(statistics.median(ing["bare"])),
        "bare_executemany_spread": [round(min(ing["bare"])), round(max(ing["bare"]))],
        "ingest_with_rollups_vs_bare": round(statistics.median(ing["with_rollups"]) / statistics.median(ing["bare"]),
                                             2),
        "bare_executemany_cpu_rows_per_s": round(statistics.median(ing["bare_cpu"])),
        "ingest_with_rollups_vs_bare_cpu": round(statistics.median(ing["cpu"]) / statistics.median(ing["bare_cpu"]),
                                                 2),
        # the same with missing readings bound as NaN (stored NULL): CPython's None adaptation left out
        "bare_nan_executemany_rows_per_s": round(statistics.median(ing["bare_nan"])),
        "bare_nan_executemany_cpu_rows_per_s": round(statistics.median(ing["bare_nan_cpu"])),
        "ingest_with_rollups_vs_bare_nan_cpu": round(statistics.median(ing["cpu"])
                                                     / statistics.median(ing["bare_nan_cpu"]), 2),
        "bare_nan_same_rows": ing["bare_nan_same"],
        # SQLite alone moving the same rows (no Python binding): the floor of any way into SQLite
        "sqlite_only_rows_per_s": round(statistics.median(ing["floor"])),
        "sqlite_only_cpu_rows_per_s": round(statistics.median(ing["floor_cpu"])),
        "ingest_with_rollups_vs_sqlite_only_cpu": round(statistics.median(ing["cpu"])
                                                        / statistics.median(ing["floor_cpu"]), 2),
        "hours_raw": args.hours,
        "gpu_rows": ing["rows"],
        "export_identical_to_sqlite3": same,
    }
    result["meets_targets"] = (result["ingest_rows_per_s"] >= TARGETS["ingest_rows_per_s"]
                               and (result["ingest_with_rollups_rows_per_s"]
                                    >= TARGETS["ingest_with_rollups_rows_per_s"])
                               and result["bytes_per_value"] <= TARGETS["bytes_per_value"]
                               and result["raw_bytes_per_value"] <= TARGETS["raw_bytes_per_value"]
                               and result["query_30d_ms_after"] <= TARGETS["query_30d_ms"]
                               and result["query_24h_ms"] <= TARGETS["query_24h_ms"]
                               and result["query_30d_ms"] <= TARGETS["query_30d_ms"]
                               and result["export_ratio_vs_sqlite3"] >= TARGETS["export_ratio_vs_sqlite3"])
    return result


def main() -> int:
    args = _args()
    tmp = Path(args.keep or tempfile.mkdtemp(prefix="lynxtop-bench-store-"))
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        result = _run(args, tmp)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
