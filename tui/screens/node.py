"""View 1: the whole node at a glance: GPUs, serving, start-up progress; on tall terminals also per-GPU
sparklines and the last events."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Static

from lynxtop.contract.client import AgentRefused, AgentUnreachable
from lynxtop.tui.screens.base import LiveScreen
from lynxtop.tui.widgets.engine_table import EngineTable
from lynxtop.tui.widgets.gpu_table import UTIL_NOTE, GpuTable
from lynxtop.tui.widgets.gpu_trends import GpuTrends
from lynxtop.tui.widgets.recent_events import RecentEvents
from lynxtop.tui.widgets.serving_panel import ServingPanel
from lynxtop.tui.widgets.startup_phases import StartupPhases

if TYPE_CHECKING:
    from lynxtop.contract.events import Event

EVENTS_REFRESH_S = 5.0
EVENTS_LIMIT = 40


class NodeScreen(LiveScreen):
    VIEW_TITLE = "Node"
    BINDINGS = [Binding("e", "toggle_engines", "Engines", id="node.engines",
                        tooltip="Serving: totals, or each data-parallel engine (the lagging one marked)")]

    def __init__(self) -> None:
        super().__init__()
        self.per_engine = False  # the Serving panel shows the totals until `e`
        self.events: list[Event] | None = None
        self.events_note = ""
        self._events_fetched = 0.0

    def compose_body(self) -> ComposeResult:
        yield StartupPhases(id="phases")
        yield GpuTable(ascii_only=self.lynx.ascii_only, id="gpus")
        yield Static(Text(UTIL_NOTE, style="dim"), id="util-note")
        yield ServingPanel(ascii_only=self.lynx.ascii_only, id="serving")
        yield EngineTable(ascii_only=self.lynx.ascii_only, id="engines")
        yield GpuTrends(ascii_only=self.lynx.ascii_only, id="gpu-trends")
        yield RecentEvents(id="recent-events")

    def on_compact_changed(self, compact: bool) -> None:
        self.query_one(GpuTable).set_compact(compact)

    def draw(self, now_ms: int) -> None:
        state = self.lynx.state
        self.query_one(StartupPhases).show(state.serving, now_ms, state.reading_at_stop())
        table = self.query_one(GpuTable)
        table.show(state.gpus)
        if self.per_engine:
            self.query_one(EngineTable).show(state, now_ms)
        else:
            self.query_one(ServingPanel).show(state, now_ms)
        if self.has_class("-tall"):
            # The extra panels draw (and events are asked for) only where they are shown.
            ref = state.ts_ms
            self.query_one(GpuTrends).show(state, int(ref or now_ms))
            if time.monotonic() - self._events_fetched > EVENTS_REFRESH_S:
                self.fetch_events()
            self.query_one(RecentEvents).show(self.events, self.lynx.utc, self.events_note)

    @work(exclusive=True, group="node-events", exit_on_error=False)
    async def fetch_events(self) -> None:
        self._events_fetched = time.monotonic()
        try:
            events = await self.lynx.source.events(limit=EVENTS_LIMIT)
        except (AgentUnreachable, AgentRefused) as exc:
            self.events_note = f"events unavailable: {exc}"
        else:
            self.events = sorted(events, key=lambda e: (e.ts_ms or 0, e.id or 0), reverse=True)
            self.events_note = ""
        if self.has_class("-tall"):
            self.query_one(RecentEvents).show(self.events, self.lynx.utc, self.events_note)

    def action_toggle_engines(self) -> None:
        self.per_engine = not self.per_engine
        self.set_class(self.per_engine, "-engines")
        self.call_after_refresh(self.redraw)  # after the layout: the panel just shown has its width then

    def on_gpu_table_selected(self, event: GpuTable.Selected) -> None:
        # Enter on a GPU row opens its 15-minute view.
        self.lynx.open_gpu(event.index)
