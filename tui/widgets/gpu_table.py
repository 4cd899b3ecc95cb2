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
from lynxtop.tui.glyphs import glyph
from lynxtop.tui.plot import bar
from lynxtop.tui.widgets.text_panel import content_key

# Within 78 columns: the Node view shows it whole at 80x24.
UTIL_NOTE = "util* = NVML utilization.gpu: time any kernel ran (coarse; SM/TC/DRAM = load)"


# (warn, crit): yellow from warn, red from crit; at crit the State column also says it in words (NO_COLOR)
TEMP_LEVELS = (80.0, 88.0)
MEM_LEVELS = (95.0, 99.0)


def level_style(pct: float | None, warn: float = 80, crit: float = 95) -> str:
    if pct is None:
        return "dim"
    return "red" if pct >= crit else "yellow" if pct >= warn else ""


def _gib(v: float) -> str:
    """GiB in the compact table: whole from 10, one decimal below (a CUDA context's 0.4 GiB is not `0`)."""
    gib = v / 1024**3
    if gib <= 0:
        return "0"
    return f"{max(gib, 0.1):.1f}" if round(gib, 1) < 10 else f"{gib:.0f}"


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
        # htop's F6 picks the sort column, `s` without F-keys, `I` inverts; listed by ? and the palette
        Binding("f6,s", "sort_next", "Sort column", key_display="s", show=False, id="gpus.sort"),
        Binding("I", "sort_invert", "Invert sort", key_display="I", show=False, id="gpus.sort_invert"),
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
        ("mem", "Mem used/total", "Mem GiB"),
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
        self.sort_key = "gpu"  # a COLUMNS key; kept across polls, so a live update never reorders by itself
        self.sort_descending = False
        self._gpus: list[GpuStatus] = []
        self._text = Text()
        self._shown: object = None  # content_key of the text drawn: an equal one is not sent again

    def set_compact(self, compact: bool) -> None:
        self.compact = compact
        if compact and self.sort_key not in self._visible_keys():
            self.sort_key, self.sort_descending = "gpu", False  # its column is gone: sort by what is shown

    def _visible_keys(self) -> list[str]:
        return [key for key, _, compact in self.COLUMNS if not (self.compact and compact is None)]

    @property
    def order(self) -> list[int]:
        """GPU indices as shown, top to bottom."""
        return [int(k) for k in self.rows]

    @property
    def selected_gpu(self) -> int | None:
        return self.order[self.cursor] if self.rows else None

    @property
    def row_count(self) -> int:
        return len(self.rows)

    def get_row(self, key: str) -> list[Text]:
        return list(self.rows[key].values())

    def show(self, gpus: Sequence[GpuStatus]) -> None:
        """Rows keyed by GPU index in the chosen order; the cursor stays on its GPU when the order changes."""
        width = 3 if self.compact else 10
        selected = self.selected_gpu
        self._gpus = [g for g in gpus if isinstance(g.index, int)]
        rows: dict[str, dict[str, Text]] = {}
        for gpu in sort_gpus(self._gpus, self.sort_key, self.sort_descending):
            rows[str(gpu.index)] = self._cells(gpu, width)
        self.rows = rows
        order = self.order
        self.cursor = order.index(selected) if selected in order else min(self.cursor, max(0, len(rows) - 1))
        self._text = self._layout()
        layout = self.size.height != len(rows) + 1
        key = content_key(self._text)
        if key != self._shown or layout:  # an idle node's same rows: nothing to send
            self._shown = key
            self.refresh(layout=layout)

    def _layout(self) -> Text:
        cols = [(key, compact if self.compact else label) for key, label, compact in self.COLUMNS
                if not (self.compact and compact is None)]
        # The sort column and its direction, in the header (htop's highlight); GPU order, the default, unmarked.
        marked = self.sort_key if (self.sort_key, self.sort_descending) != ("gpu", False) else None
        widths = {key: max([len(label) + (key == marked)] + [r[key].cell_len for r in self.rows.values()])
                  for key, label in cols}
        out = Text(no_wrap=True, overflow="crop")
        for key, label in cols:
            if key == marked:
                arrow = ("v" if self.sort_descending else "^") if self.ascii_only else (
                    "▼" if self.sort_descending else "▲")
                out.append(" " + (label + arrow).ljust(widths[key]) + " ", style="bold reverse")
            else:
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

    def action_sort_next(self) -> None:
        keys = self._visible_keys()
        self.sort_key = keys[(keys.index(self.sort_key) + 1) % len(keys)] if self.sort_key in keys else "gpu"
        self.sort_descending = self.sort_key != "gpu"  # the busiest, hottest, fullest first; GPUs in index order
        self._resort()

    def action_sort_invert(self) -> None:
        self.sort_descending = not self.sort_descending
        self._resort()

    def _resort(self) -> None:
        self.show(self._gpus)
        label = next(label for key, label, _ in self.COLUMNS if key == self.sort_key)
        self.notify(f"GPUs sorted by {label}, {'descending' if self.sort_descending else 'ascending'}", timeout=2)

    def action_open(self) -> None:
        if self.rows:
            self.post_message(self.Selected(int(list(self.rows)[self.cursor])))

    def _cells(self, g: GpuStatus, width: int) -> dict[str, Any]:
        lost = bool(g.metric("lost"))
        mem_used, mem_total = g.metric("mem_used_bytes"), g.metric("mem_total_bytes")
        mem_pct = mem_used / mem_total * 100 if mem_used is not None and mem_total else None
        if self.compact:
            mem_text = NA if mem_used is None or mem_total is None else f"{_gib(mem_used)}/{_gib(mem_total)}"
            pw = g.metric("power_w")
            power_text = NA if pw is None else f"{pw:.0f}W"
        else:
            mem_text = f"{fmt_bytes(mem_used)}/{fmt_bytes(mem_total)}"
            power_text = f"{fmt_watts(g.metric('power_w'))}/{fmt_watts(g.metric('power_limit_w'))}"
        mem = Text(mem_text, style=level_style(mem_pct, *MEM_LEVELS))
        power = Text(power_text)
        temp = g.metric("temp_c")
        asc = self.ascii_only
        temp_text = glyph(fmt_temp(temp), asc)
        temp_cell = Text(temp_text, style=level_style(temp, *TEMP_LEVELS) or ("dim" if temp is None else ""))
        x = glyph("✗", asc)
        problems: list[str] = []
        if lost:
            problems.append(f"{x} LOST")
        if g.metric("ecc_uncorrected"):
            problems.append(f"{x} ECC uncorr {g.metric('ecc_uncorrected')}")
        if g.metric("remapped_rows_failed"):
            problems.append(f"{x} row remap failed")
        elif g.metric("remapped_rows_pending"):
            problems.append("! row remap pending")
        # Past the red lines, in words too: colour is never the only signal (NO_COLOR, a monochrome terminal)
        if not lost and temp is not None and temp >= TEMP_LEVELS[1]:
            problems.append(f"hot {temp_text}")
        if not lost and mem_pct is not None and mem_pct >= MEM_LEVELS[1]:
            problems.append(f"mem {int(mem_pct)}%")  # 99.6 % is not full: never rounded up to 100
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


