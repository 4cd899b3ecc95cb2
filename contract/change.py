"""B against A in percent, stated only when it means something (issue 28.4).

`bench compare` once printed "+2848 %" for a level's TTFT p99 that four requests on each side made: a p99 of four
requests is their maximum, one slow request. A percentage is printed only when both sides hold at least
MIN_SAMPLES samples and A is not ~0; otherwise the cell says why there is none. One rule for `lynxtop bench
compare` and the dashboard's run comparison. Imports nothing else of the project.
"""

from __future__ import annotations

MIN_SAMPLES = 30
NEAR_ZERO = 1e-9  # relative to the larger side: a base this small makes any percentage meaningless

RULE = (f"no percentage when either side has fewer than {MIN_SAMPLES} samples (shown as n<{MIN_SAMPLES}) "
        "or A is ~0 (shown as A~0)")


def change_pct(a: float | None, b: float | None, n_a: int | None, n_b: int | None,
               min_samples: int = MIN_SAMPLES) -> str:
    """'+12.3%', or why there is no percentage: '-' (a value missing), 'n?' (a sample count unknown),
    'n<30' (too few samples on a side), 'A~0' (the base is zero or next to it)."""
    if a is None or b is None:
        return "-"
    if n_a is None or n_b is None:
        return "n?"
    if min(n_a, n_b) < min_samples:
        return f"n<{min_samples}"
    if abs(a) <= NEAR_ZERO * max(abs(a), abs(b), 1.0):
        return "A~0"
    return f"{(b - a) / a * 100:+.1f}%"
