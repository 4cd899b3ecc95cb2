"""Restart, stop and switch confirmations during a load say how much of that load is thrown away (audit s22 #4),
and leave out the draining of in-flight requests, which cannot exist while vLLM loads; at 80x24 the dialog is read
whole with both buttons."""

from __future__ import annotations

from types import SimpleNamespace

from support.tui import make_app, plain, screen_text, wait_for
from support.tui_keys import open_screen
from textual.containers import VerticalScroll
from textual.geometry import Region
from textual.widgets import Button

from lynxtop.contract.records import ProfileInfo
from lynxtop.contract.status import PhaseMark, ServingMetrics, ServingState, ServingStatus
from lynxtop.tui.control_text import confirmation
from lynxtop.tui.screens.confirm import ConfirmScreen

NOW = 1_800_000_000_000


def _loading(minutes: float, now_ms: int = NOW, phase: str = "loading weights") -> ServingStatus:
    started = now_ms - int(minutes * 60_000)
    return ServingStatus(state=ServingState.STARTING, state_since_ms=started, phase=phase,
                         phase_since_ms=started + 60_000, phases=(PhaseMark(phase, started + 60_000),),
                         profile="v4-tp8", run_id=12, pid=4242, model="deepseek-ai/DeepSeek-V4.1", started_ms=started,
                         ready_timeout_s=1800, ready_deadline_ms=started + 1_800_000)


def _busy() -> ServingMetrics:
    return ServingMetrics.from_json({"requests_running": 3, "requests_waiting": 5})


def test_restart_stop_and_switch_during_a_load_say_the_time_lost_and_the_phase():
    serving = _loading(12)
    for action in ("restart", "stop", "switch"):
        _, body, _ = confirmation(action, serving, None, "other", ProfileInfo("v4-tp8"), ProfileInfo("other"),
                                  now_ms=NOW)
        text = plain(body)
        assert "Still loading: 12m00s of this load is lost (phase loading weights)." in text, (action, text)


def test_no_draining_of_requests_is_said_while_loading_even_with_stale_request_counts():
    """Counts left from a previous run's last scrape must not read as requests this load would lose."""
    profile = ProfileInfo("v4-tp8", flags={"--shutdown-timeout": "30"})
    for action in ("restart", "stop"):
        _, body, _ = confirmation(action, _loading(12), _busy(), None, profile, now_ms=NOW)
        text = plain(body)
        assert "drain" not in text and "request(s)" not in text and "in-flight" not in text, (action, text)


def test_a_ready_run_keeps_the_drain_and_request_lines_and_says_no_load_lost():
    ready = ServingStatus(state=ServingState.READY, state_since_ms=NOW - 60_000, profile="v4-tp8", run_id=12,
                          started_ms=NOW - 1_260_000, ready_ms=NOW - 60_000)
    profile = ProfileInfo("v4-tp8", flags={"--shutdown-timeout": "30"})
    _, body, _ = confirmation("stop", ready, _busy(), None, profile, now_ms=NOW)
    text = plain(body)
    assert "drain for the profile's shutdown timeout, 30s" in text and "3 request(s) are running" in text, text
    assert "Still loading" not in text and "The last load took 20m00s" in text, text


def test_the_load_progress_is_added_where_the_status_carries_one():
    """`load_progress` comes from a newer status (another change): its percentage when present, nothing made up
    when absent or not a percentage."""
    serving = _loading(12)
    absent = plain(confirmation("restart", serving, None, None, now_ms=NOW)[1])
    assert "%" not in absent, absent

    # duck-typed: the field's type (contract/status.py's LoadProgress: done, total, pct) is another change's
    fields = {f: getattr(serving, f) for f in serving.__dataclass_fields__}
    serving = SimpleNamespace(**{**fields, "load_progress": SimpleNamespace(done=25, total=60, pct=41.6)})
    text = plain(confirmation("restart", serving, None, None, now_ms=NOW)[1])
    assert "(phase loading weights, 42% loaded)" in text, text


async def test_restart_dialog_12_minutes_into_a_load_at_80x24(agent):
    """As the operator sees it: the dashboard polls a node 12 minutes into a load; R opens a dialog that says so
    and keeps both buttons on an 80x24 screen."""
    app = make_app(agent.socket_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        started = app.node_now_ms() - 12 * 60_000  # the dialog counts on the node's clock
        agent.status["serving"].update(state="starting", state_since_ms=started, started_ms=started, ready_ms=None,
                                       phase="loading weights", phase_since_ms=started,
                                       phases=[{"phase": "loading weights", "ts_ms": started}],
                                       ready_timeout_s=1800, ready_deadline_ms=started + 1_800_000)
        await wait_for(pilot, lambda: app.state.serving.state == ServingState.STARTING)
        dialog = await open_screen(pilot, app, "R", ConfirmScreen)
        text = plain(dialog.body)
        assert "of this load is lost (phase loading weights)" in text and "12m0" in text, text
        assert "drain" not in text, text
        screen = Region(0, 0, *app.size)
        await wait_for(pilot, lambda: all(screen.contains_region(dialog.query_one(f"#{b}", Button).region)
                                          for b in ("cancel", "confirm")))
        body = dialog.query_one("#dialog-body", VerticalScroll)
        assert body.max_scroll_y == 0, body.max_scroll_y  # read whole, nothing to scroll
        assert "this load is lost" in screen_text(app).replace("\n", " "), screen_text(app)
