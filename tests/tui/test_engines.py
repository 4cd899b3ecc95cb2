"""The Serving panel per data-parallel engine (`e`): rows by engine, the lagging engine marked, totals by default;
and the lag rules themselves, without a terminal."""

from __future__ import annotations

from support.status import engine_loads
from support.tui import make_app, screen_text, text_of, wait_for
from support.tui_keys import open_screen
from textual.widgets import Static
from tui_fake_agent import make_status

from lynxtop.contract.status import EngineLoad
from lynxtop.tui.engine_lag import lagging, sorted_engines, summary
from lynxtop.tui.screens.gpu import GpuScreen
from lynxtop.tui.screens.help import HelpScreen
from lynxtop.tui.widgets.engine_table import NO_ENGINES, ONE_ENGINE, EngineTable
from lynxtop.tui.widgets.serving_panel import ServingPanel


def dp8_status(**over):
    """A DP8 node where engine 5 queues and fills its KV cache while the other seven are even."""
    engines = engine_loads(waiting={5: 9}, kv={5: 96.4}, running={5: 14})
    metrics = {"requests_running": sum(e["running"] for e in engines), "requests_waiting": 9,
               "kv_cache_usage_pct": 96.4}
    return make_status(engines=engines, metrics=metrics, **over)


def row_text(table: EngineTable, key: str) -> str:
    return " ".join(" ".join(text_of(c) for c in table.get_row(key)).split())


async def engine_rows(pilot, app, n: int) -> EngineTable:
    """The per-engine table once it lists n engines: `e` before the first status would show no rows yet."""
    await wait_for(pilot, lambda: app.state.connected)
    await pilot.press("e")
    table = app.screen.query_one(EngineTable)
    await wait_for(pilot, lambda: table.row_count == n)
    return table


async def test_e_toggles_totals_and_per_engine_rows(agent):
    agent.status = dp8_status()
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.connected and len(app.state.engines) == 8
                       and "⚠ engine 5 lagging" in str(app.screen.query_one(ServingPanel).border_subtitle))
        serving, table = app.screen.query_one(ServingPanel), app.screen.query_one(EngineTable)
        # totals by default; the border already names the engine that lags
        assert serving.display and not table.display
        assert "TTFT" in text_of(serving) and "run/wait 98/9" in text_of(serving)
        assert "⚠ engine 5 lagging" in str(serving.border_subtitle) and "e shows each" in str(serving.border_subtitle)
        await pilot.press("e")
        await wait_for(pilot, lambda: table.display and table.row_count == 8)
        assert not serving.display
        assert list(table.rows) == [str(i) for i in range(8)]
        assert table.lags.keys() == {"5"}
        row5 = row_text(table, "5")
        assert row5.startswith("⚠ 5 14 9") and "96.4%" in row5 and "9 waiting, others 0" in row5
        assert "KV 96%, others 38%" in row5
        row0 = row_text(table, "0")
        assert row0.startswith("0 12 0") and "37.5%" in row0 and "⚠" not in row0 and "◀" not in row0
        text = text_of(table)
        assert "run/wait 98/9" in text.splitlines()[0]  # the totals stay on top
        assert "engine" in text.splitlines()[1] and "KV cache" in text.splitlines()[1]
        assert table.region.height == 12  # totals, header, 8 engines and the border
        assert "Serving · per engine" in screen_text(app)
        await pilot.press("e")
        await wait_for(pilot, lambda: serving.display and not table.display)
        assert "TTFT" in text_of(serving)


async def test_engine_rows_follow_the_status_and_one_engine_is_said(agent):
    agent.status = dp8_status()
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        table = await engine_rows(pilot, app, 8)
        # engine 5 drains; engine 2 stops running while the others are busy
        agent.status = make_status(engines=engine_loads(running={2: 0}, n=4))
        await wait_for(pilot, lambda: table.row_count == 4)
        assert table.lags == {"2": "runs nothing, others 12"}
        assert "⚠ engine 2 lagging" in str(table.border_subtitle)
        agent.status = make_status(engines=engine_loads(n=4))
        await wait_for(pilot, lambda: not table.lags)
        assert str(table.border_subtitle) == "4 engines, none lagging"
        agent.status = make_status(engines=engine_loads(n=1))
        await wait_for(pilot, lambda: table.row_count == 1)
        assert ONE_ENGINE in text_of(table) and not table.border_subtitle
        agent.status = make_status(state="stopped")
        await wait_for(pilot, lambda: table.row_count == 0)
        assert NO_ENGINES in text_of(table)
        await pilot.press("e")  # back to the totals: no engines, nothing said on the border
        serving = app.screen.query_one(ServingPanel)
        await wait_for(pilot, lambda: serving.display and not serving.border_subtitle)


