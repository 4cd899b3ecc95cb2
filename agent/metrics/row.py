"""The `serving` row a scrape hands to the writer (contract/columns.py), and the per-engine loads the status shows.

Owns the fit of page values to their columns: an INTEGER column gets a count in int64, a REAL one a finite
number, a percentage 0-100; anything else becomes NULL and is named, so the caller can count it as no reading.
"""

from __future__ import annotations

import math
import operator
from functools import partial
from typing import Any

from lynxtop.agent.metrics.page import HUGE, picker
from lynxtop.contract.columns import SERVING_METRICS, names

SERVING_COLUMNS = names(SERVING_METRICS)


def empty_row() -> dict[str, Any]:
    return {c: None for c in SERVING_COLUMNS}


def engine_loads(per: dict[str, dict[str, float]]) -> tuple[list[dict[str, Any]], int]:
    """The status' per-engine load, engines in numeric order ("10" after "9"), each value checked as its column
    is (`checked`: a count in int64, a percentage 0-100, else None); and how many were no reading. `deferred` (the
    waiting requests vLLM defers: the hang rule's, agent/serving/health.py) only where the page has it.

    One pass per engine, no row dict and `checked` call each: DP=8 pages give 8 engines a scrape."""
    out: list[dict[str, Any]] = []
    bad = 0
    for e in sorted(per, key=_engine_order):
        v = per[e]
        running, waiting, kv = v.get("running"), v.get("waiting"), v.get("kv_usage")
        if running is not None:
            running = _as_int(running)
            bad += running is None
        if waiting is not None:
            waiting = _as_int(waiting)
            bad += waiting is None
        if kv is not None:
            kv = 100.0 * kv
            if not 0.0 <= kv <= 100.0:  # NaN fails the comparison too; infinities are out of range
                kv = None
                bad += 1
        load = {"engine": e, "running": running, "waiting": waiting, "kv_cache_usage_pct": kv}
        if "deferred" in v:  # only where the page splits its waiting requests by reason (vLLM 0.12+)
            load["deferred"] = deferred = _as_int(v["deferred"])
            bad += deferred is None
        out.append(load)
    return out, bad


def _engine_order(e: str) -> tuple[int, str]:
    # ASCII digits only: "²" and other Unicode digits pass isdigit() but int() refuses them
    return (int(e[:18]), e) if e.isascii() and e.isdigit() else (1 << 63, e)


def _as_int(v: float | None) -> int | None:
    """A count as the store keeps it (INTEGER: int64); None for no reading, a non-finite or out-of-range one."""
    if v is None or not 0.0 <= v < HUGE:  # NaN fails the comparison too
        return None
    return int(round(v))


_OURS = frozenset(("run_id", "scrape_ok", "scrape_errors"))  # the agent's own columns, not the page's
_INT_COLUMNS = frozenset(n for n, typ, _ in SERVING_METRICS if typ == "INTEGER")


_PAGE_INTS = tuple(c for c in SERVING_COLUMNS if c in _INT_COLUMNS and c not in _OURS)
_PAGE_PCTS = tuple(c for c in SERVING_COLUMNS if c not in _INT_COLUMNS and c not in _OURS and c.endswith("_pct"))
_PAGE_REALS = tuple(c for c in SERVING_COLUMNS if c not in _INT_COLUMNS and c not in _OURS and not c.endswith("_pct"))


_ints, _pcts, _reals = picker(_PAGE_INTS), picker(_PAGE_PCTS), picker(_PAGE_REALS)
_given = partial(operator.is_not, None)  # a value, not a column left empty (kept None, never bad)


def checked(row: dict[str, Any]) -> list[str]:
    """Make a row's page values fit their columns (contract/columns.py): an INTEGER one a count in int64, a
    REAL one finite, a percentage 0-100; any other becomes NULL. Returns the columns that did not fit.

    A whole row whose values all fit (every scrape of a steady server) is checked with a few C passes over its
    columns, no Python step per column, REAL columns left empty included (a server without speculative decoding:
    every scrape); any other row takes the column-by-column check."""
    if len(row) == len(SERVING_COLUMNS):
        try:
            ints, pcts, reals = _ints(row), tuple(filter(_given, _pcts(row))), tuple(filter(_given, _reals(row)))
            # NaN and infinities carry into the sum of magnitudes; None raises TypeError
            if (sum(map(abs, ints + pcts + reals)) < math.inf and min(ints, default=0.0) >= 0.0
                    and max(ints, default=0.0) < HUGE and min(pcts, default=0.0) >= 0.0
                    and max(pcts, default=0.0) <= 100.0):
                row.update(zip(_PAGE_INTS, map(round, ints), strict=True))  # round(x): int(round(x)), an int
                return []
        except (KeyError, TypeError, OverflowError):
            pass
    return _checked_each(row)


def _checked_each(row: dict[str, Any]) -> list[str]:
    """`checked`, column by column (any row: a few columns, a missing one, one that does not fit)."""
    bad: list[str] = []
    for col, v in row.items():
        if v is None or col in _OURS:
            continue
        if col in _INT_COLUMNS:
            row[col] = _as_int(v)
            ok = row[col] is not None
        else:
            ok = math.isfinite(v) and (not col.endswith("_pct") or 0.0 <= v <= 100.0)
            if not ok:
                row[col] = None
        if not ok:
            bad.append(col)
    return bad
