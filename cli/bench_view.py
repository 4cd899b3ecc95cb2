"""What `lynxtop bench` prints: the per-level table, an ASCII chart of throughput and p99 latency against the
level, and `bench compare`'s side-by-side table with differences in percent. Plain text, so it reads the same
in a terminal, a CI log and a pasted issue.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from lynxtop.contract.change import RULE, change_pct
from lynxtop.contract.format import fmt_ms
from lynxtop.contract.terminal import terminal_safe

COLUMNS = (  # header, key, format
    ("level", "level", "{}"), ("ok", "completed", "{}"), ("fail", "failed", "{}"),
    ("req/s", "request_throughput", "{:.2f}"), ("out tok/s", "output_throughput", "{:.1f}"),
    ("total tok/s", "total_token_throughput", "{:.1f}"), ("goodput", "request_goodput", "{:.2f}"),
    ("TTFT mean", "mean_ttft_ms", "ms"), ("p50", "median_ttft_ms", "ms"), ("p90", "p90_ttft_ms", "ms"),
    ("p99", "p99_ttft_ms", "ms"), ("TPOT mean", "mean_tpot_ms", "ms"), ("p99", "p99_tpot_ms", "ms"),
    ("ITL mean", "mean_itl_ms", "ms"), ("p99", "p99_itl_ms", "ms"), ("e2e p99", "p99_e2el_ms", "ms"),
)


def level_label(s: dict[str, Any]) -> str:
    rate = s.get("request_rate")
    label = str(s.get("max_concurrency")) if rate in (None, "inf") else f"{rate:g}/s"
    return label + (" *" if s.get("partial") else "")


def _cell(s: dict[str, Any], key: str, fmt: str) -> str:
    v = level_label(s) if key == "level" else s.get(key)
    if v is None:
        return "-"
    if fmt == "ms":
        return fmt_ms(v)
    return fmt.format(v)


def _grid(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))  # noqa: E731
    return [line(head), "  ".join("-" * w for w in widths), *(line(r) for r in rows)]


def table(levels: Sequence[dict[str, Any]]) -> str:
    """One row per level; `*` marks a partial level, failure reasons follow the table."""
    rows = [[_cell(s, key, fmt) for _, key, fmt in COLUMNS] for s in levels]
    out = _grid([h for h, _, _ in COLUMNS], rows)
    for s in levels:
        for reason, n in (s.get("failures") or {}).items():
            out.append(f"  {level_label(s)}: {n} failed: {terminal_safe(reason)}")  # the server's words
    if any(s.get("partial") for s in levels):
        out.append("  * partial: the level was stopped before it finished")
    return "\n".join(out)


def chart(levels: Sequence[dict[str, Any]], width: int = 40) -> str:
    """Output throughput (#) and p99 e2e latency (=) per level, each scaled to its own maximum."""
    if not levels:
        return ""
    tp = [_finite(s.get("output_throughput")) for s in levels]
    lat = [_finite(s.get("p99_e2el_ms")) for s in levels]
    top_tp, top_lat = max(tp) or 1.0, max(lat) or 1.0
    lines = [f"{'level':>7}  {'output tokens/s':<{width}}  p99 latency (e2e)"]
    for s, t, la in zip(levels, tp, lat, strict=True):
        bar_t = "#" * max(round(t / top_tp * width), 1 if t else 0)
        bar_l = "=" * max(round(la / top_lat * width // 2), 1 if la else 0)
        lines.append(f"{level_label(s):>7}  {bar_t:<{width}} {t:9.1f}  {bar_l} {fmt_ms(la) if la else '-'}")
    return "\n".join(lines)


def _finite(v: Any) -> float:
    """A bar's length: a finite number >= 0, else 0 (a NaN or an inf in a stored level must not end the report
    after the sweep ran; the reader checks the server's numbers, this is the last guard)."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < 2**63 or not math.isfinite(v):
        return 0.0
    return float(v)


COMPARE_KEYS = (
    ("out tok/s", "output_throughput", True), ("req/s", "request_throughput", True),
    ("TTFT p50", "median_ttft_ms", False), ("TTFT p99", "p99_ttft_ms", False),
    ("TPOT p50", "median_tpot_ms", False), ("TPOT p99", "p99_tpot_ms", False),
    ("ITL p99", "p99_itl_ms", False),
)


def pct(a: float | None, b: float | None, n_a: int | None = None, n_b: int | None = None) -> str:
    """B against A in percent (+ is more), or why there is none (contract/change.py): a level's p99 over a
    handful of requests is its slowest one, and "+2848%" from four requests on each side meant nothing."""
    return change_pct(a, b, n_a, n_b)


def _num(v: Any, key: str) -> str:
    if v is None:
        return "-"
    return fmt_ms(v) if key.endswith("_ms") else f"{v:.2f}"


def _count(n: Any) -> str:
    return "?" if n is None else str(n)


def compare(name_a: str, a: Sequence[dict[str, Any]], name_b: str, b: Sequence[dict[str, Any]]) -> str:
    """Levels of two sweeps side by side, matched by level, with B's difference from A in percent."""
    by_a = {level_label(s).rstrip(" *"): s for s in a}
    by_b = {level_label(s).rstrip(" *"): s for s in b}
    order = [k for k in by_a if k in by_b] + [k for k in by_a if k not in by_b] + [k for k in by_b if k not in by_a]
    head = ["level", "n A", "n B"]
    for label, _, _ in COMPARE_KEYS:
        head += [f"{label} A", "B", "diff"]
    rows = []
    for k in order:
        sa, sb = by_a.get(k, {}), by_b.get(k, {})
        n_a, n_b = sa.get("completed"), sb.get("completed")
        row = [k + (" *" if sa.get("partial") or sb.get("partial") else ""), _count(n_a), _count(n_b)]
        for _, key, _ in COMPARE_KEYS:
            row += [_num(sa.get(key), key), _num(sb.get(key), key), pct(sa.get(key), sb.get(key), n_a, n_b)]
        rows.append(row)
    lines = [f"A = {terminal_safe(name_a)}", f"B = {terminal_safe(name_b)}", "", *_grid(head, rows)]
    lines.append("n: requests completed at the level; p50/p99 are over those requests, throughput over the level's "
                 "duration; * a partial level")
    lines.append(f"diff: B against A (throughput: + is better; latency: - is better); {RULE}")
    return "\n".join(lines)
