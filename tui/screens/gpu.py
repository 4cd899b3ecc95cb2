"""View 2: one GPU over the last 15 minutes, live; ←/→ choose the GPU."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from lynxtop.contract.format import fmt_pct, fmt_rate, fmt_temp, fmt_watts, throttle_words
from lynxtop.tui.glyphs import ascii_text
from lynxtop.tui.live_state import HISTORY_POINTS
from lynxtop.tui.screens import VIEWS_CSS
from lynxtop.tui.screens.base import LiveScreen
from lynxtop.tui.widgets.text_panel import update_static
from lynxtop.tui.widgets.time_chart import TimeChart

WINDOW_MS = 15 * 60 * 1000

# (chart id, title, column(s), formatter, fixed max)
CHARTS = (
    ("sm", "SM activity", "sm_active_pct", fmt_pct, 100.0),
    ("tc", "Tensor activity", "tensor_active_pct", fmt_pct, 100.0),
    ("dram", "DRAM bandwidth", "dram_bw_pct", fmt_pct, 100.0),
    ("util", "util.gpu (coarse)", "util_gpu_pct", fmt_pct, 100.0),
    ("mem", "Memory used", "mem_used_pct", fmt_pct, 100.0),
    ("power", "Power", "power_w", fmt_watts, None),
    ("temp", "Temperature", "temp_c", fmt_temp, None),
    ("nvtx", "NVLink TX", "nvlink_tx_bytes_per_s", fmt_rate, None),
    ("nvrx", "NVLink RX", "nvlink_rx_bytes_per_s", fmt_rate, None),
)


class GpuScreen(LiveScreen):
    CSS_PATH = VIEWS_CSS
    VIEW_TITLE = "GPU"
    BINDINGS = [
        Binding("left,h", "gpu(-1)", "Prev GPU", key_display="←", id="gpu.prev"),
        Binding("right,l", "gpu(1)", "Next GPU", key_display="→", id="gpu.next"),
        # Enter on a GPU row opens this view; Esc backs out of it, as out of every other detail
        Binding("escape", "app.view('node')", "Back", show=False, id="gpu.back"),
    ]

    def compose_body(self) -> ComposeResult:
        yield Static(id="gpu-title")
        with VerticalScroll(id="gpu-charts"):
            for cid, title, _, fmt, vmax in CHARTS:
                yield TimeChart(title, fmt, vmax=vmax, agg="avg", ascii_only=self.lynx.ascii_only,
                                id=f"chart-{cid}", classes="gpu-chart")

    def action_gpu(self, step: int) -> None:
        indices = sorted(g.index for g in self.lynx.state.gpus if isinstance(g.index, int))
        indices = indices or sorted(self.lynx.state.gpu_history)
        if not indices:
            return
        cur = self.lynx.gpu_index
        pos = indices.index(cur) if cur in indices else 0
        self.lynx.gpu_index = indices[(pos + step) % len(indices)]
        self.redraw()

    def draw(self, now_ms: int) -> None:
        app = self.lynx
        state = app.state
        idx = app.gpu_index
        gpu = next((g for g in state.gpus if g.index == idx), None)
        count = len(state.gpus) or len(state.gpu_history)
        line = self.query_one("#gpu-title", Static)
        room = line.size.width or self.size.width
        # The longest that fits whole: the long words give way first, then the UUID (name and bus id still tell
        # GPUs apart); a 40-character UUID does not fit beside the long words even at 120 columns, and below 120
        # it never shows.
        wide = self.size.width >= 120
        for uuid, long in ((True, True), (True, False), (False, False)) if wide else ((False, False),):
            title = Text(f"GPU {idx}", style="bold")
            if gpu is not None:
                ids = (gpu.name, gpu.pci_bus_id, gpu.uuid) if uuid else (gpu.name, gpu.pci_bus_id)
                title.append("  " + "  ".join(str(x) for x in ids if x), style="dim")
                words = throttle_words(gpu.metric("throttle_reasons"))
                if words:
                    title.append("  throttle: " + ", ".join(words), style="yellow")
                if gpu.metric("lost"):
                    title.append("  ✗ LOST", style="bold red")
            title.append(f"   ({count} GPUs; ←/→ to choose; last 15 min, {HISTORY_POINTS} samples max)" if long
                         else f"   ({count} GPUs, ←/→; 15 min)", style="dim")
            shown = ascii_text(title, app.ascii_only)  # measured as drawn: "<-/->" is wider than "←/→"
            if shown.cell_len <= room:
                break
        update_static(line, shown)  # only when changed
        ref = state.ts_ms
        end = int(ref or now_ms)
        start = end - WINDOW_MS
        for cid, _, key, _, _ in CHARTS:
            if key == "mem_used_pct":
                points = [(ts, (row.get("mem_used_bytes") / row["mem_total_bytes"] * 100)
                           if row.get("mem_used_bytes") is not None and row.get("mem_total_bytes") else None)
                          for ts, row in state.gpu_history.get(idx, ())]
            else:
                points = state.gpu_series(idx, key)
            self.query_one(f"#chart-{cid}", TimeChart).set_data(points, start, end, utc=app.utc)
