"""Node view, header and agent-lost/back behaviour against the fake agent."""

from __future__ import annotations

import time

from support.tui import make_app, text_of, wait_for
from tui_fake_agent import gpu_row, make_status

from lynxtop.tui.screens.node import NodeScreen
from lynxtop.tui.widgets.gpu_table import GpuTable
from lynxtop.tui.widgets.gpu_trends import GpuTrends
from lynxtop.tui.widgets.node_header import NodeHeader
from lynxtop.tui.widgets.outage_banner import OutageBanner
from lynxtop.tui.widgets.recent_events import RecentEvents
from lynxtop.tui.widgets.serving_panel import ServingPanel
from lynxtop.tui.widgets.startup_phases import StartupPhases


async def test_node_view_shows_gpus_serving_and_simulated(agent):
    agent.status["gpus"][3] = gpu_row(3, throttle_reasons=0x20 | 0x4, temp_c=91, sm_active_pct=None)
    agent.status["gpus"][5] = gpu_row(5, lost=1)
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.status is not None and
                       app.screen.query_one(GpuTable).row_count == 8)
        assert isinstance(app.screen, NodeScreen)
        header = text_of(app.screen.query_one(NodeHeader))
        assert "SIMULATED" in header and "h200-node-07" in header and "dsv41-tp8" in header
        assert "READY" in header and "vLLM 0.11.0" in header and "SLA ✓ ok" in header
        table = app.screen.query_one(GpuTable)
        row3 = " ".join(text_of(c) for c in table.get_row("3"))
        assert "SW power cap" in row3 and "SW thermal" in row3
        assert "N/A" in row3  # SM activity unreadable is N/A, never 0
        assert "91°C" in row3
        row5 = " ".join(text_of(c) for c in table.get_row("5"))
        assert "LOST" in row5
        row0 = " ".join(text_of(c) for c in table.get_row("0"))
        assert "130 GiB/141 GiB" in row0 and "550 W/700 W" in row0
        serving = text_of(app.screen.query_one(ServingPanel))
        assert "1.23k" in serving and "12/2" in serving and "37.5%" in serving and "61.0%" in serving
        assert "TTFT" in serving and "750 ms" in serving  # ttft p99 = 300 * 2.5


async def test_rows_update_in_place_and_gpu_removal(agent):
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.status is not None)
        table = app.screen.query_one(GpuTable)
        await wait_for(pilot, lambda: table.row_count == 8)
        agent.status = make_status(gpus=7)
        agent.status["gpus"][0]["temp_c"] = 77
        await wait_for(pilot, lambda: table.row_count == 7)
        await wait_for(pilot, lambda: "77°C" in " ".join(text_of(c) for c in table.get_row("0")))


async def test_startup_phases_shown_phase_by_phase(agent):
    t = agent.status["ts_ms"]
    agent.status = make_status(state="starting", ts_ms=t, phase="kv cache", phase_since_ms=t - 40_000,
                               started_ms=t - 300_000, state_since_ms=t - 300_000,
                               phases=[{"phase": "loading weights", "ts_ms": t - 290_000},
                                       {"phase": "kv cache", "ts_ms": t - 40_000}])
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        phases = app.screen.query_one(StartupPhases)
        await wait_for(pilot, lambda: phases.has_class("-visible"))
        text = text_of(phases)
        assert "✓ loading weights 4m10s" in text
        assert "▶ kv cache" in text
        assert "· cuda graphs" in text and "· api up" in text
        assert "STARTING" in text_of(app.screen.query_one(NodeHeader))


async def test_agent_lost_then_back_one_notice_per_outage(agent):
    app = make_app(agent.socket_path)
    notices: list[str] = []
    async with app.run_test(size=(120, 40)) as pilot:
        original = app.notify

        def spy(message, *a, **kw):
            notices.append(f"{kw.get('title', '')}: {message}")
            return original(message, *a, **kw)

        app.notify = spy  # type: ignore[method-assign]
        await wait_for(pilot, lambda: app.state.connected)
        agent.stop()
        banner = app.screen.query_one(OutageBanner)
        await wait_for(pilot, lambda: banner.has_class("-visible"))
        # several failed polls (backoff capped at 0.2 s) but one notice
        await wait_for(pilot, lambda: app.backoff.failures >= 4)
        lost = [n for n in notices if n.startswith("Agent unreachable")]
        assert len(lost) == 1, notices
        assert app.screen.has_class("-stale")
        text = text_of(banner)
        assert "agent unreachable since" in text and "no agent socket" in text
        # last values are kept on screen
        assert app.screen.query_one(GpuTable).row_count == 8
        # controls are greyed while nothing can receive them
        assert app.check_action("control", ("restart",)) is None
        await wait_for(pilot, lambda: "R Restart" in text_of(app.screen.query_one("#keys")))
        agent.start()
        await wait_for(pilot, lambda: app.state.connected and not banner.has_class("-visible")
                       and not app.screen.has_class("-stale")
                       and any(n.startswith("Agent reachable") for n in notices))
        assert len([n for n in notices if n.startswith("Agent reachable")]) == 1
        agent.stop()
        await wait_for(pilot, lambda: app.state.stale
                       and len([n for n in notices if n.startswith("Agent unreachable")]) >= 2)
        assert len([n for n in notices if n.startswith("Agent unreachable")]) == 2


