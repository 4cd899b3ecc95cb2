"""The dashboard's marks in ASCII, for terminals that cannot show UTF-8 (LC_ALL=C, a serial console, PuTTY in
Latin-1: `ascii_only`, tui/app.py). The marks that mean "broken" (`✗ LOST`, `SLA ✗`, `⚠`) are the ones that must
not turn into `?` there. One table, so every widget says a mark the same way in ASCII."""

from __future__ import annotations

from typing import Any

from rich.text import Span, Text

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
