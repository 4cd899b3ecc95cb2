"""s22: the dashboard during a long load: the shards' progress on the start-up line and in the header, a log gone
silent told apart from a slow load, and how long the profile usually loads (from the history, in a worker)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from support.tui import make_app, text_of, wait_for
from tui_fake_agent import make_status

from lynxtop.store import schema
from lynxtop.tui.widgets.node_header import NodeHeader
from lynxtop.tui.widgets.startup_phases import StartupPhases


def _loading(t: int, **over) -> dict:
    return make_status(state="starting", ts_ms=t, phase="loading weights", phase_since_ms=t - 552_000,
                       started_ms=t - 600_000, state_since_ms=t - 600_000, ready_ms=None, profile="v4", run_id=9,
                       phases=[{"phase": "loading weights", "ts_ms": t - 552_000}],
                       load_progress={"done": 27, "total": 60, "pct": 45.0}, **over)


def _history(tmp_path: Path) -> Path:
    path = tmp_path / "h.db"
    schema.create_file(path)
    c = sqlite3.connect(path, isolation_level=None)
    schema.migrate(c)
    for started, ready in ((0, 1_100_000), (0, 1_140_000), (0, 1_200_000)):  # 18m20s, 19m00s, 20m00s
        c.execute("INSERT INTO runs (profile, started_ms, ready_ms) VALUES ('v4', ?, ?)", (started, ready))
    c.execute("INSERT INTO runs (profile, started_ms) VALUES ('v4', 0)")  # the load under way
    c.close()
    return path


async def test_progress_silence_and_usual_time_on_the_start_up_line(agent, tmp_path):
    t = agent.status["ts_ms"]
    agent.status = _loading(t, log_grew_ms=t - 252_000)
    app = make_app(agent.socket_path, _history(tmp_path))
    async with app.run_test(size=(200, 48)) as pilot:
        phases = app.screen.query_one(StartupPhases)
        await wait_for(pilot, lambda: "usually" in text_of(phases))
        text = text_of(phases)
        assert "▶ loading weights 27/60 shards (45%) 9m1" in text, text
        assert "log silent 4m1" in text, text
        assert "usually ready in ~19m00s" in text, text
        header = text_of(app.screen.query_one(NodeHeader))
        assert "loading weights 27/60" in header and "log silent 4m1" in header, header


async def test_a_writing_load_and_an_older_agent_show_no_silence(agent, tmp_path):
    t = agent.status["ts_ms"]
    agent.status = _loading(t, log_grew_ms=t - 3000)
    app = make_app(agent.socket_path)  # no history: no usual time, no error
    async with app.run_test(size=(200, 48)) as pilot:
        phases = app.screen.query_one(StartupPhases)
        await wait_for(pilot, lambda: "27/60" in text_of(phases))
        await pilot.pause(0.3)
        assert "silent" not in text_of(phases) and "usually" not in text_of(phases)
        older = _loading(t)
        del older["serving"]["load_progress"]
        agent.status = older
        await wait_for(pilot, lambda: "27/60" not in text_of(phases))
        assert "▶ loading weights" in text_of(phases) and "silent" not in text_of(phases)
        assert app._exception is None
