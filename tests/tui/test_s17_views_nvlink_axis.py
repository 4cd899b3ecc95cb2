"""A chart's y-axis labels keep their unit at 80 columns: the NVLink chart showed `1.86 GiB/` (the label cut at
the axis' 9 columns; tmux audit, session 16)."""

from __future__ import annotations

import re

import pytest
from support.tui import make_app, screen_text, text_of, wait_for
from support.tui_keys import open_screen

from lynxtop.tui.screens.gpu import GpuScreen
from lynxtop.tui.widgets.time_chart import TimeChart

# A whole rate label: a number, a space, a binary unit and "/s" ("1.9 GiB/s", "954 MiB/s", "0 B/s")
RATE = re.compile(r"\d+(\.\d+)? (B|KiB|MiB|GiB|TiB|PiB)/s")


def _labels(chart: TimeChart) -> list[str]:
    """The y-axis labels the chart draws: what stands before the axis' "│" on each plot row."""
    return [line.split("│", 1)[0].strip() for line in text_of(chart).splitlines()[1:] if "│" in line]


# 1.5 GB/s: the axis top 2 GB/s is 1.86 GiB/s (10 characters); 15 GB/s: the top 20 GB/s is 18.6 GiB/s (10 too)
@pytest.mark.parametrize("rate", [1.5e9, 15e9])
async def test_nvlink_axis_labels_keep_their_unit_at_80x24(agent, rate):
    for row in agent.status["gpus"]:
        row["nvlink_tx_bytes_per_s"] = row["nvlink_rx_bytes_per_s"] = rate
    app = make_app(agent.socket_path, utc=True)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_screen(pilot, app, "2", GpuScreen)
        for cid in ("nvtx", "nvrx"):
            chart = screen.query_one(f"#chart-{cid}", TimeChart)
            chart.scroll_visible(animate=False)
            await wait_for(pilot, lambda c=chart: c.points and c.size.width > 0 and _labels(c))
            labels = [label for label in _labels(chart) if label]
            assert labels, text_of(chart)
            assert all(RATE.fullmatch(label) for label in labels), labels  # was "1.86 GiB/"
            top = labels[0]
            await wait_for(pilot, lambda t=top: any(t + "│" in row for row in screen_text(app).splitlines()))
            assert chart.size.width <= 80


async def test_a_label_that_cannot_shorten_widens_the_axis_instead_of_losing_its_unit():
    """"2.5k tok/s" keeps its decimal (2k would be 20 % off): the axis takes its 10 columns, every row alike."""
    from textual.app import App, ComposeResult

    from lynxtop.contract.format import fmt_si

    class One(App):
        def compose(self) -> ComposeResult:
            yield TimeChart("Tokens", lambda v: fmt_si(v, "tok/s"), id="c")

    app = One()
    async with app.run_test(size=(80, 8)) as pilot:
        chart = app.query_one("#c", TimeChart)
        chart.set_data([(1000, 2400.0), (2000, 2450.0)], 0, 3000)
        await pilot.pause()
        rows = text_of(chart).splitlines()[1:]
        assert rows[0].startswith("2.5k tok/s│"), rows
        assert {row.index("│") if "│" in row else row.index("└") for row in rows} == {10}, rows
        assert all(len(row) <= 80 for row in rows), rows
