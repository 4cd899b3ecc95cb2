"""A titled column chart of one series over a time window, with optional threshold and breach marks."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.text import Text
from textual.widget import Widget

from lynxtop.contract.format import NA, fmt_clock, fmt_datetime, fmt_duration
from lynxtop.tui.plot import Chart, axis_top, breach_marks, bucketize, column_chart, reading_interval

LABEL_W = 9  # the y-axis labels' width


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

    def set_data(self, points: Sequence[tuple[int, float | None]], start_ms: int, end_ms: int, *,
                 threshold: float | None = None, utc: bool = False, note: str = "",
                 episodes: int | None = None) -> None:
        """`episodes`: the breach count to show, where the caller knows more than the points (the Latency view
        counts as agent/metrics/sla.py does); None: the points' own runs above the threshold."""
        self.points, self.start_ms, self.end_ms = points, start_ms, end_ms
        self.threshold, self.utc, self.note, self.episodes = threshold, utc, note, episodes
        self.refresh()

    def render(self) -> Text:
        """Title, plot rows, breach marks (with a threshold), time axis: each line within the widget's width,
        and the rows that do not fit its height left out from the plot, not cut from the bottom."""
        width, height = self.size.width, self.size.height
        if width <= 0 or height <= 0:
            return Text()
        plot_w = max(1, width - LABEL_W - 1)
        marks = self.threshold is not None and height >= 4
        plot_h = max(1, height - 2 - (1 if marks else 0))
        # A reading holds for 1.5 of the readings' own spacing: no false gaps where columns are narrower.
        interval = reading_interval(self.points)
        values = bucketize(self.points, self.start_ms, self.end_ms, plot_w, self.agg,
                           hold_ms=int(interval * 1.5) if interval else None)
        last = next((v for _, v in reversed(self.points) if v is not None), None)
        # The axis holds every reading the title quotes (now, max), not only the bucket averages drawn.
        top = axis_top([*values, self._max_reading(last)], fixed=self.vmax)
        chart = column_chart(values, plot_h, top, self.threshold, self.ascii_only)
        lines = [self._title_line(chart, last)]
        for i, row in enumerate(chart.rows):
            line = Text(self._row_label(i, chart)[:LABEL_W].rjust(LABEL_W) + "│", style="dim")
            self._append_row(line, row, chart.breach)
            lines.append(line)
        if marks:
            line = Text(" " * LABEL_W + "│", style="dim")
            line.append(breach_marks(chart.breach, self.ascii_only), style="bold red")
            lines.append(line)
        stamp = fmt_datetime if self.end_ms - self.start_ms > 86_400_000 else fmt_clock
        left, right = stamp(self.start_ms, self.utc), stamp(self.end_ms, self.utc)
        axis = left + right.rjust(plot_w - len(left)) if len(left) + len(right) < plot_w else left
        lines.append(Text(" " * LABEL_W + "└" + axis, style="dim"))
        lines = [lines[0], *lines[1:][-(height - 1):]] if height > 1 else lines[:1]
        for line in lines:
            line.truncate(width, overflow="crop")
        out = Text("\n", no_wrap=True, overflow="crop").join(lines)
        out.no_wrap, out.overflow = True, "crop"
        return out

    def _title_line(self, chart: Chart, last: float | None) -> Text:
        """Title, the last reading, the window's max, the threshold and how many columns breach it."""
        out = Text(no_wrap=True, overflow="crop")
        out.append(self.title, style="bold")
        out.append(f"  now {self.fmt(last)}" if last is not None else f"  now {NA}")
        top = self._max_reading(last)
        if top is not None:
            out.append(f"  max {self.fmt(top)}", style="dim")
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

    def _max_reading(self, last: float | None) -> float | None:
        """The highest reading in the window, the last one included: columns are bucket averages (or
        minima), whose max is below the readings', and "now 56°C max 55°C" reads as a bug."""
        real = [v for ts, v in self.points if v is not None and self.start_ms <= ts <= self.end_ms]
        if last is not None:
            real.append(last)
        return max(real) if real else None

    def _row_label(self, i: int, chart: Chart) -> str:
        if i == 0:
            return self.fmt(chart.vmax)
        if i == chart.threshold_row:
            return self.fmt(self.threshold)
        if i == len(chart.rows) - 1:
            return self.fmt(0)
        return ""

    def _append_row(self, out: Text, row: str, breach: list[bool]) -> None:
        # Runs of one style are appended at once: per-cell appends cost more than the drawing.
        run_style, run_start = None, 0
        for x, ch in enumerate(row):
            style = ("yellow" if ch in "╌-" else "red" if breach[x] and ch != " " else self.style)
            if style != run_style:
                if run_style is not None:
                    out.append(row[run_start:x], style=run_style)
                run_style, run_start = style, x
        if run_style is not None:
            out.append(row[run_start:], style=run_style)


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
