"""Operator walkthrough, session 25 (`lynxtop demo` in tmux at 120x40, 80x24 and in ASCII): a cut line in ASCII
ends in a mark that reads as cut (`>`), not as a full stop; the Serving panel says one thing while vLLM stops (no N/A
beside the drain's counts); the control dialogs name no model size they do not know; the 80-column start-up line
keeps the phase's detail; the Events table moves with j/k and its Kind key moved to K."""

from __future__ import annotations

from pathlib import Path

import pytest
from steer_history import build_steer_history
from support.status import T0, status_json
from support.tui import make_app, plain, screen_text, text_of, wait_for
from support.tui_keys import open_screen
from textual.widgets import DataTable

from lynxtop.contract.records import ProfileInfo
from lynxtop.contract.status import ServingState, ServingStatus
from lynxtop.tui.control_text import confirmation
from lynxtop.tui.glyphs import ascii_cell
from lynxtop.tui.screens.confirm import ConfirmScreen
from lynxtop.tui.screens.events import EventsScreen
from lynxtop.tui.screens.help import HelpScreen
from lynxtop.tui.screens.profile_picker import ProfilePickerScreen
from lynxtop.tui.widgets.serving_panel import ServingPanel
from lynxtop.tui.widgets.startup_phases import StartupPhases

NOW = T0 + 2000  # make_app's clock


# ------------------------------------------------------------------ 1. a cut line in ASCII


def _autostarting(t: int) -> dict:
    """A load the agent started by itself, as the demo's header shows it: longer than 80 columns."""
    st = status_json("starting", ts_ms=t, phase="loading weights", phase_since_ms=t - 8000, started_ms=t - 8000,
                     state_since_ms=t - 8000, ready_ms=None, run_id=1, ready_timeout_s=600,
                     ready_deadline_ms=t - 8000 + 600_000, phases=[{"phase": "loading weights", "ts_ms": t - 8000}],
                     load_progress={"done": 9, "total": 60, "pct": 15.0})
    st["agent"]["action"] = {"action": "start", "profile": "dsv41-tp8", "since_ms": t - 8000,
                             "by": "agent (autostart)"}
    return st


def test_the_ascii_cell_of_an_ellipsis_reads_as_cut():
    """`>`, as nano and vim mark a line that goes on past the screen's edge; not `~`, the ASCII of the header's
    action mark (`⟳ start`), which stood right before the cut at 80 columns."""
    assert ascii_cell("…") == ">"


async def test_a_cut_header_ends_in_a_cut_mark_in_ascii(agent):
    agent.status = _autostarting(T0)
    app = make_app(agent.socket_path, ascii_only=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: "STARTING" in screen_text(app).splitlines()[0])
        await pilot.pause()
        header = screen_text(app).splitlines()[0]
        assert header.isascii(), header
        assert header.endswith(">") and not header.endswith("."), header  # `star.` read as a full stop


# ------------------------------------------------------------------ 2. the Serving panel while vLLM stops


def _stopping(since_ms: int) -> dict:
    """As the agent serves it while the run drains: nothing is scraped, so no serving metrics."""
    st = status_json("stopping", ts_ms=T0, reason="stopped by uid 1000 (alice)", shutdown_timeout_s=30,
                     stop_grace_s=60)
    st["serving"]["state_since_ms"] = since_ms
    st["serving_metrics"] = {k: None for k in st["serving_metrics"]} | {"run_id": 3}
    return st


@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
async def test_the_serving_panel_says_one_thing_while_vllm_stops(agent, size):
    agent.status = status_json("ready", ts_ms=T0 - 20_000,
                               metrics={"requests_running": 3, "requests_waiting": 1})
    app = make_app(agent.socket_path)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.ts_ms == T0 - 20_000)
        agent.status = _stopping(NOW - 12_000)
        await wait_for(pilot, lambda: app.state.serving.state == ServingState.STOPPING)
        panel = app.screen.query_one(ServingPanel)
        line = app.screen.query_one(StartupPhases)
        await wait_for(pilot, lambda: "draining" in text_of(line) and "stops" in text_of(panel))
        first = text_of(panel).splitlines()[0]
        assert "N/A" not in first, first  # N/A beside the counts read as two answers
        assert "not read while vLLM stops" in first, first
        assert "3/1" in first and "22s ago" in first, first  # the counts, as last read, with their age
        drain = text_of(line)
        assert "draining 3 running, 1 waiting" in drain and "read 22s ago" in drain, drain


# ------------------------------------------------------------------ 3. the load time in the control dialogs


def _loading_run() -> ServingStatus:
    return ServingStatus(state=ServingState.STARTING, state_since_ms=NOW - 60_000, profile="v4-tp8", run_id=12,
                         started_ms=NOW - 60_000, phase="loading weights")


def _ready_run() -> ServingStatus:
    return ServingStatus(state=ServingState.READY, state_since_ms=NOW - 60_000, profile="v4-tp8", run_id=12,
                         started_ms=NOW - 1_260_000, ready_ms=NOW - 60_000)


@pytest.mark.parametrize("action", ["restart", "stop", "switch"])
def test_no_dialog_names_a_model_size_it_does_not_know(action):
    target = ProfileInfo("v4-tp8-ep")
    _, body, _ = confirmation(action, _loading_run(), None, "v4-tp8-ep", ProfileInfo("v4-tp8"), target,
                              now_ms=NOW)
    text = plain(body)
    assert "284B" not in text, text
    assert "a large model can take 10-30 minutes" in text, text


