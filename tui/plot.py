"""Text charts for terminals: sparklines and column charts with a threshold line and breach marks.

Pure functions returning strings and per-cell flags so the widgets only add colour; every mark that carries
meaning is also a distinct character (colour is never the only signal), and ASCII mode serves terminals and
fonts without block glyphs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SPARK = "▁▂▃▄▅▆▇█"
SPARK_ASCII = "_.-=+*#@"
COLUMN = " ▁▂▃▄▅▆▇█"
_BLOCKS = " ▏▎▍▌▋▊▉█"


def bucketize(points: Sequence[tuple[int, float | None]], start_ms: int, end_ms: int, width: int,
              agg: str = "max") -> list[float | None]:
    """Place timed points into `width` equal time buckets; a bucket with no reading stays None (a gap)."""
    if width <= 0:
        return []
    span = max(1, end_ms - start_ms)
    buckets: list[list[float]] = [[] for _ in range(width)]
    for ts, value in points:
        if value is None or ts < start_ms or ts > end_ms:
            continue
        i = min(width - 1, int((ts - start_ms) * width / span))
        buckets[i].append(float(value))
    out: list[float | None] = []
    for b in buckets:
        if not b:
            out.append(None)
        elif agg == "avg":
            out.append(sum(b) / len(b))
        elif agg == "min":
            out.append(min(b))
        else:
            out.append(max(b))
    return out


def sparkline(values: Sequence[float | None], width: int, vmax: float | None = None,
              ascii_only: bool = False) -> str:
    """The last `width` values as one line; gaps are spaces."""
    chars = SPARK_ASCII if ascii_only else SPARK
    vals = list(values)[-width:]
    real = [v for v in vals if v is not None]
    top = vmax if vmax is not None else (max(real) if real else 0.0)
    out = []
    for v in vals:
        if v is None:
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
    """Columns of eighth-cell resolution; a dashed threshold line where no column covers it."""
    width = len(values)
    real = [v for v in values if v is not None]
    top = vmax if vmax is not None else max([*real, threshold or 0.0, 0.0])
    if top <= 0:
        top = 1.0
    height = max(1, height)
    grid = [[" "] * width for _ in range(height)]
    breach = [False] * width
    for x, v in enumerate(values):
        if v is None:
            continue
        breach[x] = threshold is not None and v > threshold
        _fill_column(grid, x, v, top, ascii_only)
    threshold_row = None
    if threshold is not None and 0 < threshold <= top:
        threshold_row = min(height - 1, max(0, height - 1 - int(threshold / top * height)))
        grid[threshold_row] = [("-" if ascii_only else "╌") if ch == " " else ch for ch in grid[threshold_row]]
    return Chart(["".join(r) for r in grid], breach, threshold_row, top)


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
    """A horizontal bar of `width` cells for 0-100 (eighth-cell resolution, or '#' in ASCII)."""
    if pct is None:
        return "N/A".center(width)[:width]
    frac = min(max(float(pct), 0.0), 100.0) / 100.0
    if ascii_only:
        full = round(frac * width)
        return "#" * full + "." * (width - full)
    eighths = round(frac * width * 8)
    full, part = divmod(eighths, 8)
    text = "█" * full + (_BLOCKS[part] if part else "")
    return text.ljust(width)[:width]
