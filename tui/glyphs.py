"""The dashboard's marks in ASCII, for terminals that cannot show UTF-8 (LC_ALL=C, a serial console, PuTTY in
Latin-1: `ascii_only`, tui/app.py). The marks that mean "broken" (`✗ LOST`, `SLA ✗`, `⚠`) are the ones that must
not turn into `?` there. One table, so every widget says a mark the same way in ASCII."""

from __future__ import annotations

import unicodedata
from functools import lru_cache
from typing import Any

from rich.cells import cell_len
from rich.segment import Segment
from rich.text import Span, Text
from textual.color import Color
from textual.filter import LineFilter

ASCII: dict[str, str] = {
    "✗": "X",  # broken: lost GPU, ECC, SLA breach, agent unhealthy
    "✓": "+",
    "⚠": "!",
    "≤": "<=",
    "≥": ">=",
    "°": "",  # `93°C` -> `93C` (contract/format.py's fmt_temp stays as the CLI and web use it)
    "—": "-",
    "–": "-",
    "×": "x",
    "⟳": "~",
    "▲": "^",
    "▼": "v",
    "▶": ">",
    "◀": "<",
    "●": "*",
    "⏸": "||",
    "⧗": "~",
    "■": "#",
    "·": ".",
    "…": "...",
    "←": "<-",
    "→": "->",
    "±": "+/-",
    "↑": "^",
    "↓": "v",
    "│": "|",  # the charts' axes (tui/widgets/time_chart.py)
    "└": "+",
    "╌": "-",  # a chart's threshold line
    "┊": ":",  # a chart's marked time (a GPU index's board changed: the History view)
    "┴": "+",
}


def glyph(mark: str, ascii_only: bool) -> str:
    """`mark` as drawn: itself, or with each character of the table replaced in ASCII mode."""
    return "".join(ASCII.get(c, c) for c in mark) if ascii_only else mark


def ascii_text(text: Text, ascii_only: bool = True) -> Text:
    """A copy of `text` with the table's replacements, its styles kept on the same characters (a replacement of
    another length moves the spans after it). `text` itself when there is nothing to replace."""
    plain = text.plain
    if not ascii_only or not any(c in ASCII for c in plain):
        return text
    at = [0] * (len(plain) + 1)  # old offset -> new offset
    out: list[str] = []
    n = 0
    for i, c in enumerate(plain):
        at[i] = n
        r = ASCII.get(c, c)
        out.append(r)
        n += len(r)
    at[len(plain)] = n
    new = text.blank_copy("".join(out))
    new.spans = [Span(at[s.start], at[s.end], s.style) for s in text.spans if at[s.start] < at[s.end]]
    return new


def app_ascii(widget: Any) -> bool:
    """Whether the widget's app draws in ASCII (False for a widget without a running app: a bare test)."""
    try:
        return bool(getattr(widget.app, "ascii_only", False))
    except Exception:  # no active app
        return False


# One ASCII cell for each mark of the table above, for the filter below (which must keep every cell where it is).
# `…` is where a line was cut to the width (Rich and Textual cut with it, after the widgets' own replacements): its
# one cell is CUT, as nano and vim mark a line that goes on; `.` read as a full stop, `~` is the action mark's (`⟳`)
CUT = ">"
CELL: dict[str, str] = {"≤": "<", "≥": ">", "°": "o", "…": CUT, "←": "<", "→": ">", "⏸": "|", "±": "+"}


@lru_cache(4096)
def ascii_cell(c: str) -> str:
    """`c` as ASCII of the same width in cells: a mark of the table; a box-drawing line as `-`, `|` or `+`; a block
    (scrollbar thumbs' ends, Textual's tall and outer borders) as a blank cell, its colours kept; anything else as
    `?` per cell (a wide character as `??`, a zero-width one as nothing)."""
    if c.isascii():
        return c
    width = cell_len(c)
    if c in CELL or (len(ASCII.get(c, "")) == 1 and width == 1):
        return CELL.get(c) or ASCII[c]
    name = unicodedata.name(c, "")
    if name.startswith("BOX DRAWINGS"):
        if " AND " in name or "ARC" in name:
            return "+"
        return "-" if "HORIZONTAL" in name or "LEFT" in name or "RIGHT" in name else "|"
    if name.endswith("BLOCK") or name.startswith(("UPPER ", "LOWER ", "LEFT ", "RIGHT ", "QUADRANT")):
        return " " * width if name != "FULL BLOCK" else "#"
    return "?" * width


class AsciiFilter(LineFilter):
    """Every cell the app draws in ASCII, as a last step (App.get_line_filters): what the widgets and the .tcss
    rules of ASCII mode did not already turn (a Textual widget's glyph, a text from the agent, a log line) goes to
    the terminal as `?`, not as the UTF-8 bytes a C-locale terminal draws as two or three garbage cells, the rest of
    the line shifted. Width kept: each character becomes as many ASCII cells as it took."""

    def apply(self, segments: list[Segment], background: Color) -> list[Segment]:
        return [seg if seg.control or seg.text.isascii()
                else Segment("".join(ascii_cell(c) for c in seg.text), seg.style, seg.control)
                for seg in segments]
