"""A widget showing one renderable that repaints without a layout pass.

`Static.update` always asks for a new layout; at 1 Hz on every panel that costs more CPU than the drawing
itself. Panels whose height is fixed by CSS use this instead.
"""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text
from textual.widget import Widget


class TextPanel(Widget):
    DEFAULT_CSS = "TextPanel { text-wrap: nowrap; text-overflow: ellipsis; }"

    def __init__(self, content: RenderableType = "", **kwargs):
        super().__init__(**kwargs)
        self._content: RenderableType = content

    @property
    def content(self) -> RenderableType:
        return self._content

    def update(self, content: RenderableType) -> None:
        self._content = content
        self.refresh()

    def render(self) -> RenderableType:
        return Text(self._content) if isinstance(self._content, str) else self._content