@pytest.mark.parametrize("action", ["restart", "stop"])
def test_a_measured_load_replaces_the_guess(action):
    _, body, _ = confirmation(action, _ready_run(), None, None, ProfileInfo("v4-tp8"), now_ms=NOW)
    text = plain(body)
    assert "The last load took 20m00s" in text and "10-30" not in text and "284B" not in text, text


def test_a_switch_says_the_target_profiles_usual_load_not_the_current_ones():
    _, body, _ = confirmation("switch", _ready_run(), None, "v4-tp8-ep", ProfileInfo("v4-tp8"),
                              ProfileInfo("v4-tp8-ep"), now_ms=NOW, usual_load_ms=95_000)
    text = plain(body)
    assert "v4-tp8-ep usually loads in ~1m35s" in text, text
    assert "20m00s" not in text and "10-30" not in text, text  # v4-tp8's load is not v4-tp8-ep's
    _, body, _ = confirmation("switch", _ready_run(), None, "v4-tp8-ep", ProfileInfo("v4-tp8"),
                              ProfileInfo("v4-tp8-ep"), now_ms=NOW)
    text = plain(body)
    assert "20m00s" not in text and "a large model can take 10-30 minutes" in text, text


def test_a_restart_while_loading_says_the_profiles_usual_load():
    _, body, _ = confirmation("restart", _loading_run(), None, None, ProfileInfo("v4-tp8"), now_ms=NOW,
                              usual_load_ms=1_140_000)
    text = plain(body)
    assert "v4-tp8 usually loads in ~19m00s" in text and "10-30" not in text, text


async def test_the_switch_dialog_reads_the_targets_usual_load_from_the_history(agent, history_db):
    db, _ = history_db  # dsv41-tp8-ep: one ready run, loaded in 1m30s
    app = make_app(agent.socket_path, db)
    async with app.run_test(size=(120, 40)) as pilot:
        picker = await open_screen(pilot, app, "P", ProfilePickerScreen)
        picker.query_one("OptionList").focus()
        picker.query_one("OptionList").highlighted = 1
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        text = plain(app.screen.body)
        assert "dsv41-tp8-ep usually loads in ~1m30s" in text, text
        assert "284B" not in text


# ------------------------------------------------------------------ 4. the start-up line at 80 columns


async def test_the_start_up_line_keeps_the_phase_at_80_columns(agent):
    t = agent.status["ts_ms"]
    agent.status = _autostarting(t)
    app = make_app(agent.socket_path)
    async with app.run_test(size=(80, 24)) as pilot:
        line = app.screen.query_one(StartupPhases)
        await wait_for(pilot, lambda: "9/60" in screen_text(app))
        await pilot.pause()
        shown = screen_text(app).splitlines()[1]
        assert shown.startswith("start-up:"), shown
        assert "▶ loading weights 9/60 shards (15%)" in shown, shown
        assert "· at most 10m00s · next" in shown, shown  # the limit in fewer words, then what comes
        assert "loading weights 9/60 shards (15%)" in text_of(line)


async def test_a_load_about_to_be_stopped_says_its_limit_first_at_80_columns(agent):
    t = agent.status["ts_ms"]
    late = _autostarting(t)
    late["serving"].update(started_ms=t - 570_000, ready_deadline_ms=t + 30_000)  # 30 s left of 10 min
    agent.status = late
    app = make_app(agent.socket_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: "9/60" in screen_text(app))
        await wait_for(pilot, lambda: "of at most" in screen_text(app).splitlines()[1])
        shown = screen_text(app).splitlines()[1]
        assert shown.startswith("start-up: 9m3") and "of at most 10m00s ▶ loading weights 9/60 shards" in shown, shown


async def test_the_start_up_line_keeps_its_long_words_where_they_fit(agent):
    agent.status = _autostarting(agent.status["ts_ms"])
    app = make_app(agent.socket_path)
    async with app.run_test(size=(200, 48)) as pilot:
        await wait_for(pilot, lambda: "9/60" in screen_text(app))
        shown = screen_text(app).splitlines()[1]
        assert "of at most 10m00s (readiness_timeout_s) ▶ loading weights 9/60 shards (15%)" in shown, shown
        assert "· kv cache" in shown, shown


# ------------------------------------------------------------------ 5. j/k in the Events table


@pytest.fixture
def steer_db(tmp_path: Path) -> tuple[Path, dict]:
    path = tmp_path / "history.db"
    return path, build_steer_history(path)


async def test_j_and_k_move_the_events_table_and_kind_is_shift_k(sock_dir, steer_db):
    db, info = steer_db
    app = make_app(sock_dir / "absent.sock", db, utc=True)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_screen(pilot, app, "5", EventsScreen, connected=False)
        await wait_for(pilot, lambda: len(screen.events) == info["events"])
        table = screen.query_one("#events", DataTable)
        await wait_for(pilot, lambda: table.row_count == 5)
        table.focus()
        await pilot.press("j", "j")
        await wait_for(pilot, lambda: table.cursor_row == 2)
        await pilot.press("k")
        await wait_for(pilot, lambda: table.cursor_row == 1)
        assert screen.kind is None  # k moved the cursor, it did not filter
        await pilot.press("K")
        await wait_for(pilot, lambda: screen.kind == "action.")
        filters = text_of(screen.query_one("#events-filters"))
        assert "kind (K): action.*" in filters, filters
        assert "K Kind" in text_of(screen.query_one("#keys")), text_of(screen.query_one("#keys"))
        await open_screen(pilot, app, "question_mark", HelpScreen, connected=False)
        keys = dict(app.screen.keys)
        assert keys.get("K") == "Kind" and keys.get("k") == "Up" and keys.get("j") == "Down", keys
