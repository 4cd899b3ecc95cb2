"""Ways into SQLite for the writer's rows, side by side in one run: CPU seconds per GPU row (issue 29.2).

The same ticks as benchmarks/store.py (8 GPU rows, a host and a serving row each, prepared as tuples in table
column order) go into a fresh database of the store's schema, one transaction per 1000 ticks, by:
  bare        plain executemany, one row per execution (store.py's ceiling); None bound by the driver
  writer      store/writer.py's path: rows grouped by NULL pattern, 128 rows a statement, INTEGERs rounded
  values      128 rows a statement as a plain VALUES list (no rounding, None bound by the driver)
  json_each   one statement per table and batch, the rows passed as ONE JSON text and expanded in SQLite
              (INSERT ... SELECT value->>0, ... FROM json_each(?)): one bound value instead of ~40 a row
  sqlite_only INSERT ... SELECT from temporary tables holding the same rows: no Python per value at all
  apsw        apsw's executemany (a driver that binds in C, with its own SQLite) of the same plain statement,
              one row per execution; apsw_values the same 128 rows a statement. Only when apsw is importable
              (it is not a dependency: `pip install --target DIR apsw` and PYTHONPATH=DIR); the schema is
              made by the store's sqlite3 and that connection closed before apsw opens the file (two SQLite
              copies in one process must never hold one file open together: sqlite.org/howtocorrupt.html)
Rounds alternate the ways (the machine is shared); the median round per way is printed, then one JSON line.
Usage: python benchmarks/insert_ways.py [--ticks 3000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from itertools import chain
from pathlib import Path

import _support  # noqa: F401 - tests/ on sys.path

from lynxtop.contract.columns import GPU_METRICS, HOST_METRICS, SERVING_METRICS, names
from lynxtop.store import writer
from lynxtop.store.schema import BUSY_TIMEOUT_MS, CACHE_KIB, SAMPLE_TABLES, connect_rw
from store import GPUS, host_row, serving_row, synthetic_gpu_rows

TABLES = {"gpu": "gpu_samples", "host": "host_samples", "serving": "serving_samples"}
BATCH = 1000  # ticks a transaction, as the writer's batch_max_ticks
PER = 128  # rows a statement, as writer.ROWS_PER_INSERT

Rows = dict[str, list[tuple]]


def make_rows(ticks: int) -> Rows:
    pool = synthetic_gpu_rows(600)
    hosts, servs = [host_row(i) for i in range(60)], [serving_row(i) for i in range(60)]
    gcols, hcols, scols = ["gpu", *names(GPU_METRICS)], names(HOST_METRICS), names(SERVING_METRICS)
    out: Rows = {"gpu": [], "host": [], "serving": []}
    for i in range(ticks):
        ts = 1_700_000_000_000 + i * 1000
        out["gpu"] += [(ts, *(r.get(c) for c in gcols)) for r in pool[i % 600]]
        out["host"].append((ts, *(hosts[i % 60].get(c) for c in hcols)))
        out["serving"].append((ts, *(servs[i % 60].get(c) for c in scols)))
    return out


def _cols(kind: str) -> list[str]:
    t = SAMPLE_TABLES[kind]
    return [*t.key, *(m[0] for m in t.metrics)]


def _plain_sql(kind: str, rows: int = 1) -> str:
    row = f"({', '.join('?' * len(_cols(kind)))})"
    return f"INSERT INTO {TABLES[kind]} ({', '.join(_cols(kind))}) VALUES {', '.join([row] * rows)}"


def _json_sql(kind: str) -> str:
    return (f"INSERT INTO {TABLES[kind]} ({', '.join(_cols(kind))}) "
            f"SELECT {', '.join(f'value->>{i}' for i in range(len(_cols(kind))))} FROM json_each(?)")


def bare(c, kind: str, rows: list[tuple]) -> None:
    c.executemany(_plain_sql(kind), rows)


def through_writer(c, kind: str, rows: list[tuple]) -> None:
    writer._executemany_tick_rows(c, kind, rows)


def values(c, kind: str, rows: list[tuple]) -> None:
    n = len(rows) - len(rows) % PER
    c.executemany(_plain_sql(kind, PER), [tuple(chain.from_iterable(rows[i:i + PER])) for i in range(0, n, PER)])
    if n < len(rows):
        c.executemany(_plain_sql(kind), rows[n:])


_DUMPS = json.JSONEncoder(separators=(",", ":")).encode


def json_each(c, kind: str, rows: list[tuple]) -> None:
    c.execute(_json_sql(kind), (_DUMPS(rows),))


WAYS: dict[str, Callable] = {"bare": bare, "writer": through_writer, "values": values, "json_each": json_each}

try:
    import apsw
except ImportError:  # optional: measured only where installed
    apsw = None


def _apsw_connect(db: Path):
    """The store's schema and pragmas made by sqlite3 (closed), then the file opened by apsw alone."""
    connect_rw(db, integrity=False).close()
    c = apsw.Connection(str(db))
    for pragma in (f"busy_timeout = {BUSY_TIMEOUT_MS}", "synchronous = NORMAL", f"cache_size = -{CACHE_KIB}",
                   "temp_store = MEMORY"):
        c.execute(f"PRAGMA {pragma}")
    if c.execute("PRAGMA journal_mode").fetchall()[0][0] != "wal":
        raise SystemExit("apsw: the file is not in WAL mode")
    return c


