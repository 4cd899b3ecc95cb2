"""One row per GPU, updated cell by cell (rows keyed by GPU index, never cleared and refilled)."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable

from lynxtop.tui.format import (
    NA,
    bar,
    fmt_bytes,
    fmt_pct,
    fmt_rate,
    fmt_temp,
    fmt_watts,
    throttle_words,
)

UTIL_NOTE = "util* = NVML utilization.gpu: share of time any kernel ran (coarse; SM/TC/DRAM are the real load)"


def level_style(pct: float | None, warn: float = 80, crit: float = 95) -> str:
    if pct is None:
        return "dim"
    return "red" if pct >= crit else "yellow" if pct >= warn else ""


def _bar_cell(pct: float | None, width: int, ascii_only: bool) -> Text:
    if pct is None:
        return Text(NA.rjust(width + 5), style="dim")
    return Text(bar(pct, width, ascii_only), style="cyan") + Text(f"{pct:4.0f}%")


class GpuTable(DataTable):
    DEFAULT_CSS = "GpuTable { height: auto; max-height: 20; }"

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
        super().__init__(cursor_type="row", zebra_stripes=False, **kwargs)
        self.compact = compact
        self.ascii_only = ascii_only
        self._built_for: bool | None = None

    def _build_columns(self) -> None:
        self.clear(columns=True)
        for key, label, compact_label in self.COLUMNS:
            if self.compact and compact_label is None:
                continue
            self.add_column(compact_label if self.compact else label, key=key)
        self._built_for = self.compact

    def set_compact(self, compact: bool) -> None:
        if compact != self.compact:
            self.compact = compact
            self._built_for = None

    def show(self, gpus: list[dict[str, Any]]) -> None:
        if self._built_for != self.compact:
            self._build_columns()
        width = 3 if self.compact else 10
        seen = set()
        for gpu in gpus:
            idx = gpu.get("index")
            if not isinstance(idx, int):
                continue
            key = str(idx)
            seen.add(key)
            cells = self._cells(gpu, width)
            if key not in self.rows:
                self.add_row(*cells.values(), key=key)
                continue
            for col, value in cells.items():
                if self.get_cell(key, col) != value:
                    self.update_cell(key, col, value, update_width=True)
        for key in [k.value for k in self.rows if k.value not in seen]:
            self.remove_row(key)

    def _cells(self, g: dict[str, Any], width: int) -> dict[str, Any]:
        lost = bool(g.get("lost"))
        mem_used, mem_total = g.get("mem_used_bytes"), g.get("mem_total_bytes")
        mem_pct = mem_used / mem_total * 100 if mem_used is not None and mem_total else None
        if self.compact:
            gib = 1024**3
            mem_text = (NA if mem_used is None or mem_total is None
                        else f"{mem_used / gib:.0f}/{mem_total / gib:.0f}G")
            pw = g.get("power_w")
            power_text = NA if pw is None else f"{pw:.0f}W"
        else:
            mem_text = f"{fmt_bytes(mem_used)}/{fmt_bytes(mem_total)}"
            power_text = f"{fmt_watts(g.get('power_w'))}/{fmt_watts(g.get('power_limit_w'))}"
        mem = Text(mem_text, style=level_style(mem_pct, 95, 99))
        power = Text(power_text)
        temp = g.get("temp_c")
        temp_cell = Text(fmt_temp(temp), style=level_style(temp, 80, 88) or ("dim" if temp is None else ""))
        problems: list[str] = []
        if lost:
            problems.append("✗ LOST")
        if g.get("ecc_uncorrected"):
            problems.append(f"✗ ECC uncorr {g['ecc_uncorrected']}")
        if g.get("remapped_rows_failed"):
            problems.append("✗ row remap failed")
        elif g.get("remapped_rows_pending"):
            problems.append("! row remap pending")
        words = throttle_words(g.get("throttle_reasons"))
        state_style = "bold red" if problems else ("yellow" if words and words != [NA] else "dim")
        state = Text(", ".join(problems + words) or "ok", style=state_style)
        name = f"{g['index']}" + ("" if self.compact else f" {_short_name(g.get('name'))}")
        cells: dict[str, Any] = {
            "gpu": Text(name, style="bold red" if lost else "bold"),
            "sm": _bar_cell(g.get("sm_active_pct"), width, self.ascii_only),
            "tc": _bar_cell(g.get("tensor_active_pct"), width, self.ascii_only),
            "dram": _bar_cell(g.get("dram_bw_pct"), width, self.ascii_only),
            "util": Text(fmt_pct(g.get("util_gpu_pct")).rjust(5), style="dim"),
            "mem": mem,
            "power": power,
            "temp": temp_cell,
        }
        if not self.compact:
            cells["nvlink"] = Text(f"{fmt_rate(g.get('nvlink_tx_bytes_per_s'))} / "
                                   f"{fmt_rate(g.get('nvlink_rx_bytes_per_s'))}")
        cells["state"] = state
        return cells


def _short_name(name: str | None) -> str:
    if not name:
        return ""
    for prefix in ("NVIDIA ", "Tesla "):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name.split(" ")[0][:8]
