"""What the writer carries over when the database path stops naming the file it has open.

An `rm` of the live database, or a backup restored over it with `mv`, leaves the writer's connection on a
file nobody else sees: every commit after that vanishes when the agent stops. The writer notices within
seconds (store/inproc.py main_file_change), and everything it committed since it last saw the path name its
file is read here from the old file (still readable through the open connection) and written into the file the
path names now. History from before that moment stays where the operator put it (gone, or in the moved file).

The marks are taken on every check, so "since" is exact for rows with an id (events, runs, bench results) and
for ticks (written in order, on the agent's monotonic timeline).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Any

from lynxtop.store.schema import SAMPLE_TABLES

_BY_ID = ("events", "runs", "bench_results")  # rows are appended with growing ids
_BY_TS = (*(t.name for t in SAMPLE_TABLES.values()), "gpu_processes")  # keyed by the tick's timestamp


@dataclass
class Marks:
    """The newest row of each table when the path was last seen to name the writer's file."""

    ids: dict[str, int] = field(default_factory=dict)
    tick_ts: int | None = None

    @classmethod
    def take(cls, conn: sqlite3.Connection, tick_ts: int | None) -> Marks:
        """`tick_ts`: the newest tick this writer committed (None: none yet, the file's newest is taken)."""
        if tick_ts is None:
            tops = [conn.execute(f"SELECT MAX(ts_ms) FROM {t}").fetchone()[0] for t in _BY_TS]
            tick_ts = max((t for t in tops if t is not None), default=None)
        return cls({t: conn.execute(f"SELECT COALESCE(MAX(id), 0) FROM {t}").fetchone()[0] for t in _BY_ID},
                   tick_ts)


@dataclass
class Carried:
    """Rows read from the old file, by table: (column names, rows)."""

    tables: dict[str, tuple[list[str], list[tuple[Any, ...]]]] = field(default_factory=dict)

    def count(self) -> int:
        return sum(len(rows) for _, rows in self.tables.values())


def _read(conn: sqlite3.Connection, table: str, where: str, params: tuple[Any, ...]) -> tuple[list[str], list]:
    cur = conn.execute(f"SELECT * FROM {table} WHERE {where}", params)
    return [d[0] for d in cur.description], cur.fetchall()


def read_since(conn: sqlite3.Connection, marks: Marks) -> Carried:
    """Everything committed after `marks`, the runs still open and the GPUs' facts (a few rows each)."""
    out = Carried()
    for t in _BY_ID:
        where = "id > ?" + (" OR ended_ms IS NULL" if t == "runs" else "")  # the live run's row, whatever its id
        out.tables[t] = _read(conn, t, where, (marks.ids.get(t, 0),))
    for t in _BY_TS:
        out.tables[t] = _read(conn, t, "ts_ms > ?", (marks.tick_ts if marks.tick_ts is not None else -(2**62),))
    out.tables["gpus"] = _read(conn, "gpus", "1", ())
    return out


def write(conn: sqlite3.Connection, carried: Carried) -> int:
    """Insert the carried rows into the new file in one transaction; rows it already has are kept as they are.

    Events and bench results get new ids (a restored backup has its own); runs keep theirs (samples name them).
    """
    n = 0
    conn.execute("BEGIN IMMEDIATE")
    try:
        for table, (cols, rows) in carried.tables.items():
            if not rows:
                continue
            keep = [i for i, c in enumerate(cols) if not (c == "id" and table in ("events", "bench_results"))]
            names = [cols[i] for i in keep]
            sql = (f"INSERT OR IGNORE INTO {table} ({', '.join(names)}) "
                   f"VALUES ({', '.join('?' * len(names))})")
            n += conn.executemany(sql, [tuple(r[i] for i in keep) for r in rows]).rowcount
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return n