def _apsw_bare(c, kind: str, rows: list[tuple]) -> None:
    c.executemany(_plain_sql(kind), rows)


APSW_WAYS: dict[str, Callable] = {"apsw": _apsw_bare, "apsw_values": values} if apsw is not None else {}


def run_way(db: Path, way: str, rows: Rows) -> float:
    """CPU seconds to store `rows`, one transaction per BATCH ticks."""
    c = _apsw_connect(db) if way in APSW_WAYS else connect_rw(db, integrity=False)
    try:
        ticks = len(rows["host"])
        if way == "sqlite_only":
            for kind, table in TABLES.items():  # untimed: the rows are in SQLite before the clock starts
                c.execute(f"CREATE TEMP TABLE src_{kind} AS SELECT * FROM main.{table} LIMIT 0")
                c.executemany(f"INSERT INTO temp.src_{kind} VALUES ({', '.join('?' * len(rows[kind][0]))})",
                              rows[kind])
        t = time.process_time()
        for lo in range(0, ticks, BATCH):
            c.execute("BEGIN IMMEDIATE")
            for kind, table in TABLES.items():
                per = GPUS if kind == "gpu" else 1
                if way == "sqlite_only":
                    c.execute(f"INSERT INTO main.{table} SELECT * FROM temp.src_{kind} WHERE rowid > ? AND rowid <= ?",
                              (lo * per, (lo + BATCH) * per))
                else:
                    {**WAYS, **APSW_WAYS}[way](c, kind, rows[kind][lo * per:(lo + BATCH) * per])
            c.execute("COMMIT")
        cpu = time.process_time() - t
        stored = next(iter(c.execute("SELECT count(*) FROM gpu_samples")))[0]
        if stored != len(rows["gpu"]):
            raise SystemExit(f"{way}: stored {stored} GPU rows of {len(rows['gpu'])}")
        return cpu
    finally:
        c.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ticks", type=int, default=3000, help="ticks per way and round (8 GPU rows each)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows = make_rows(args.ticks)
    ways = [*WAYS, "sqlite_only", *APSW_WAYS]
    if not APSW_WAYS:
        print("apsw is not importable: its ways are left out", file=sys.stderr)
    rates: dict[str, list[float]] = {w: [] for w in ways}
    with tempfile.TemporaryDirectory(prefix="lynxtop-insert-ways-") as tmp:
        for r in range(args.rounds):
            for way in ways:
                cpu = run_way(Path(tmp) / f"{way}-{r}.db", way, rows)
                rates[way].append(len(rows["gpu"]) / cpu)
                print(f"round {r} {way:12s} {rates[way][-1]:10,.0f} GPU rows per CPU second", file=sys.stderr)
    out = {f"{w}_cpu_rows_per_s": round(statistics.median(v)) for w, v in rates.items()}
    out.update({f"{w}_vs_bare": round(statistics.median(rates[w]) / statistics.median(rates["bare"]), 2)
                for w in ways if w != "bare"})
    out.update(ticks=args.ticks, rounds=args.rounds, gpus=GPUS)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
