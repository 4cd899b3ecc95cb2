"""A widget showing one renderable that repaints without a layout pass, and only when what it shows changes.

`Static.update` always asks for a new layout; at 1 Hz on every panel that costs more CPU than the drawing
itself. Panels whose height is fixed by CSS use this instead. An update equal to what is shown repaints
nothing: on an idle node every poll re-sent the whole screen (4-12 KB a second), and over a slow SSH link key
presses queued behind those redraws.
"""

from __future__ import annotations

from typing import Any

from rich.console import RenderableType
from rich.text import Text
from textual.widget import Widget


def content_key(content: Any) -> object:
    """What a renderable shows, to compare with what is drawn: a Text's characters, styles and settings, a str
    itself; anything else a fresh object (never equal: always drawn)."""
    if isinstance(content, Text):
        return (content.plain, tuple(content.spans), content.style, content.justify, content.overflow,
                content.no_wrap, content.end)
    if isinstance(content, str):
        return content
    return object()


def update_static(widget: Any, content: RenderableType) -> None:
    """`Static.update` (a layout pass and a repaint) only when `content` differs from what `widget` shows."""
    key = content_key(content)
    if getattr(widget, "_lynx_shown", None) == key:
        return
    widget._lynx_shown = key
    widget.update(content)


def set_border(widget: Widget, title: str | None = None, subtitle: Any = None) -> None:
    """Border title and subtitle set only when changed: each assignment repaints the whole widget."""
    if title is not None and getattr(widget, "_lynx_title", None) != title:
        widget._lynx_title = title  # type: ignore[attr-defined]
        widget.border_title = title
    if subtitle is not None:
        key = str(subtitle)
        if getattr(widget, "_lynx_subtitle", None) != key:
            widget._lynx_subtitle = key  # type: ignore[attr-defined]
            widget.border_subtitle = subtitle


class TextPanel(Widget):
    DEFAULT_CSS = "TextPanel { text-wrap: nowrap; text-overflow: ellipsis; }"

    def __init__(self, content: RenderableType = "", **kwargs):
        super().__init__(**kwargs)
        self._content: RenderableType = content
        self._shown: object = content_key(content)

    @property
    def content(self) -> RenderableType:
        return self._content

    def update(self, content: RenderableType) -> None:
        self._content = content
        key = content_key(content)
        if key == self._shown:
            return  # the same text and styles: nothing to send
        self._shown = key
        self.refresh()

    def render(self) -> RenderableType:
        return Text(self._content) if isinstance(self._content, str) else self._content
