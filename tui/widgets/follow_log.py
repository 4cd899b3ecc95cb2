"""A log that follows its end, like `journalctl -f` or k9s's `l`: new lines scroll into view until the operator
scrolls up to read; then they pile up below without moving the view, until End (or `f`) follows again.

Lines are shown as plain text (a log line's `[bold]` or lone `[` is shown, never parsed as markup; control
characters are escaped before they get here, tui/foreign.py). At most `max_lines` are kept: a log that runs all
night costs a bounded amount of memory. WARNING lines are yellow, ERROR and worse red, and the current search
term is shown reversed wherever it occurs.
"""

from __future__ import annotations

import re
from typing import Any

from rich.highlighter import Highlighter
from rich.text import Text
from textual import events
from textual.geometry import Size
from textual.widgets import Log

MAX_LINES = 5000
MARK = "── "  # lines the dashboard adds (a new run, a rotated file) start with this and are shown dim
_ERROR = re.compile(r"\b(ERROR|CRITICAL|FATAL|Traceback)\b")
_WARNING = re.compile(r"\bWARN(ING)?\b")


class LogHighlighter(Highlighter):
    """Severity colours for whole lines and the search term's occurrences."""

    def __init__(self) -> None:
        self.needle = ""

    def highlight(self, text: Text) -> None:
        plain = text.plain
        if plain.startswith(MARK):
            text.stylize("dim italic")
        elif _ERROR.search(plain):
            text.stylize("bold red")
        elif _WARNING.search(plain):
            text.stylize("yellow")
        if self.needle:
            low, needle = plain.lower(), self.needle.lower()
            at = low.find(needle)
            while at >= 0:
                text.stylize("reverse", at, at + len(needle))
                at = low.find(needle, at + len(needle))


class FollowLog(Log):
    """Textual's Log (plain lines, bounded) that knows whether it follows the end."""

    def __init__(self, max_lines: int = MAX_LINES, **kwargs: Any):
        super().__init__(highlight=True, max_lines=max_lines, auto_scroll=True, **kwargs)
        self.highlighter = LogHighlighter()
        self.unseen = 0  # lines added below the view since following stopped

    @property
    def following(self) -> bool:
        return self.auto_scroll

    def follow(self, on: bool = True) -> None:
        """Follow the end again (and go there), or stop following."""
        self.auto_scroll = on
        if on:
            self.unseen = 0
            self._to_end()

    def add(self, lines: list[str]) -> None:
        if not lines:
            return
        if not self.following:
            self.unseen += len(lines)
        self.write_lines(lines, scroll_end=self.following)
        if self.following:  # again once laid out: a long line's horizontal scrollbar takes a row from the view
            self.call_after_refresh(self._to_end)

    def _to_end(self) -> None:
        if self.following:
            self.scroll_end(animate=False, immediate=True, x_axis=False)

    def on_resize(self, event: events.Resize) -> None:
        self.call_after_refresh(self._to_end)

    def drop_last(self) -> None:
        """Remove the last line: a line still being written, served again whole by the next read."""
        if self._lines:
            self._lines.pop()
            self.virtual_size = Size(self.virtual_size.width, len(self._lines))
            self.notify_style_update()
            self.refresh()

    def search(self, needle: str) -> None:
        self.highlighter.needle = needle
        self.notify_style_update()  # drops the cached rendering of every line
        self.refresh()

    def matches(self) -> list[int]:
        needle = self.highlighter.needle.lower()
        return [i for i, line in enumerate(self.lines) if needle and needle in line.lower()] if needle else []

    def show_line(self, y: int) -> None:
        """Bring line `y` to the middle of the view; the view stops following (it is being read)."""
        self.follow(False)
        self.scroll_to(y=max(0, y - self.scrollable_content_region.height // 2), animate=False, immediate=True)

    # ------------------------------------------------------------------ the operator moving up stops following
    def action_scroll_up(self) -> None:
        self.follow(False)
        super().action_scroll_up()

    def action_page_up(self) -> None:
        self.follow(False)
        super().action_page_up()

    def action_scroll_home(self) -> None:
        self.follow(False)
        super().action_scroll_home()

    def action_scroll_end(self) -> None:
        self.follow(True)

    def _on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        self.follow(False)
        super()._on_mouse_scroll_up(event)

    def _on_scroll_to(self, message: Any) -> None:  # the scrollbar dragged
        if message.y is not None and message.y < self.max_scroll_y:
            self.follow(False)
        super()._on_scroll_to(message)

    def _on_scroll_up(self, event: Any) -> None:  # a click on the scrollbar above its thumb
        self.follow(False)
        super()._on_scroll_up(event)
