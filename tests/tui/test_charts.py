"""Charts tell the truth: known series drawn and the rows read back (issue 28.3).

The axis holds every value shown, the SLA line sits on the row whose band holds its value, a steady series does
not fill every bar, and a chart draws nothing outside its own region, at any size.
"""

from __future__ import annotations

import pytest
from rich.cells import cell_len
from textual.app import App, ComposeResult

from lynxtop.tui.plot import COLUMN, SPARK, bar, bucketize, column_chart, nice_ceiling, reading_interval, sparkline
from lynxtop.tui.widgets.time_chart import LABEL_W, TimeChart

RAMP = [float(v) for v in range(0, 101, 5)]  # 0..100, 21 columns
T0 = 1_700_000_000_000


def _band(i: int, top: float, height: int) -> tuple[float, float]:
    """Row i's (0 = top) band of values: [low, high)."""
    low = (height - 1 - i) * top / height
    return low, low + top / height


def _eighths(chart_rows: list[str], x: int) -> int:
    """How high column x is drawn, in eighths of a row, read back from the glyphs."""
    return sum(COLUMN.index(row[x]) if row[x] in COLUMN else 0 for row in chart_rows)


@pytest.mark.parametrize("height", [2, 3, 4, 8])
def test_ramp_with_sla_line_on_its_row(height):
    chart = column_chart(RAMP, height, threshold=50.0)
    assert chart.vmax >= max(RAMP)
    i = chart.threshold_row
    assert i is not None and i != 0  # never on the top row, where it would read as the axis top
    low, high = _band(i, chart.vmax, height)
    assert low <= 50.0 < high
    lined = [r for r, row in enumerate(chart.rows) if "╌" in row]
    assert lined == [i]
    # every column is drawn as high as its value, to the nearest eighth of a row
    for x, v in enumerate(RAMP):
        assert abs(_eighths(chart.rows, x) - v / chart.vmax * height * 8) <= 1, (x, v)
    assert chart.breach == [v > 50.0 for v in RAMP]


def test_threshold_above_every_value_still_inside_the_axis():
    chart = column_chart([100.0, 120.0, 90.0], 4, threshold=2000.0)
    assert chart.vmax >= 2000.0
    low, high = _band(chart.threshold_row, chart.vmax, 4)
    assert low <= 2000.0 < high


def test_fixed_top_grows_for_a_value_above_it():
    # a percentage chart (top 100) given 130 % (a reading above the scale): the axis must still hold it
    chart = column_chart([50.0, 130.0], 4, vmax=100.0)
    assert chart.vmax >= 130.0
    assert _eighths(chart.rows, 1) < 4 * 8  # not a full (clipped) column
    assert column_chart([50.0, 100.0], 4, vmax=100.0).vmax == 100.0


@pytest.mark.parametrize("level", [0.4, 37.0, 400.0, 1000.0, 2.5e6])
def test_steady_series_does_not_fill_every_bar(level):
    line = sparkline([level] * 30, 30)
    assert len(line) == 30
    assert set(line) != {SPARK[-1]}
    assert SPARK.index(line[0]) >= 3  # but it is not drawn as near nothing either


def test_sparkline_fixed_top_and_values_above_it():
    assert sparkline([0, None, 8], 3, vmax=8) == "▁ █"  # at the fixed top: full
    line = sparkline([50.0, 150.0], 2, vmax=100.0)  # above the fixed top: the scale grows past 150
    assert SPARK.index(line[0]) <= 3 and SPARK.index(line[0]) < SPARK.index(line[1]) < len(SPARK) - 1


def test_readings_sparser_than_columns_leave_no_false_gaps():
    """One-minute rollups over an hour in 68 columns: every column after the first reading has a value; an
    outage of ten minutes is still drawn as a gap."""
    minute = 60_000
    points = [(T0 + m * minute, 50.0 + m % 7) for m in range(61) if not 20 <= m < 30]
    assert reading_interval(points) == minute
    values = bucketize(points, T0, T0 + 60 * minute, 68, "avg", hold_ms=int(minute * 1.5))
    col = lambda ts: int((ts - T0) * 68 / (60 * minute))  # noqa: E731
    outage = range(col(T0 + 21 * minute) + 1, col(T0 + 30 * minute))
    assert all(values[i] is None for i in outage)
    assert all(v is not None for i, v in enumerate(values) if i not in outage)
    # without holding, the narrower columns showed false gaps
    assert sum(v is None for v in bucketize(points, T0, T0 + 60 * minute, 68, "avg")) > len(outage)


