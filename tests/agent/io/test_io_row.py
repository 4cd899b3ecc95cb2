"""The serving row's fit to its columns (agent/metrics/row.py): a whole row that fits is checked without a Python
step per column, and every row, fitting or not, comes out as the column-by-column check makes it."""

from __future__ import annotations

import math
import random
import sys

from lynxtop.agent.metrics import row as row_mod
from lynxtop.agent.metrics.row import SERVING_COLUMNS, checked, empty_row

_ODD = [None, math.nan, math.inf, -math.inf, -1.0, -0.0, 0, 0.0, 0.5, 2.5, 3.5, 99.99, 100.0, 100.5, 150.0, 7,
        1e18, 2.0 ** 63, 2.0 ** 63 - 1024, 1e308, 10 ** 30, 123456.789]
_FINE = [0, 0.0, 0.5, 2.5, 3.5, 17.0, 99.99, 100.0, 7, 1e6]


def _row(rng: random.Random, values: list) -> dict:
    row = empty_row()
    for col in SERVING_COLUMNS:
        row[col] = rng.choice(values)
    row["run_id"], row["scrape_ok"], row["scrape_errors"] = None, 1, 0
    return row


def _each(row: dict) -> tuple[dict, list[str]]:
    row = dict(row)
    bad = row_mod._checked_each(row)
    return row, bad


def _same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    assert [(type(v), repr(v)) for v in a.values()] == [(type(v), repr(v)) for v in b.values()]


def test_every_row_comes_out_as_the_column_by_column_check_makes_it():
    rng = random.Random(29)
    for values in (_ODD, _FINE, _FINE + [math.nan], _FINE + [None], _FINE + [150.0], _FINE + [-1.0]):
        for _ in range(400):
            row = _row(rng, values)
            want, want_bad = _each(row)
            bad = checked(row)
            assert bad == want_bad
            _same(row, want)
    engine = {"requests_running": 3.0, "requests_waiting": None, "kv_cache_usage_pct": 120.0}  # not a whole row
    want, want_bad = _each(engine)
    assert checked(engine) == want_bad == ["kv_cache_usage_pct"]
    _same(engine, want)


def test_a_whole_row_that_fits_is_checked_without_a_python_step_per_column():
    """The old check called a Python function for every INTEGER column and tested each column in Python."""
    row = _row(random.Random(3), _FINE)
    calls = [0]

    def count(frame, event, arg):
        if event == "call":
            calls[0] += 1

    sys.setprofile(count)
    try:
        bad = checked(row)
    finally:
        sys.setprofile(None)
    assert bad == []
    assert calls[0] == 1  # `checked` itself
    assert all(type(row[c]) is int for c in row_mod._PAGE_INTS)


def test_a_whole_row_with_empty_real_columns_is_checked_without_a_python_step_per_column():
    """A server without speculative decoding leaves its acceptance percentage empty every scrape: such a row took
    the column-by-column check (a Python step per column); its REAL columns left empty stay None, never bad."""
    row = _row(random.Random(5), _FINE)
    empty = [*row_mod._PAGE_PCTS[:1], *row_mod._PAGE_REALS[:2]]
    for c in empty:
        row[c] = None
    want, want_bad = _each(row)
    calls = [0]

    def count(frame, event, arg):
        if event == "call":
            calls[0] += 1

    sys.setprofile(count)
    try:
        bad = checked(row)
    finally:
        sys.setprofile(None)
    assert bad == want_bad == []
    assert calls[0] == 1  # `checked` itself
    _same(row, want)
    assert all(row[c] is None for c in empty) and all(type(row[c]) is int for c in row_mod._PAGE_INTS)


def _engine_loads_by_rows(per: dict) -> tuple[list[dict], int]:
    """The per-engine loads as each engine's row through the column-by-column check makes them (the old way)."""
    def order(e: str) -> tuple[int, str]:
        return (int(e[:18]), e) if e.isdigit() else (1 << 63, e)

    out, bad = [], 0
    for e, v in sorted(per.items(), key=lambda kv: order(kv[0])):
        row = {"requests_running": v.get("running"), "requests_waiting": v.get("waiting"),
               "kv_cache_usage_pct": None if v.get("kv_usage") is None else 100.0 * v["kv_usage"]}
        bad += len(row_mod._checked_each(row))
        out.append({"engine": e, "running": row["requests_running"], "waiting": row["requests_waiting"],
                    "kv_cache_usage_pct": row["kv_cache_usage_pct"]})
    return out, bad


def test_engine_loads_come_out_as_each_engines_row_checked_column_by_column():
    rng = random.Random(293)
    kv_odd = [None, math.nan, math.inf, -math.inf, -0.01, -0.0, 0.0, 0.25, 0.999, 1.0, 1.0000001, 2.0, 1e308]
    names = ["0", "1", "2", "9", "10", "11", "a", "", "007", "99999999999999999999999", "x1"]
    for _ in range(500):
        per = {}
        for e in rng.sample(names, rng.randint(0, len(names))):
            per[e] = {k: rng.choice(vals) for k, vals in (("running", _ODD), ("waiting", _ODD),
                                                           ("kv_usage", kv_odd)) if rng.random() < 0.9}
        got, want = row_mod.engine_loads(per), _engine_loads_by_rows(per)
        assert got[1] == want[1]
        assert len(got[0]) == len(want[0])
        for a, b in zip(got[0], want[0], strict=True):
            _same(a, b)
