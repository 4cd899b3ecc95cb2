"""Text charts for terminals: sparklines and column charts with a threshold line and breach marks.

Pure functions returning strings and per-cell flags so the widgets only add colour; every mark that carries
meaning is also a distinct character (colour is never the only signal), and ASCII mode serves terminals and
fonts without block glyphs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

SPARK = "▁▂▃▄▅▆▇█"
SPARK_ASCII = "_.-=+*#@"
COLUMN = " ▁▂▃▄▅▆▇█"
_BLOCKS = " ▏▎▍▌▋▊▉█"
NICE_STEPS = (1.0, 2.0, 2.5, 5.0, 10.0)
# An auto-scaled sparkline's top sits this far above its highest value: scaled to its own maximum, a steady
# series drew every bar full, which reads as "saturated" whatever the load.
SPARK_HEADROOM = 1.25


def _finite(value: float | None) -> bool:
    """A reading a chart can draw: a finite number (not None, NaN or Infinity)."""
    return value is not None and math.isfinite(value)


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 x 10^k at or above `value`: an axis top that reads as a round figure."""
    if not math.isfinite(value) or value <= 0:
        return 1.0
    base = 10.0 ** math.floor(math.log10(value))
    return next(step * base for step in NICE_STEPS if step * base >= value * (1 - 1e-9))


def axis_top(readings: Iterable[float | None], fixed: float | None = None, threshold: float | None = None,
             headroom: float = 1.0) -> float:
    """The top of a scale that contains every reading and the threshold: `fixed` (100 for a percentage) while
    nothing is above it, else a round number at or above the highest of them (times `headroom`)."""
    peak = max([v for v in readings if v is not None and math.isfinite(v)] + [threshold or 0.0, 0.0])
    if fixed is not None and fixed > 0 and peak <= fixed:
        return fixed
    return nice_ceiling(peak * headroom) if peak > 0 else (fixed if fixed and fixed > 0 else 1.0)


def bucketize(points: Sequence[tuple[int, float | None]], start_ms: int, end_ms: int, width: int,
              agg: str = "max", hold_ms: int | None = None) -> list[float | None]:
    """Place timed points into `width` equal time buckets; a bucket with no reading stays None (a gap).

    With `hold_ms`, a bucket that starts within `hold_ms` of the last reading keeps that reading: buckets
    narrower than the readings' spacing (60 one-minute rollups over 68 columns) are not gaps, and drawing
    them empty said "no data" every few columns. A real gap, longer than `hold_ms`, stays empty.
    """
    if width <= 0:
        return []
    span = max(1, end_ms - start_ms)
    buckets: list[list[float]] = [[] for _ in range(width)]
    last_ts: list[int | None] = [None] * width
    for ts, value in points:
        if not _finite(value) or ts < start_ms or ts > end_ms:  # NaN or Infinity (a stored REAL inf) is no reading
            continue
        i = min(width - 1, int((ts - start_ms) * width / span))
        buckets[i].append(float(value))
        last_ts[i] = ts if last_ts[i] is None else max(ts, last_ts[i])
    out: list[float | None] = []
    held: tuple[int, float] | None = None  # (ts, value) of the latest reading so far
    for i, b in enumerate(buckets):
        if not b:
            bucket_start = start_ms + i * span / width
            out.append(held[1] if held and hold_ms is not None and bucket_start - held[0] <= hold_ms else None)
            continue
        if agg == "avg":
            value = sum(b) / len(b)
        elif agg == "min":
            value = min(b)
        else:
            value = max(b)
        out.append(value)
        held = (last_ts[i], value)
    return out