async def test_no_agent_at_all_shows_waiting_and_banner(sock_dir):
    app = make_app(sock_dir / "absent.sock")
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.screen.query_one(OutageBanner).has_class("-visible"))
        assert "waiting for the agent" in text_of(app.screen.query_one(NodeHeader))
        assert "no data yet" in text_of(app.screen.query_one(OutageBanner))


async def test_too_small_terminal_message(agent):
    app = make_app(agent.socket_path)
    async with app.run_test(size=(70, 20)) as pilot:
        await wait_for(pilot, lambda: app.screen.has_class("-too-small"))
        assert "needs at least 80×24" in text_of(app.screen.query_one("#too-small"))
        await pilot.resize_terminal(80, 24)
        await wait_for(pilot, lambda: not app.screen.has_class("-too-small"))
        assert app.screen.has_class("-compact")


async def test_stalled_sampling_is_flagged(agent):
    app = make_app(agent.socket_path, clock=lambda: agent.status["ts_ms"] / 1000 + 42)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: "samples 42s old" in text_of(app.screen.query_one(NodeHeader)))


async def test_ansi_theme_ascii_bars_and_no_color(agent, monkeypatch):
    monkeypatch.setenv("TERM", "linux")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("LYNXTOP_ASCII", "1")
    app = make_app(agent.socket_path)
    assert app.theme == "ansi-dark" and app.no_color
    async with app.run_test(size=(160, 48)) as pilot:
        table = app.screen.query_one(GpuTable)
        await wait_for(pilot, lambda: table.row_count == 8)
        row = " ".join(text_of(c) for c in table.get_row("0"))
        assert "######...." in row and "█" not in row  # 60 % SM activity in ASCII


async def test_refresh_never_doubles_the_poll_rate(agent):
    app = make_app(agent.socket_path, poll_interval_s=0.5)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)

        def status_polls() -> list[float]:  # arrival times at the agent (the agent's thread appends meanwhile)
            return [t for (_, p, _), t in zip(agent.requests, agent.request_times, strict=False) if p == "/v1/status"]

        def timer_poll() -> int | None:
            """The first poll that came a full interval after the one before it once the presses were done: the
            presses' own polls come at once, so the measured span starts with the timer's chain."""
            ts = status_polls()
            return next((i for i in range(1, len(ts)) if ts[i] > pressed and ts[i] - ts[i - 1] >= 0.45), None)

        for _ in range(5):
            await pilot.press("r")
        pressed = time.monotonic()
        await wait_for(pilot, lambda: timer_poll() is not None, 60)
        first = timer_poll()
        assert first is not None
        await wait_for(pilot, lambda: len(status_polls()) >= first + 7, 60)  # polling goes on
        times = status_polls()[first:first + 7]
        # One chain arms the next poll 0.5 s after the last answer: polls arrive at least 0.5 s apart however
        # slowly the machine runs. A second chain would put some within ~0.25 s (twice the rate).
        gaps = [round(b - a, 3) for a, b in zip(times, times[1:], strict=False)]
        assert min(gaps) >= 0.45, gaps


