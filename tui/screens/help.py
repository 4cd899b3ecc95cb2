"""`?`: every key of the app and of the current view, the colour thresholds, and what the figures mean."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

from lynxtop.tui.engine_lag import IDLE_BUSY_MEDIAN, KV_GAP_PCT, WAITING_MIN_GAP
from lynxtop.tui.glyphs import app_ascii, ascii_text
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
MOUSE = "Mouse: a drag selects text; ctrl+c then copies it instead of quitting.\n"
# Textual's copy keys (ctrl+c on a view, on an input box) pass the key on when nothing is selected: the key does
# what the next binding of it says (the app's Quit), so that is what help lists for it.
PASSES_ON = frozenset({"screen.copy_text", "copy"})
# A scrollable widget's scroll keys pass the key on where it cannot scroll that way: ← in the GPU view, whose
# charts scroll up and down only, is the view's Prev GPU, not the charts' Scroll Left.
SCROLLS = {"scroll_left": "x", "scroll_right": "x", "page_left": "x", "page_right": "x", "scroll_up": "y",
           "scroll_down": "y", "page_up": "y", "page_down": "y", "scroll_home": "xy", "scroll_end": "xy"}
_FUNCTION_KEY = re.compile(r"f\d{1,2}")


class HelpScreen(ModalScreen[None]):
    CSS_PATH = VIEWS_CSS
    BINDINGS = [Binding("escape,q,question_mark", "close", "Close", id="help.close")]

    def __init__(self, view: str, under: Screen[Any] | None = None):
        """The keys are read from the bindings in force on `under` (by default the view the help opens over)."""
        super().__init__()
        if under is None:
            under = self.app.screen if self.app.screen_stack else None
        self.keys = help_keys(under) if under is not None else []
        self.view = view

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="dialog"):
            ascii_only = app_ascii(self)
            arrows = "up/down" if ascii_only else "↑↓"  # the table's `^v` reads as two letters here
            yield Static(ascii_text(Text.assemble((f"lynxtop keys ({self.view} view)", "bold"),
                                                  (f"   Esc closes · {arrows} PgUp PgDn scroll", "dim")), ascii_only))
            yield Static(key_table(self.keys, columns=2 if self.app.size.width >= 80 else 1))
            # `>= 95 %`, `80 C`, `X`, `^`, `!`: the table's words (the line filter put `>`, `oC`)
            yield Static(ascii_text(Text(THRESHOLDS + ENGINES + MOUSE + "\n" + UTIL_NOTE), ascii_only))
            yield Static(Text("Esc closes this help.", style="dim"))

    def action_close(self) -> None:
        self.dismiss(None)


def help_keys(screen: Screen[Any]) -> list[tuple[str, str]]:
    """(key, what it does) for every described key in force on `screen`, as a key press finds its binding: the
    focused widget's first, then its containers', the view's and the app's (a priority binding before them all);
    a binding its node hides (check_action False) is not in force. Read from the bindings, so it cannot drift."""
    app = screen.app
    found: dict[str, Binding] = {}
    for node, bindings in screen._modal_binding_chain:
        for key, binding in bindings:
            if passes_on(node, binding.action) or app._check_action_state(binding.action, node) is False:
                continue
            if key not in found or (binding.priority and not found[key].priority):
                found[key] = binding
    return [(key_label(app, key, binding), binding.description) for key, binding in found.items()
            if binding.description]


def passes_on(node: Any, action: str) -> bool:
    """Whether the binding's action, run now, would hand the key to the next binding (Textual's SkipAction)."""
    if action in PASSES_ON:
        return True
    axes = SCROLLS.get(action)
    if axes is None:
        return False
    can = ("x" in axes and getattr(node, "allow_horizontal_scroll", False)) or \
          ("y" in axes and getattr(node, "allow_vertical_scroll", False))
    return not can


def key_label(app: Any, key: str, binding: Binding) -> str:
    """The key as the operator presses it: F6 as htop names it; a key shown by a symbol ("?", "/", "←") its own
    symbol, not the one a two-key binding gave both ("f6,s" shown as "s" twice, "left,h" as "←" twice); other
    named keys as written ("ctrl+c", "up")."""
    if _FUNCTION_KEY.fullmatch(key):
        return key.upper()
    if binding.key_display is None:
        return key
    return str(app.get_key_display(replace(binding, key=key, key_display=None)))


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
    """The keys in `columns` side-by-side pairs of (key, does), filled top to bottom. Each key column is as wide
    as its widest row and never wraps: at 14 cells Quit's "ctrl+q, ctrl+c, q" took two lines (80 and 120 wide);
    the descriptions fold instead, where anything must."""
    rows = merged_keys(bindings)
    table = Table(show_header=True, expand=False, box=None, padding=(0, 1), show_edge=False)
    height = -(-len(rows) // columns) if rows else 0
    for c in range(columns):
        widest = max((len(k) for k, _ in rows[c * height:(c + 1) * height]), default=3)
        table.add_column("key", style="bold", min_width=max(3, widest), no_wrap=True)
        table.add_column("does", overflow="fold")
    for r in range(height):
        cells: list[str] = []
        for c in range(columns):
            i = c * height + r
            cells += list(rows[i]) if i < len(rows) else ["", ""]
        table.add_row(*cells)
    return table
