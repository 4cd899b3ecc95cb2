"""s23: the restart/stop dialog's "Still loading: 12m00s of this load is lost" counts on while the operator thinks:
the figure advances once a second on the node's clock (whoever began the load), and the body is not redrawn while
its text stays the same."""

from __future__ import annotations

from support.status import T0
from support.tui import make_app, plain, wait_for
from support.tui_keys import open_screen
from textual.widgets import Static

from lynxtop.contract.status import ServingState
from lynxtop.tui.screens.confirm import ConfirmScreen

SKEW_MS = -3_600_000  # the node's clock an hour behind this machine's: the dialog counts on the node's


async def test_the_time_lost_in_the_load_ticks_while_the_dialog_is_open(agent):
    now = [T0 / 1000 + 2]  # this machine's clock, moved by the test only
    app = make_app(agent.socket_path, clock=lambda: now[0])

    def node_ms() -> int:
        return int(now[0] * 1000) + SKEW_MS

    agent.status["now_ms"] = node_ms()
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.connected and app.state.clock_offset_ms == SKEW_MS)
        started = node_ms() - 12 * 60_000  # begun by the agent's own retry, say: whoever began it, it counts
        agent.status["serving"].update(state="starting", state_since_ms=started, started_ms=started, ready_ms=None,
                                       phase="loading weights", phase_since_ms=started,
                                       phases=[{"phase": "loading weights", "ts_ms": started}],
                                       ready_timeout_s=1800, ready_deadline_ms=started + 1_800_000)
        await wait_for(pilot, lambda: app.state.serving.state == ServingState.STARTING)
        dialog = await open_screen(pilot, app, "R", ConfirmScreen)
        assert "Still loading: 12m00s of this load is lost (phase loading weights)." in plain(dialog.body)

        # counted: each tick's look at the body, and each redraw of it
        text = dialog.query_one("#dialog-text", Static)
        looks, redraws = [0], [0]
        live, update = dialog.live, text.update
        assert live is not None

        def counted_live():
            looks[0] += 1
            return live()

        def counted_update(*a, **kw):
            redraws[0] += 1
            return update(*a, **kw)

        dialog.live = counted_live
        text.update = counted_update  # type: ignore[method-assign]

        # the clocks stand still: ticks come, nothing is redrawn
        await wait_for(pilot, lambda: looks[0] >= 3)
        assert redraws[0] == 0 and "12m00s" in plain(dialog.body)

        # five seconds pass on both clocks: the figure follows, in one redraw
        agent.status["now_ms"] = node_ms() + 5_000  # the node first: a status read in between reads 12m00s
        now[0] += 5
        await wait_for(pilot, lambda: "12m05s" in plain(text.content))
        assert "Still loading: 12m05s of this load is lost (phase loading weights)." in plain(dialog.body)
        seen = looks[0]
        await wait_for(pilot, lambda: looks[0] >= seen + 2)
        assert redraws[0] == 1, redraws
        assert dialog.query_one("#cancel").has_focus  # a tick leaves the focus where it is... (Cancel at open)

        # ...and never takes it back: the operator on the confirm button stays there while the figure ticks
        await pilot.press("right")
        assert dialog.query_one("#confirm").has_focus
        agent.status["now_ms"] = node_ms() + 60_000
        now[0] += 60
        await wait_for(pilot, lambda: "13m05s" in plain(text.content))
        assert dialog.query_one("#confirm").has_focus and redraws[0] == 2
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