async def test_request_rate_is_the_average_over_the_window(agent):
    """Requests of 30+ s finish in few ticks: the tick's rate reads 0.00 while requests run; the panel shows
    the mean over the last minutes and says so."""
    agent.status["serving_metrics"]["requests_per_s"] = 0.0
    t0 = agent.status["ts_ms"]
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        series = app.state.serving_series
        await wait_for(pilot, lambda: series("requests_per_s")[-1:] == [(t0, 0.0)])
        for k, finished in enumerate((0.0, 2.0, 0.0, 0.0)):
            ts = t0 + 1000 * (k + 1)
            agent.status = make_status(ts_ms=ts)
            agent.status["serving_metrics"]["requests_per_s"] = finished
            await wait_for(pilot, lambda ts=ts, v=finished: series("requests_per_s")[-1:] == [(ts, v)])
        panel = app.screen.query_one(ServingPanel)
        # 2 requests finished in 5 one-second ticks
        await wait_for(pilot, lambda: "req/s 0.40 avg 5s" in text_of(panel).splitlines()[0])
        # serving stops: the last run's average is not a rate of this moment
        agent.status = make_status(ts_ms=t0 + 6000)
        agent.status["serving"]["state"] = "stopped"
        await wait_for(pilot, lambda: app.state.serving.state == "stopped"
                       and "req/s N/A" in text_of(panel).splitlines()[0])
        stats = text_of(panel).splitlines()[0]
        assert "req/s N/A" in stats and "avg" not in stats.split("req/s", 1)[1].split("tok/s", 1)[0], stats


async def test_tall_terminal_shows_per_gpu_sparklines_and_recent_events(agent):
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        screen = app.screen
        assert isinstance(screen, NodeScreen) and screen.has_class("-tall")
        trends, events = screen.query_one(GpuTrends), screen.query_one(RecentEvents)
        await wait_for(pilot, lambda: "SW thermal" in text_of(events))
        assert trends.display and events.display
        rows = text_of(trends).splitlines()
        assert "SM act" in rows[0] and "Temp" in rows[0]
        assert len(rows) == 9 and "550 W" in rows[1] and "67°C" in rows[8]  # one row per GPU
        lines = text_of(events).splitlines()
        assert "GPU 3 SW thermal slowdown" in lines[0] and "starting dsv41-tp8" in lines[2]  # newest first
        # the events panel reaches down to the key bar: no empty rows left below
        assert events.region.bottom == app.size.height - 1
        await pilot.resize_terminal(120, 40)
        await wait_for(pilot, lambda: not screen.has_class("-tall") and not trends.display and not events.display)


async def test_no_extra_panels_or_event_polls_below_tall(agent):
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        # a few status polls answered: an events poll of the tall layout would have come with them
        await wait_for(pilot, lambda: sum(1 for _, p, _ in agent.requests if p == "/v1/status") >= 3)
        assert not app.screen.query_one(GpuTrends).display
        assert not any(p == "/v1/events" for _, p, _ in agent.requests)


async def test_header_agrees_with_the_banner_and_freezes_timers_when_unreachable(agent):
    """Header and banner read one staleness rule: no `agent ✓` under an 'unreachable' banner, and a STOPPING
    timer stops at the last answer instead of counting on past a stop that may have finished (issue 28.1)."""
    from support.status import T0, status_json

    agent.status = status_json("stopping", state_since_ms=T0 - 5_000)
    now = {"s": T0 / 1000}
    app = make_app(agent.socket_path, clock=lambda: now["s"])
    async with app.run_test(size=(160, 48)) as pilot:
        header = app.screen.query_one(NodeHeader)
        await wait_for(pilot, lambda: "STOPPING 5s" in text_of(header) and "agent ✓" in text_of(header))
        agent.stop()
        banner = app.screen.query_one(OutageBanner)
        await wait_for(pilot, lambda: banner.has_class("-visible"))
        now["s"] += 600
        await wait_for(pilot, lambda: app.backoff.failures >= 3 and "agent ✗ unreachable" in text_of(header))
        text = text_of(header)
        assert "agent ✓" not in text and "agent ✗ unreachable" in text
        assert "STOPPING 5s" in text, text


async def test_sla_breach_says_which_p99_and_the_window_the_serving_panel_uses(agent):
    """A BREACH badge over a panel whose TTFT p99 is under its limit names the p99 that is over, and both say
    the window they are computed over, so they never read as a contradiction (issue 28.1)."""
    from support.status import status_json

    agent.status = status_json(sla={"state": "breach", "ttft_p99_ms": 498.0, "tpot_p99_ms": 3100.0})
    app = make_app(agent.socket_path)
    async with app.run_test(size=(200, 48)) as pilot:
        await wait_for(pilot, lambda: "SLA ✗ BREACH TPOT 3.10 s p99/60s" in text_of(app.screen.query_one(NodeHeader)))
        assert "over 60s" in str(app.screen.query_one(ServingPanel).border_title)
