"""The writer's plain GPU statements (session 25): a statement whose values are all ints in [0, 2**52) (what the
GPU sampler makes: agent/gpu/readers.py rounds its power to whole watts) is bound without the rounding expression;
"no value below 0" is now checked by an array of C unsigned longs instead of min() (`_unsigned`). Any value that
breaks that (a negative or huge int, a sum reaching 2**52, a float, a None, text) sends the statement down the
rounding path it took before. Either way every value lands as a one-row INSERT of the same row lands it (type and
repr compared); which path a statement took is read from SQLite's trace callback, not timed.
"""

from __future__ import annotations

import random
import re
import sqlite3

import pytest

from lynxtop.store import writer as writer_mod
from lynxtop.store.schema import SAMPLE_TABLES
from lynxtop.store.writer import StoreWriter, _insert_sql

from .helpers import T0, gpu_row

TABLE = SAMPLE_TABLES["gpu"]
COLS = [m[0] for m in TABLE.metrics]


def _int_row(g: int, i: int, rng: random.Random) -> dict:
    """gpu_row's readings as the sampler makes them: every number a whole one."""
    return {k: round(v) if isinstance(v, float) else v for k, v in gpu_row(g, i, rng).items()}


def _ticks(n: int, rng: random.Random) -> list[tuple[int, list[dict]]]:
    return [(T0 + i * 1_000, [_int_row(g, i, rng) for g in range(8)]) for i in range(n)]


def _write(db, ticks: list[tuple[int, list[dict]]]) -> list[str]:
    """The ticks in one transaction (one 16-row GPU statement for 2 ticks); the GPU INSERTs executed."""
    w = StoreWriter(db, queue_max=1000, clock=lambda: (T0 + 600_000) / 1000)
    executed: list[str] = []
    w.conn.set_trace_callback(executed.append)
    for ts, rows in ticks:
        w.submit_tick(ts, rows)
    with w._inline_lock:
        pending = list(w._ticks)
        w._ticks.clear()
        assert w._write_ticks(pending)
    w.conn.set_trace_callback(None)
    assert w.stats()["rejected"] == 0
    w.close()
    return [s for s in executed if s.startswith(f"INSERT OR REPLACE INTO {TABLE.name} ")]


def _same_as_one_row_inserts(tmp_path, db, ticks: list[tuple[int, list[dict]]]) -> None:
    StoreWriter(tmp_path / "one.db").close()
    ref = sqlite3.connect(tmp_path / "one.db")
    sql = _insert_sql(TABLE.name, TABLE.key, TABLE.metrics)  # one row, every reading rounded (and +-Inf nulled)
    with ref:
        for ts, rows in ticks:
            for r in rows:
                ref.execute(sql, [ts, r["gpu"], *(r.get(c) for c in COLS)])
    got = sqlite3.connect(db)
    try:
        want = ref.execute(f"SELECT * FROM {TABLE.name} ORDER BY 1, 2").fetchall()
        have = got.execute(f"SELECT * FROM {TABLE.name} ORDER BY 1, 2").fetchall()
        assert len(have) == len(want) == sum(len(rows) for _, rows in ticks)
        for a, b in zip(have, want, strict=True):
            assert [(type(v), repr(v)) for v in a] == [(type(v), repr(v)) for v in b], (a, b)
    finally:
        got.close()
        ref.close()


# (tick, gpu, column, value) put into the rows; whether the statement may still be bound plainly
BREAKS = {
    "whole numbers, as the sampler makes them": ([], True),
    "a bool among them (an int)": ([(1, 4, "ecc_corrected", True)], True),
    "a negative int": ([(1, 2, "util_gpu_pct", -3)], False),  # rounding stores -2: never bound plainly
    "a negative int the others' sum hides": ([(0, 0, "throttle_reasons", -(10**9))], False),
    "an int at 2**52": ([(0, 7, "energy_j", 2**52)], False),
    "a sum reaching 2**52": ([(0, 7, "energy_j", 2**52 - 1)], False),
    "a float": ([(1, 6, "temp_c", 41.5)], False),
    "an infinity": ([(1, 3, "power_w", float("inf"))], False),  # stored NULL
}


@pytest.mark.parametrize("case", list(BREAKS))
def test_a_plain_statement_only_where_every_value_is_an_int_in_range(tmp_path, case):
    puts, plain = BREAKS[case]
    ticks = _ticks(2, random.Random(7))
    for i, g, col, value in puts:
        ticks[i][1][g][col] = value
    db = tmp_path / "w.db"
    executed = _write(db, ticks)
    assert executed, "no GPU statement was traced"
    assert all(("CAST(" not in s) == plain for s in executed), (case, [len(re.findall("CAST", s)) for s in executed])
    _same_as_one_row_inserts(tmp_path, db, ticks)


def test_unsigned_says_no_value_is_below_zero_or_past_a_c_long():
    assert writer_mod._unsigned([0, 1, 2**52 - 1, True, False])
    assert not writer_mod._unsigned([5, -1])
    assert not writer_mod._unsigned([2**70, 1])
    assert not writer_mod._unsigned([1.5])  # not an int: the rounding path
