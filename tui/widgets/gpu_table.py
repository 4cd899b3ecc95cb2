"""One row per GPU: activity bars, the coarse util.gpu beside them, memory, power, temperature, NVLink,
throttle reasons in words and lost/error state."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widget import Widget

from lynxtop.contract.format import (
    NA,
    fmt_bytes,
    fmt_pct,
    fmt_rate,
    fmt_temp,
    fmt_watts,
    throttle_words,
)
from lynxtop.contract.status import GpuStatus
from lynxtop.tui.plot import bar

UTIL_NOTE = "util* = NVML utilization.gpu: share of time any kernel ran (coarse; SM/TC/DRAM are the real load)"


def level_style(pct: float | None, warn: float = 80, crit: float = 95) -> str:
    if pct is None:
        return "dim"
    return "red" if pct >= crit else "yellow" if pct >= warn else ""


def _bar_cell(pct: float | None, width: int, ascii_only: bool) -> Text:
    if pct is None:
        return Text(NA.rjust(width + 5), style="dim")
    return Text(bar(pct, width, ascii_only), style="cyan") + Text(f"{pct:4.0f}%")


class GpuTable(Widget, can_focus=True):
    """Drawn as one block of text per frame: a DataTable re-renders every changed cell separately, and at
    1 Hz with 8 GPUs x 10 columns that alone cost more CPU than the rest of the dashboard."""

    DEFAULT_CSS = """
    GpuTable { height: auto; max-height: 20; text-wrap: nowrap; text-overflow: clip; }
    GpuTable:focus { background-tint: $foreground 5%; }
    """
    BINDINGS = [
        Binding("up,k", "move(-1)", "Up", show=False, id="gpus.up"),
        Binding("down,j", "move(1)", "Down", show=False, id="gpus.down"),
        Binding("enter", "open", "Open GPU", id="gpus.open"),
    ]

    class Selected(Message):
        def __init__(self, index: int):
            super().__init__()
            self.index = index

    # (key, label, compact label); compact None = wide layout only
    COLUMNS: tuple[tuple[str, str, str | None], ...] = (
        ("gpu", "GPU", "GPU"),
        ("sm", "SM act", "SM act"),
        ("tc", "Tensor", "Tensor"),
        ("dram", "DRAM bw", "DRAM bw"),
        ("util", "util*", "util*"),
        ("mem", "Mem used/total", "Mem"),
        ("power", "Power/limit", "Power"),
        ("temp", "Temp", "Temp"),
        ("nvlink", "NVLink TX/RX", None),
        ("state", "Throttle / state", "State"),
    )

    def __init__(self, compact: bool = False, ascii_only: bool = False, **kwargs: Any):
        super().__init__(**kwargs)
        self.compact = compact
        self.ascii_only = ascii_only
        self.rows: dict[str, dict[str, Text]] = {}  # GPU index -> column -> cell, in display order
        self.cursor = 0
        self._text = Text()

    def set_compact(self, compact: bool) -> None:
        self.compact = compact

    @property
    def row_count(self) -> int:
        return len(self.rows)

    def get_row(self, key: str) -> list[Text]:
        return list(self.rows[key].values())

    def show(self, gpus: Sequence[GpuStatus]) -> None:
        width = 3 if self.compact else 10
        rows: dict[str, dict[str, Text]] = {}
        for gpu in sorted(gpus, key=lambda g: g.index if isinstance(g.index, int) else 1 << 30):
            if isinstance(gpu.index, int):
                rows[str(gpu.index)] = self._cells(gpu, width)
        self.rows = rows
        self.cursor = min(self.cursor, max(0, len(rows) - 1))
        self._text = self._layout()
        self.refresh(layout=self.size.height != len(rows) + 1)

    def _layout(self) -> Text:
        cols = [(key, compact if self.compact else label) for key, label, compact in self.COLUMNS
                if not (self.compact and compact is None)]
        widths = {key: max([len(label)] + [r[key].cell_len for r in self.rows.values()]) for key, label in cols}
        out = Text(no_wrap=True, overflow="crop")
        for key, label in cols:
            out.append(" " + label.ljust(widths[key]) + " ", style="bold")
        for i, cells in enumerate(self.rows.values()):
            out.append("\n")
            line = Text(no_wrap=True)
            for key, _ in cols:
                cell = cells[key].copy()
                cell.pad_right(widths[key] - cell.cell_len)
                line.append(" ")
                line.append_text(cell)
                line.append(" ")
            if i == self.cursor and self.has_focus:
                line.stylize("reverse")
            out.append_text(line)
        return out

    def render(self) -> Text:
        return self._text

    def get_content_height(self, container: Any, viewport: Any, width: int) -> int:
        return len(self.rows) + 1

    def on_focus(self) -> None:
        self._text = self._layout()
        self.refresh()

    def on_blur(self) -> None:
        self._text = self._layout()
        self.refresh()

    def action_move(self, step: int) -> None:
        if self.rows:
            self.cursor = (self.cursor + step) % len(self.rows)
            self._text = self._layout()
            self.refresh()

    def action_open(self) -> None:
        if self.rows:
            self.post_message(self.Selected(int(list(self.rows)[self.cursor])))

    def _cells(self, g: GpuStatus, width: int) -> dict[str, Any]:
        lost = bool(g.metric("lost"))
        mem_used, mem_total = g.metric("mem_used_bytes"), g.metric("mem_total_bytes")
        mem_pct = mem_used / mem_total * 100 if mem_used is not None and mem_total else None
        if self.compact:
            gib = 1024**3
            mem_text = (NA if mem_used is None or mem_total is None
                        else f"{mem_used / gib:.0f}/{mem_total / gib:.0f}G")
            pw = g.metric("power_w")
            power_text = NA if pw is None else f"{pw:.0f}W"
        else:
            mem_text = f"{fmt_bytes(mem_used)}/{fmt_bytes(mem_total)}"
            power_text = f"{fmt_watts(g.metric('power_w'))}/{fmt_watts(g.metric('power_limit_w'))}"
        mem = Text(mem_text, style=level_style(mem_pct, 95, 99))
        power = Text(power_text)
        temp = g.metric("temp_c")
        temp_cell = Text(fmt_temp(temp), style=level_style(temp, 80, 88) or ("dim" if temp is None else ""))
        problems: list[str] = []
        if lost:
            problems.append("✗ LOST")
        if g.metric("ecc_uncorrected"):
            problems.append(f"✗ ECC uncorr {g.metric('ecc_uncorrected')}")
        if g.metric("remapped_rows_failed"):
            problems.append("✗ row remap failed")
        elif g.metric("remapped_rows_pending"):
            problems.append("! row remap pending")
        words = throttle_words(g.metric("throttle_reasons"))
        state_style = "bold red" if problems else ("yellow" if words and words != [NA] else "dim")
        state = Text(", ".join(problems + words) or "ok", style=state_style)
        name = f"{g.index}" + ("" if self.compact else f" {_short_name(g.name)}")
        cells: dict[str, Any] = {
            "gpu": Text(name, style="bold red" if lost else "bold"),
            "sm": _bar_cell(g.metric("sm_active_pct"), width, self.ascii_only),
            "tc": _bar_cell(g.metric("tensor_active_pct"), width, self.ascii_only),
            "dram": _bar_cell(g.metric("dram_bw_pct"), width, self.ascii_only),
            "util": Text(fmt_pct(g.metric("util_gpu_pct")).rjust(5), style="dim"),
            "mem": mem,
            "power": power,
            "temp": temp_cell,
        }
        if not self.compact:
            cells["nvlink"] = Text(f"{fmt_rate(g.metric('nvlink_tx_bytes_per_s'))} / "
                                   f"{fmt_rate(g.metric('nvlink_rx_bytes_per_s'))}")
        cells["state"] = state
        return cells


def _short_name(name: str | None) -> str:
    if not name:
        return ""
    for prefix in ("NVIDIA ", "Tesla "):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name.split(" ")[0][:8]
