"""Foreign text made safe to show on a terminal: the one renderer every printer and the dashboard use.

vLLM's version and error texts, a GPU's name from NVML, a model name from the config, an event message or a log
line from the database are input, not ours: printed raw, `\\x1b[2J` clears the operator's screen, `\\x1b]0;…\\x07`
retitles the window and a bidi override reverses what follows. Every such character is shown escaped instead,
the way Python writes it (`\\x1b`, `\\u202e`), so the operator sees that it is there without the terminal acting
on it. Imports nothing else of the project.
"""

from __future__ import annotations

import re
from typing import Any

# C0 controls, DEL and C1 controls (a C1 CSI, \x9b, is ESC [ to many terminals); the Unicode bidi controls
# (embeddings, overrides, isolates, the marks) and the line and paragraph separators; lone surrogates (a
# foreign process's argv read with surrogateescape), which no UTF-8 terminal can be written and `print` raises on.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    c = match.group()
    if c in _NAMED:
        return _NAMED[c]
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(value: object, *, lines: bool = False) -> str:
    """`value` as text with every control character shown escaped (`\\x1b`, `\\u202e`).

    A single field (a name, a version, a table cell) escapes its line breaks too, so it cannot forge a line of
    the output; `lines=True` keeps the line breaks of a whole printed text made of several lines.
    """
    text = value if isinstance(value, str) else str(value)
    if not lines:
        return _UNSAFE.sub(_escape, text)
    return "\n".join(_UNSAFE.sub(_escape, line) for line in text.split("\n"))


def terminal_safe_json(data: Any) -> Any:
    """A copy of JSON-shaped `data` with every string in it (keys too) passed through `terminal_safe`: for a
    printer that builds its lines from many of a server's fields, so that none of them is missed."""
    if isinstance(data, str):
        return terminal_safe(data)
    if isinstance(data, dict):
        return {terminal_safe_json(k): terminal_safe_json(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [terminal_safe_json(v) for v in data]
    return data


def first_control(text: str) -> str | None:
    """The first character of `text` that `terminal_safe` escapes, as it shows it (`\\x1b`); None if none."""
    match = _UNSAFE.search(text)
    return None if match is None else _escape(match)
