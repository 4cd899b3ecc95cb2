"""View 1: the whole node at a glance: GPUs, serving, start-up progress."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Static

from lynxtop.tui.screens.base import LiveScreen
from lynxtop.tui.widgets.gpu_table import UTIL_NOTE, GpuTable
from lynxtop.tui.widgets.serving_panel import ServingPanel
from lynxtop.tui.widgets.startup_phases import StartupPhases


class NodeScreen(LiveScreen):
    VIEW_TITLE = "Node"

    def compose_body(self) -> ComposeResult:
        yield StartupPhases(id="phases")
        yield GpuTable(ascii_only=self.lynx.ascii_only, id="gpus")
        yield Static(Text(UTIL_NOTE, style="dim"), id="util-note")
        yield ServingPanel(ascii_only=self.lynx.ascii_only, id="serving")

    def on_compact_changed(self, compact: bool) -> None:
        self.query_one(GpuTable).set_compact(compact)

    def draw(self, now_ms: int) -> None:
        state = self.lynx.state
        self.query_one(StartupPhases).show(state.section("serving"), now_ms)
        table = self.query_one(GpuTable)
        table.show(state.gpus)
        self.query_one(ServingPanel).show(state)

    def on_gpu_table_selected(self, event: GpuTable.Selected) -> None:
        # Enter on a GPU row opens its 15-minute view.
        self.lynx.open_gpu(event.index)
