"""Per-GPU sparklines of the last minutes, one row per GPU: shown on tall terminals, where the node view
has room to show whether the GPUs move together or one of them lags (a straggler stalls a TP8 run)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Any

from rich.text import Text

from lynxtop.contract.format import NA, fmt_pct, fmt_temp, fmt_watts
from lynxtop.contract.status import GpuStatus
from lynxtop.tui.glyphs import glyph
from lynxtop.tui.live_state import LiveState
from lynxtop.tui.plot import bucketize, reading_interval, sparkline
from lynxtop.tui.widgets.text_panel import TextPanel

TRENDS_WINDOW_MS = 5 * 60 * 1000
TEMP_SCALE_C = 100.0  # one fixed scale for every GPU: rows compare with each other

# (column, label, formatter); power scales to the largest power limit, temperature to TEMP_SCALE_C
TREND_COLUMNS: tuple[tuple[str, str, Callable[[float | None], str]], ...] = (
    ("sm_active_pct", "SM act", fmt_pct),
    ("tensor_active_pct", "Tensor", fmt_pct),
    ("power_w", "Power", fmt_watts),
    ("temp_c", "Temp", fmt_temp),
)
VALUE_W = 6
INDEX_W = 4


class GpuTrends(TextPanel):
    DEFAULT_CSS = "GpuTrends { height: 11; border: round $primary-darken-2; padding: 0 1; }"

    def __init__(self, ascii_only: bool = False, **kwargs: Any):
        super().__init__(**kwargs)
        self.ascii_only = ascii_only
        self.border_title = "Per GPU, last 5 min"

    def show(self, state: LiveState, end_ms: int) -> None:
        indices = sorted({g.index for g in state.gpus if isinstance(g.index, int)} | set(state.gpu_history))
        width = max(20, self.size.width - 4)
        spark_w = max(4, (width - INDEX_W) // len(TREND_COLUMNS) - VALUE_W - 4)
        scales = _scales(state.gpus)
        lines = [_header(spark_w)]
        for idx in indices:
            lines.append(self._row(state, idx, end_ms, spark_w, scales))
        if not indices:
            lines.append(Text("no GPU readings yet", style="dim"))
        if self.styles.height is None or self.styles.height.value != len(lines) + 2:
            self.styles.height = len(lines) + 2  # a layout pass only when the GPU count changes
        out = Text("\n", no_wrap=True, overflow="crop").join(lines)
        out.no_wrap, out.overflow = True, "crop"
        self.update(out)

    def _row(self, state: LiveState, idx: int, end_ms: int, spark_w: int, scales: dict[str, float | None]) -> Text:
        line = Text(no_wrap=True, overflow="crop")
        line.append(f"{idx:>2}".ljust(INDEX_W), style="bold")
        for key, _, fmt in TREND_COLUMNS:
            points = state.gpu_series(idx, key)
            start = end_ms - TRENDS_WINDOW_MS
            # the live history holds 15 minutes: bucket only the last 5 (8 GPUs x 4 series every second)
            recent = points[bisect_left(points, (start,)):]
            # backfilled rollups are sparser than the columns: a reading holds until the next is due (no false gaps)
            interval = reading_interval(recent)
            values = bucketize(recent, start, end_ms, spark_w, agg="avg",
                               hold_ms=int(interval * 1.5) if interval else None)
            last = next((v for _, v in reversed(points) if v is not None), None)
            line.append(sparkline(values, spark_w, vmax=scales.get(key), ascii_only=self.ascii_only),
                        style="cyan")
            text = glyph(fmt(last), self.ascii_only)
            line.append(" " + text.rjust(VALUE_W), style="dim" if text == NA else "")
            line.append("   ")
        return line


def _header(spark_w: int) -> Text:
    head = Text("GPU".ljust(INDEX_W), style="dim")
    for _, label, _ in TREND_COLUMNS:
        head.append(label.ljust(spark_w + 1 + VALUE_W + 3), style="dim")
    return head


def _scales(gpus: Sequence[GpuStatus]) -> dict[str, float | None]:
    limits = [float(g.metric("power_limit_w")) for g in gpus if g.metric("power_limit_w")]
    return {"sm_active_pct": 100.0, "tensor_active_pct": 100.0, "power_w": max(limits) if limits else None,
            "temp_c": TEMP_SCALE_C}
