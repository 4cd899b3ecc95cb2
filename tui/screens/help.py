"""`?`: every key of the app and of the current view, the colour thresholds, and what the figures mean."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from lynxtop.tui.engine_lag import IDLE_BUSY_MEDIAN, KV_GAP_PCT, WAITING_MIN_GAP
from lynxtop.tui.screens import VIEWS_CSS
from lynxtop.tui.widgets.gpu_table import UTIL_NOTE

THRESHOLDS = """\
Colours (always with a word or symbol too):
  SM/Tensor/DRAM bars: plain; memory yellow ≥ 95 %, red ≥ 99 %; temperature yellow ≥ 80 °C, red ≥ 88 °C
  KV cache red ≥ 95 %; latency p99 red with ✗ above the SLA limit; ▲ marks breaches in charts
  N/A = not readable (never shown as 0). Greyed panels = last values while the agent is unreachable.
"""
ENGINES = f"""\
Engines (e, data parallel): ⚠ marks an engine that, against the others' median, has
  ≥ {WAITING_MIN_GAP} more waiting (and at least twice it), KV cache ≥ {KV_GAP_PCT:.0f} points higher, or runs
  nothing while it has a queue or the others run ≥ {IDLE_BUSY_MEDIAN}. Totals stay the default view.
"""


class HelpScreen(ModalScreen[None]):
    CSS_PATH = VIEWS_CSS
    BINDINGS = [Binding("escape,q,question_mark", "close", "Close", id="help.close")]

    def __init__(self, bindings: list[tuple[str, str]], view: str):
        super().__init__()
        self.keys = bindings
        self.view = view

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="dialog"):
            yield Static(Text.assemble((f"lynxtop keys ({self.view} view)", "bold"),
                                       ("   Esc closes · ↑↓ PgUp PgDn scroll", "dim")))
            yield Static(key_table(self.keys, columns=2 if self.app.size.width >= 80 else 1))
            yield Static(Text(THRESHOLDS + ENGINES + "\n" + UTIL_NOTE))
            yield Static(Text("Esc closes this help.", style="dim"))

    def action_close(self) -> None:
        self.dismiss(None)


def merged_keys(bindings: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """One row per description, its keys joined ("up, k": Up), in first-seen order: the same action bound to two
    keys took two rows each, and the table did not fit 24 lines."""
    keys: dict[str, list[str]] = {}
    for key, description in bindings:
        keys.setdefault(description, [])
        if key not in keys[description]:
            keys[description].append(key)
    return [(", ".join(k), description) for description, k in keys.items()]


def key_table(bindings: list[tuple[str, str]], columns: int = 2) -> Table:
    """The keys in `columns` side-by-side pairs of (key, does), filled top to bottom."""
    rows = merged_keys(bindings)
    table = Table(show_header=True, expand=False, box=None, padding=(0, 1), show_edge=False)
    for _ in range(columns):
        table.add_column("key", style="bold", max_width=14, overflow="fold")
        table.add_column("does", overflow="fold")
    height = -(-len(rows) // columns) if rows else 0
    for r in range(height):
        cells: list[str] = []
        for c in range(columns):
            i = c * height + r
            cells += list(rows[i]) if i < len(rows) else ["", ""]
        table.add_row(*cells)
    return table
