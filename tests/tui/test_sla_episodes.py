"""The Latency view counts breach episodes, as the agent's sla.breach events do, and says over what span (28.1)."""

from __future__ import annotations

from support.tui import plain, wait_for
from textual.app import App, ComposeResult

from lynxtop.contract.format import fmt_ms
from lynxtop.tui.widgets.time_chart import TimeChart

T0 = 1_760_000_000_000


class _ChartApp(App):
    def compose(self) -> ComposeResult:
        yield TimeChart("TTFT p99", fmt_ms, id="chart")


async def test_one_long_breach_is_one_episode_not_one_per_column():
    # 75 s above the 2 s limit, one sample a second, then back under: one sla.breach event's worth
    points = [(T0 + i * 1000, 3000.0 if 10 <= i < 85 else 500.0) for i in range(120)]
    app = _ChartApp()
    async with app.run_test(size=(120, 12)) as pilot:
        chart = app.query_one(TimeChart)
        chart.set_data(points, T0, T0 + 120_000, threshold=2000)
        await wait_for(pilot, lambda: "▲ 1 breach in 2m00s" in plain(chart.render()).splitlines()[0])
        # a second spike is a second episode
        chart.set_data([*points, (T0 + 121_000, 2500.0)], T0, T0 + 122_000, threshold=2000)
        await wait_for(pilot, lambda: "▲ 2 breaches in 2m02s" in plain(chart.render()).splitlines()[0])
