"""The dashboard as a 3 a.m. operator reads it after a switch (UX audit): req/s over this run only, the History
run list's end column readable, the Latency view's breach count as the Events log counts them, the Events log
at its newest line and a filter that matches nothing saying so."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.tui import make_app, screen_text, text_of, wait_for
from support.tui_keys import open_screen
from textual.widgets import DataTable, Log
from tui_fake_agent import T0, make_status, serving_metrics

from lynxtop.tui.screens.events import EventsScreen
from lynxtop.tui.screens.history import HistoryScreen
from lynxtop.tui.screens.latency import LatencyScreen
from lynxtop.tui.widgets.serving_panel import ServingPanel
from lynxtop.tui.widgets.time_chart import TimeChart


async def test_req_rate_after_a_switch_is_this_runs_mean_over_the_span_used(agent):
    """The old run served 2 req/s; the switch's downtime served none; the new run, READY for 3 s, 1 req/s: the
    panel reads 1.00 over 3 s, not a mean over the old run and the downtime labelled `avg 12s`."""
    t0 = agent.status["ts_ms"]
    old_ready = agent.status["serving"]["ready_ms"]
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        series = app.state.serving_series
        ticks = [(k, "ready", old_ready, 3, 2.0) for k in range(1, 6)]  # t0 itself: the first poll
        ticks += [(k, "starting", None, 4, 0.0) for k in range(6, 9)]
        ticks += [(k, "ready", t0 + 8000, 4, 1.0) for k in range(9, 12)]
        for k, state, ready, run, finished in ticks:
            ts = t0 + 1000 * k
            agent.status = make_status(state=state, ts_ms=ts, ready_ms=ready, run_id=run,
                                       metrics={"requests_per_s": finished})
            await wait_for(pilot, lambda ts=ts, v=finished: series("requests_per_s")[-1:] == [(ts, v)])
        panel = app.screen.query_one(ServingPanel)
        await wait_for(pilot, lambda: app.state.serving.ready_ms == t0 + 8000)
        await wait_for(pilot, lambda: "req/s 1.00 avg 3s" in text_of(panel).splitlines()[0])


def _demo_like_history(path: Path) -> None:
    """Runs as `lynxtop demo` names them: long profiles, and a switch's end reason."""
    from lynxtop.store.writer import StoreWriter

    w = StoreWriter(path, clock=lambda: T0 / 1000)
    w.start()
    old = w.create_run(profile="deepseek-v4.1-tp8", argv=["vllm"], model="m", host="h", started_ms=T0 - 3_600_000,
                       pid=1, log_path="", simulated=True, flags={})
    w.update_run(old, ready_ms=T0 - 3_500_000, ended_ms=T0 - 1_800_000, exit_code=0,
                 end_reason="switched to deepseek-v4.1-tp8-fp8kv")
    new = w.create_run(profile="deepseek-v4.1-tp8-fp8kv", argv=["vllm"], model="m", host="h",
                       started_ms=T0 - 1_790_000, pid=2, log_path="", simulated=True, flags={})
    w.update_run(new, ready_ms=T0 - 1_700_000)
    w.close()


async def test_history_run_list_end_column_is_readable_and_apart_from_the_charts(sock_dir, tmp_path):
    db = tmp_path / "history.db"
    _demo_like_history(db)
    app = make_app(sock_dir / "none.sock", db)
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_screen(pilot, app, "4", HistoryScreen, connected=False)
        await wait_for(pilot, lambda: len(screen.runs) == 2)
        await pilot.pause()
        lines = screen_text(app).splitlines()
        header = next(ln for ln in lines if ln.lstrip().startswith("run ") and "profile" in ln)
        # the end column's header is apart from the chart title beside it
        assert re.search(r"end +SM activity", header), header
        assert any("running" in ln for ln in lines), "\n".join(lines)
        assert any("switched" in ln for ln in lines), "\n".join(lines)


def _latency_rows(ttft: list[float | None], scrape_ok: int = 1) -> list[dict]:
    """Stored serving rows one second apart, ending a second before the fake agent's first status."""
    n = len(ttft)
    return [{"ts_ms": T0 - (n - i) * 1000, **serving_metrics(ttft_p99_ms=v, tpot_p99_ms=None if v is None else 100.0,
                                                            scrape_ok=scrape_ok)} for i, v in enumerate(ttft)]


async def test_latency_breach_count_is_the_agents_episodes(agent):
    """Two breaches with an idle stretch between (no latency data: the agent closes the first with sla.recovered
    and opens a second sla.breach): two ▲ runs on the chart, and the title says 2, as the Events do."""
    ttft = [500.0] * 10 + [3000.0] * 10 + [None] * 10 + [3000.0] * 10 + [500.0] * 10
    app = make_app(agent.socket_path)
    app.state.backfill(_latency_rows(ttft), [])
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_screen(pilot, app, "3", LatencyScreen)
        chart = screen.query_one("#chart-ttft-p99", TimeChart)
        await wait_for(pilot, lambda: "▲ 2 breaches in 15m00s" in text_of(chart).splitlines()[0])


async def test_latency_breach_held_through_failed_scrapes_is_one_episode(agent):
    """A failed scrape (vLLM restarting behind the agent) within the SLA window holds the open breach: one."""
    ttft = [500.0] * 10 + [3000.0] * 10 + [None] * 5 + [3000.0] * 10 + [500.0] * 10
    rows = _latency_rows(ttft)
    for row in rows[20:25]:
        row["scrape_ok"] = 0
    app = make_app(agent.socket_path)
    app.state.backfill(rows, [])
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_screen(pilot, app, "3", LatencyScreen)
        chart = screen.query_one("#chart-ttft-p99", TimeChart)
        await wait_for(pilot, lambda: "▲ 1 breach in 15m00s" in text_of(chart).splitlines()[0])


@pytest.mark.parametrize("size", [(160, 45), (80, 24), (120, 40)])
async def test_events_log_opens_at_its_newest_line(agent, size):
    agent.log_lines = [f"INFO line {i}" for i in range(300)]
    app = make_app(agent.socket_path)
    async with app.run_test(size=size) as pilot:
        screen = await open_screen(pilot, app, "5", EventsScreen)
        log = screen.query_one("#log", Log)
        await wait_for(pilot, lambda: log.line_count == 300 and log.max_scroll_y > 0)
        await wait_for(pilot, lambda: log.scroll_y == log.max_scroll_y)
        await wait_for(pilot, lambda: "INFO line 299" in screen_text(app))


async def test_events_filter_matching_nothing_says_so(agent):
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_screen(pilot, app, "5", EventsScreen)
        await wait_for(pilot, lambda: len(screen.events) == 3)
        screen.query_one("#events", DataTable).focus()
        await pilot.press("slash", *"nosuchthing", "enter")
        await wait_for(pilot, lambda: "no events match 'nosuchthing'; Esc clears" in screen_text(app))
        await pilot.press("escape")
        await wait_for(pilot, lambda: "no events match" not in screen_text(app))
