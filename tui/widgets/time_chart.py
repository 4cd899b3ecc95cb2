"""A titled column chart of one series over a time window, with optional threshold and breach marks."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from rich.cells import cell_len
from rich.text import Text
from textual.widget import Widget

from lynxtop.contract.format import NA, fmt_clock, fmt_datetime, fmt_duration
from lynxtop.contract.quantile import over, quantile_bound
from lynxtop.tui.glyphs import ascii_text
from lynxtop.tui.plot import Chart, axis_top, breach_marks, bucketize, column_chart, reading_interval

LABEL_W = 9  # the y-axis labels' width, unless a label needs more (fit_label)
_NUMBER = re.compile(r"(-?\d+)\.(\d+)(.*)", re.DOTALL)  # a label that starts with a decimal number: "1.86 GiB/s"
ROUNDING = 0.05  # a label may lose decimals while its number stays within 5 % of the reading
MARK, AXIS_MARK = "┊", "┴"  # a marked time (set_data's marks_ms); ASCII `:` and `+` (tui/glyphs.py)
MARKS = frozenset((MARK, AXIS_MARK))


class TimeChart(Widget):
    DEFAULT_CSS = "TimeChart { height: 6; text-wrap: nowrap; text-overflow: clip; }"

    def __init__(self, title: str, fmt: Callable[[float | None], str], *, vmax: float | None = None,
                 agg: str = "max", ascii_only: bool = False, style: str = "cyan", **kwargs):
        super().__init__(**kwargs)
        self.title = title
        self.fmt = fmt
        self.vmax = vmax
        self.agg = agg
        self.ascii_only = ascii_only
        self.style = style
        self.points: Sequence[tuple[int, float | None]] = ()
        self.start_ms = 0
        self.end_ms = 1
        self.threshold: float | None = None
        self.utc = False
        self.note = ""
        self.episodes: int | None = None  # breaches counted by the caller (the agent's rule); None: counted here
        self.lowest: float | None = None  # percentiles: their histogram's lowest bucket bound (contract/quantile.py)
        self.marks_ms: tuple[int, ...] = ()  # times marked on the plot (a GPU index's board changed: History view)
        self._data_key: tuple[object, ...] | None = None  # the inputs drawn: the same again is not drawn again

    def set_data(self, points: Sequence[tuple[int, float | None]], start_ms: int, end_ms: int, *,
                 threshold: float | None = None, utc: bool = False, note: str = "",
                 episodes: int | None = None, lowest: float | None = None, marks_ms: Sequence[int] = ()) -> None:
        """`episodes`: the breach count to show, where the caller knows more than the points (the Latency view
        counts as agent/metrics/sla.py does); None: the points' own runs above the threshold. `lowest`: the points
        are percentiles and this their histogram's lowest bucket bound: a reading at or below it is quoted as
        `<bound`, and never marked a breach of a threshold below the bound (the histogram cannot tell).
        `marks_ms`: times drawn as a dotted line through the plot's empty cells and `┴` on the time axis."""
        # a copy: a live list grows
        key = (tuple(points), start_ms, end_ms, threshold, utc, note, episodes, lowest, tuple(marks_ms))
        if key == self._data_key:
            return  # an idle node's same readings and window: nothing to send
        self._data_key = key
        self.points, self.start_ms, self.end_ms = points, start_ms, end_ms
        self.threshold, self.utc, self.note, self.episodes = threshold, utc, note, episodes
        self.lowest = lowest
        self.marks_ms = tuple(marks_ms)
        self.refresh()

    def render(self) -> Text:
        """Title, plot rows, breach marks (with a threshold), time axis: each line within the widget's width,
        and the rows that do not fit its height left out from the plot, not cut from the bottom."""
        width, height = self.size.width, self.size.height
        if width <= 0 or height <= 0:
            return Text()
        marks = self.threshold is not None and height >= 4
        plot_h = max(1, height - 2 - (1 if marks else 0))
        last = next((v for _, v in reversed(self.points) if v is not None), None)
        label_w = LABEL_W
        for _ in range(3):  # a wider axis narrows the plot, which may move its top: until its labels fit
            plot_w = max(1, width - label_w - 1)
            chart = self._chart(plot_w, plot_h, last)
            labels = [fit_label(self._row_label(i, chart)) for i in range(len(chart.rows))]
            need = max((cell_len(label) for label in labels), default=0)
            if need <= label_w:
                break
            label_w = need
        lines = [self._title_line(chart, last)]
        marked = self._mark_columns(plot_w)
        for label, row in zip(labels, chart.rows, strict=True):
            line = Text(" " * (label_w - cell_len(label)) + label + "│", style="dim")
            if marked:
                row = "".join(MARK if x in marked and ch == " " else ch for x, ch in enumerate(row))
            self._append_row(line, row, chart.breach)
            lines.append(line)
        if marks:
            line = Text(" " * label_w + "│", style="dim")
            line.append(breach_marks(chart.breach, self.ascii_only), style="bold red")
            lines.append(line)
        stamp = fmt_datetime if self.end_ms - self.start_ms > 86_400_000 else fmt_clock
        left, right = stamp(self.start_ms, self.utc), stamp(self.end_ms, self.utc)
        axis = left + right.rjust(plot_w - len(left)) if len(left) + len(right) < plot_w else left
        if marked:  # where the time labels leave the cell free
            axis = "".join(AXIS_MARK if x in marked and ch == " " else ch
                           for x, ch in enumerate(axis.ljust(max(marked) + 1)))
            axis_line = Text(" " * label_w + "└", style="dim")
            self._append_row(axis_line, axis, [False] * len(axis), "dim")
            lines.append(axis_line)
        else:
            lines.append(Text(" " * label_w + "└" + axis, style="dim"))
        lines = [lines[0], *lines[1:][-(height - 1):]] if height > 1 else lines[:1]
        for line in lines:
            line.truncate(width, overflow="crop")
        out = Text("\n", no_wrap=True, overflow="crop").join(lines)
        out.no_wrap, out.overflow = True, "crop"
        return ascii_text(out, self.ascii_only)  # `▲ 2 breaches`, `°C`

    def _chart(self, plot_w: int, plot_h: int, last: float | None) -> Chart:
        """The columns of `plot_w` time buckets, `plot_h` rows high."""
        # A reading holds for 1.5 of the readings' own spacing: no false gaps where columns are narrower.
        interval = reading_interval(self.points)
        values = bucketize(self.points, self.start_ms, self.end_ms, plot_w, self.agg,
                           hold_ms=int(interval * 1.5) if interval else None)
        # The axis holds every reading the title quotes (now, max), not only the bucket averages drawn.
        top = axis_top([*values, self._max_reading(last)], fixed=self.vmax)
        chart = column_chart(values, plot_h, top, self.threshold, self.ascii_only)
        if self.lowest is not None and self.threshold is not None:  # a column in the lowest bucket: not judged
            chart.breach = [b and over(v, self.lowest, self.threshold) for b, v in zip(chart.breach, values,
                                                                                         strict=True)]
        return chart

    def _title_line(self, chart: Chart, last: float | None) -> Text:
        """Title, the last reading, the window's max, the threshold and how many columns breach it."""
        out = Text(no_wrap=True, overflow="crop")
        out.append(self.title, style="bold")
        out.append(f"  now {self._reading(last)}" if last is not None else f"  now {NA}")
        top = self._max_reading(last)
        if top is not None:
            out.append(f"  max {self._reading(top)}", style="dim")
        if self.threshold is not None:
            n = (self.episodes if self.episodes is not None
                 else breach_episodes(self.points, self.threshold, self.start_ms, self.end_ms))
            out.append(f"  limit {self.fmt(self.threshold)}", style="dim")
            if n:
                # episodes, as the agent's sla.breach events count them, not chart columns above the line
                span = fmt_duration((self.end_ms - self.start_ms) / 1000)
                out.append(f"  ▲ {n} breach{'es' if n != 1 else ''} in {span}", style="bold red")
        if self.note:
            out.append(f"  {self.note}", style="dim italic")
        return out

    def _reading(self, v: float) -> str:
        """A reading as the title quotes it: a percentile in its histogram's lowest bucket as that bucket's bound."""
        bound = quantile_bound(v, self.lowest)
        return self.fmt(v) if bound is None else "<" + self.fmt(bound)

    def _max_reading(self, last: float | None) -> float | None:
        """The highest reading in the window, the last one included: columns are bucket averages (or
        minima), whose max is below the readings', and "now 56°C max 55°C" reads as a bug."""
        real = [v for ts, v in self.points if v is not None and self.start_ms <= ts <= self.end_ms]
        if last is not None:
            real.append(last)
        return max(real) if real else None

    def _mark_columns(self, plot_w: int) -> set[int]:
        """The plot columns of `marks_ms` within the window, placed as bucketize places readings."""
        span = max(1, self.end_ms - self.start_ms)
        return {min(plot_w - 1, int((ts - self.start_ms) * plot_w / span)) for ts in self.marks_ms
                if self.start_ms <= ts <= self.end_ms}

    def _row_label(self, i: int, chart: Chart) -> str:
        if i == 0:
            return self.fmt(chart.vmax)
        if i == chart.threshold_row:
            return self.fmt(self.threshold)
        if i == len(chart.rows) - 1:
            return self.fmt(0)
        return ""

    def _append_row(self, out: Text, row: str, breach: list[bool], base: str | None = None) -> None:
        # Runs of one style are appended at once: per-cell appends cost more than the drawing.
        run_style, run_start = None, 0
        base = base or self.style
        for x, ch in enumerate(row):
            style = ("bold magenta" if ch in MARKS else "yellow" if ch in "╌-" and base != "dim"
                     else "red" if breach[x] and ch != " " else base)
            if style != run_style:
                if run_style is not None:
                    out.append(row[run_start:x], style=run_style)
                run_style, run_start = style, x
        if run_style is not None:
            out.append(row[run_start:], style=run_style)


def fit_label(label: str, width: int = LABEL_W) -> str:
    """`label` in `width` columns, its unit whole: one decimal fewer while it is too long and its number stays
    within 5 % ("1.86 GiB/s" -> "1.9 GiB/s", "18.6 GiB/s" -> "19 GiB/s"). What still does not fit comes back
    whole, and the chart widens its axis: cut to the axis' width, the NVLink chart's top read "1.86 GiB/"."""
    while cell_len(label) > width and (m := _NUMBER.fullmatch(label)):
        whole, decimals, unit = m.groups()
        value = float(f"{whole}.{decimals}")
        shorter = f"{value:.{len(decimals) - 1}f}"
        if abs(float(shorter) - value) > ROUNDING * abs(value):
            break
        label = shorter + unit
    return label


def breach_episodes(points: Sequence[tuple[int, float | None]], threshold: float, start_ms: int, end_ms: int
                    ) -> int:
    """How many times the series went above the threshold within [start, end]: one long breach is one episode,
    however many samples or chart columns it spans. A gap (None) does not end an episode."""
    episodes, above = 0, False
    for ts, v in points:
        if v is None or not start_ms <= ts <= end_ms:
            continue
        if v > threshold and not above:
            episodes += 1
        above = v > threshold
    return episodes
