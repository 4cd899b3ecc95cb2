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