@pytest.mark.parametrize(("value", "top"), [(0.7, 1.0), (1.0, 1.0), (3.0, 5.0), (101.0, 200.0), (2400.0, 2500.0),
                                           (0.031, 0.05)])
def test_nice_ceiling(value, top):
    assert nice_ceiling(value) == pytest.approx(top)


class _ChartApp(App):
    def __init__(self, chart: TimeChart):
        super().__init__()
        self.chart = chart

    def compose(self) -> ComposeResult:
        yield self.chart


def _fmt(v: float | None) -> str:
    return "N/A" if v is None else f"{v:.0f}"


async def _rendered(chart: TimeChart, size: tuple[int, int], height: int) -> list[str]:
    chart.styles.height = height
    async with _ChartApp(chart).run_test(size=size) as pilot:
        await pilot.pause()
        text = chart.render()
        assert chart.size.height == height
        lines = text.plain.split("\n")
        assert len(lines) <= chart.size.height, lines
        assert all(cell_len(line) <= chart.size.width for line in lines), lines
        return lines


@pytest.mark.parametrize(("width", "height"), [(80, 7), (80, 5), (40, 4), (20, 3), (12, 6), (8, 2)])
async def test_time_chart_draws_only_inside_its_region(width, height):
    chart = TimeChart("TTFT p99", _fmt, agg="max")
    points = [(T0 + i * 1000, float(v)) for i, v in enumerate(RAMP)]
    chart.set_data(points, T0, T0 + 20_000, threshold=50.0, utc=True)
    lines = await _rendered(chart, (width, height + 2), height)
    assert lines[0].startswith("TTFT p99"[:width])
    if height >= 3:
        assert "└" in lines[-1]  # the time axis is kept; plot rows give way first


async def test_axis_top_holds_the_reading_the_title_quotes():
    """Averaged columns hide a short peak; the axis still reaches the highest reading the title states."""
    chart = TimeChart("Generation tokens/s", _fmt, agg="avg")
    points = [(T0 + i * 100, 1000.0) for i in range(200)] + [(T0 + 200 * 100, 2400.0)]
    chart.set_data(points, T0, T0 + 20_000, utc=True)
    lines = await _rendered(chart, (60, 10), 7)
    assert "now 2400" in lines[0] and "max 2400" in lines[0]
    top_label = float(lines[1][:LABEL_W])
    assert top_label >= 2400


async def test_sla_row_labelled_with_its_value_and_marks_under_breaches():
    chart = TimeChart("TTFT p99", _fmt, agg="max")
    points = [(T0 + i * 1000, float(v)) for i, v in enumerate(RAMP)]
    chart.set_data(points, T0, T0 + 20_999, threshold=50.0, utc=True)
    lines = await _rendered(chart, (LABEL_W + 1 + 21, 12), 9)
    plot = lines[1:-2]
    lined = [r for r, row in enumerate(plot) if "╌" in row]
    assert len(lined) == 1
    assert plot[lined[0]][:LABEL_W].strip() == "50"
    top = float(plot[0][:LABEL_W])
    low, high = _band(lined[0], top, len(plot))
    assert low <= 50 < high
    marks = lines[-2][LABEL_W + 1:]
    assert [m != " " for m in marks] == [v > 50 for v in RAMP]


def test_readings_that_are_not_finite_numbers_are_gaps():
    """NaN and Infinity (a status from a buggy agent, a REAL inf kept by the store) are no reading: a gap in a
    sparkline, a column chart and a time bucket, N/A in a bar; never a crash taking the dashboard down."""
    nan, inf = float("nan"), float("inf")
    assert sparkline([1.0, nan, inf, -inf, 2.0], 5, vmax=2) == f"{SPARK[4]}   {SPARK[-1]}"
    chart = column_chart([nan, inf, 50.0], height=2, vmax=100, threshold=40.0)
    assert chart.breach == [False, False, True] and all(row[:2] in ("  ", "╌╌") for row in chart.rows)
    assert bucketize([(T0, inf), (T0 + 10, 5.0), (T0 + 20, nan)], T0, T0 + 29, 3) == [None, 5.0, None]
    assert bar(nan, 5) == bar(inf, 5) == " N/A "