async def test_many_engines_go_side_by_side_and_fit_80x24(agent):
    agent.status = make_status(engines=engine_loads(waiting={11: 6}, n=16))
    app = make_app(agent.socket_path)
    async with app.run_test(size=(80, 24)) as pilot:
        table = await engine_rows(pilot, app, 16)
        await wait_for(pilot, lambda: "engine 11 lagging" in str(table.border_subtitle))
        lines = text_of(table).splitlines()
        assert len(lines) == 10  # totals, header, 8 rows of two engines
        assert lines[1].count("eng") == 2 and "│" in lines[2]
        assert lines[2].split("│")[0].split()[0] == "0" and lines[2].split("│")[1].split()[0] == "8"
        assert "⚠ engine 11 lagging: 6 waiting, others 0" in str(table.border_subtitle)  # no room for notes
        assert table.region.bottom <= app.size.height - 1  # above the key bar


async def test_key_is_in_footer_and_help(agent):
    agent.status = dp8_status()
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        await wait_for(pilot, lambda: "e Engines" in text_of(app.screen.query_one("#keys")))
        await open_screen(pilot, app, "question_mark", HelpScreen, connected=False)
        help_text = "".join(text_of(w) for w in app.screen.query(Static))
        assert "Engines" in help_text and "against the others' median" in help_text
        await pilot.press("escape")
        # other views do not answer to e: it is the Node view's key
        await pilot.press("2")
        await wait_for(pilot, lambda: isinstance(app.screen, GpuScreen))
        await wait_for(pilot, lambda: "Next GPU" in text_of(app.screen.query_one("#keys")))  # its key bar drawn
        assert "e Engines" not in text_of(app.screen.query_one("#keys"))


def load(engine: str, running: int | None = 12, waiting: int | None = 0, kv: float | None = 40.0) -> EngineLoad:
    return EngineLoad(engine, running, waiting, kv)


def test_an_evenly_busy_node_flags_nothing():
    assert lagging([load(str(i), waiting=3 + i % 3, kv=90.0 + i) for i in range(8)]) == {}
    assert lagging([load("0")]) == {} and lagging([]) == {}


def test_queueing_idle_and_kv_outliers_are_flagged():
    even = [load(str(i)) for i in range(8)]
    assert lagging([*even[:3], load("3", waiting=5), *even[4:]]) == {"3": "5 waiting, others 0"}
    assert lagging([*even[:7], load("7", kv=70.0)]) == {"7": "KV 70%, others 40%"}
    assert lagging([*even[:7], load("7", running=0)]) == {"7": "runs nothing, others 12"}
    assert lagging([*even[:7], load("7", running=0, waiting=1)]) == {"7": "runs nothing, 1 waiting"}
    assert lagging([*even[:7], load("7", waiting=4, kv=99.0)]) == {"7": "4 waiting, others 0; KV 99%, others 40%"}
    # one more waiting than the others is noise, not a lag
    assert lagging([*even[:7], load("7", waiting=1)]) == {}


def test_light_load_idle_engines_are_normal_and_missing_readings_are_skipped():
    light = [load("0", running=1), load("1", running=1), load("2", running=0), load("3", running=0)]
    assert lagging(light) == {}
    unknown = [load("0", running=None, waiting=None, kv=None), load("1", waiting=9)]
    assert lagging(unknown) == {}  # nothing to compare engine 1 with


def test_numeric_order_and_summary():
    engines = sorted_engines([load("10"), load("9"), load("x"), load("0")])
    assert [e.engine for e in engines] == ["0", "9", "10", "x"]
    assert summary(engines, {}) == "4 engines, none lagging"
    assert summary(engines, {"9": "5 waiting, others 0"}) == "⚠ engine 9 lagging: 5 waiting, others 0"
    assert summary(engines, {"9": "why"}, detail=False) == "⚠ engine 9 lagging"
    assert summary(engines, {"0": "a", "9": "b"}) == "⚠ engines 0, 9 lagging"