def reading_interval(points: Sequence[tuple[int, float | None]]) -> int | None:
    """The median spacing of the readings (ms), or None with fewer than two."""
    ts = sorted(t for t, v in points if v is not None)
    gaps = sorted(b - a for a, b in zip(ts, ts[1:], strict=False) if b > a)
    return gaps[len(gaps) // 2] if gaps else None


def sparkline(values: Sequence[float | None], width: int, vmax: float | None = None,
              ascii_only: bool = False) -> str:
    """The last `width` values as one line from 0 to a top above them all (`vmax` unless a value is above it,
    else a round figure with headroom: a full bar means at the top, never "as high as the rest"); gaps, and
    values that are not finite numbers (NaN, Infinity: no reading), are spaces."""
    chars = SPARK_ASCII if ascii_only else SPARK
    vals = list(values)[-width:] if width > 0 else []
    top = axis_top(vals, fixed=vmax, headroom=SPARK_HEADROOM)
    out = []
    for v in vals:
        if not _finite(v):
            out.append(" ")
        elif top <= 0:
            out.append(chars[0])
        else:
            out.append(chars[min(len(chars) - 1, max(0, int(v / top * (len(chars) - 1) + 0.5)))])
    return "".join(out).rjust(width)


@dataclass
class Chart:
    rows: list[str]  # top to bottom, each `width` cells
    breach: list[bool]  # per column: above the threshold
    threshold_row: int | None  # row index of the threshold line, when drawn
    vmax: float


def column_chart(values: Sequence[float | None], height: int, vmax: float | None = None,
                 threshold: float | None = None, ascii_only: bool = False) -> Chart:
    """Columns of eighth-cell resolution from 0 to a top that contains every value (`vmax` unless a value is
    above it); a dashed threshold line where no column covers it.

    Row i (0 = top) holds the values in [(h-1-i)·top/h, (h-i)·top/h); the threshold line is drawn on the row
    that holds the threshold, and the top is raised until that is not the top row (where the line would read
    as the axis top, and its label would hide the top's).
    """
    width = len(values)
    height = max(1, height)
    limit_room = threshold * height / (height - 1) * 1.001 if threshold and threshold > 0 and height > 1 else None
    top = axis_top(values, fixed=vmax, threshold=limit_room or threshold)
    grid = [[" "] * width for _ in range(height)]
    breach = [False] * width
    for x, v in enumerate(values):
        if not _finite(v):
            continue
        breach[x] = threshold is not None and v > threshold
        _fill_column(grid, x, v, top, ascii_only)
    threshold_row = value_row(threshold, top, height) if threshold is not None and 0 < threshold <= top else None
    if threshold_row is not None:
        grid[threshold_row] = [("-" if ascii_only else "╌") if ch == " " else ch for ch in grid[threshold_row]]
    return Chart(["".join(r) for r in grid], breach, threshold_row, top)


def value_row(value: float, top: float, height: int) -> int:
    """The row (0 = top) whose band of values holds `value`; the top row also holds `top` itself."""
    band = int(value / top * height) if top > 0 else 0
    return height - 1 - min(height - 1, max(0, band))


def _fill_column(grid: list[list[str]], x: int, v: float, top: float, ascii_only: bool) -> None:
    height = len(grid)
    eighths = int(min(v, top) / top * height * 8 + 0.5)
    if v > 0 and eighths == 0:
        eighths = 1  # a non-zero reading is never drawn as nothing
    for row in range(height):
        fill = min(8, max(0, eighths - (height - 1 - row) * 8))
        if fill:
            grid[row][x] = ("#" if fill >= 4 else ".") if ascii_only else COLUMN[fill]


def breach_marks(breach: Sequence[bool], ascii_only: bool = False) -> str:
    mark = "^" if ascii_only else "▲"
    return "".join(mark if b else " " for b in breach)



def bar(pct: float | None, width: int, ascii_only: bool = False) -> str:
    """A horizontal bar of `width` cells for 0-100 (eighth-cell resolution, or '#' in ASCII); N/A for None or a
    value that is not a finite number."""
    if not _finite(pct):
        return "N/A".center(width)[:width]
    frac = min(max(float(pct), 0.0), 100.0) / 100.0
    if ascii_only:
        full = round(frac * width)
        return "#" * full + "." * (width - full)
    eighths = round(frac * width * 8)
    full, part = divmod(eighths, 8)
    text = "█" * full + (_BLOCKS[part] if part else "")
    return text.ljust(width)[:width]