def _sort_value(g: GpuStatus, key: str) -> float | None:
    """The number a column sorts by: its reading, not its text (130 GiB after 99 GiB)."""
    if key == "gpu":
        return float(g.index)
    if key == "mem":
        return g.metric("mem_used_bytes")
    if key == "nvlink":
        tx, rx = g.metric("nvlink_tx_bytes_per_s"), g.metric("nvlink_rx_bytes_per_s")
        return None if tx is None and rx is None else (tx or 0) + (rx or 0)
    if key == "state":  # faults first, then throttling, then ok
        faults = sum(bool(g.metric(m)) for m in ("lost", "ecc_uncorrected", "remapped_rows_failed",
                                                 "remapped_rows_pending"))
        words = throttle_words(g.metric("throttle_reasons"))
        return faults * 10 + (1 if words and words != [NA] else 0)
    metric = {"sm": "sm_active_pct", "tc": "tensor_active_pct", "dram": "dram_bw_pct", "util": "util_gpu_pct",
              "power": "power_w", "temp": "temp_c"}[key]
    return g.metric(metric)


def sort_gpus(gpus: Sequence[GpuStatus], key: str, descending: bool) -> list[GpuStatus]:
    """GPUs by a column, ties by index; a GPU without the reading (N/A) goes last either way."""
    def order(g: GpuStatus) -> tuple[bool, float, int]:
        v = _sort_value(g, key)
        return (v is None, 0.0 if v is None else (-v if descending else v), int(g.index))

    return sorted(gpus, key=order)


def _short_name(name: str | None) -> str:
    if not name:
        return ""
    for prefix in ("NVIDIA ", "Tesla "):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name.split(" ")[0][:8]
