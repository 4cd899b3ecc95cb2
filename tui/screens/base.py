"""What every view shares: the node header, the outage banner, the footer, and the too-small message."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Container
from textual.screen import Screen
from textual.widgets import Static

from lynxtop.tui.glyphs import glyph
from lynxtop.tui.messages import LiveRefreshed
from lynxtop.tui.widgets.key_bar import KeyBar
from lynxtop.tui.widgets.node_header import SIMULATED_BADGE, NodeHeader
from lynxtop.tui.widgets.outage_banner import OutageBanner

if TYPE_CHECKING:
    from lynxtop.tui.app import LynxtopApp

MIN_WIDTH, MIN_HEIGHT = 80, 24
COMPACT_WIDTH, COMPACT_HEIGHT = 150, 32
TALL_HEIGHT = 44  # from here views may show more panels; 80x24 and 120x40 keep their layout


class LiveScreen(Screen):
    """A view: subclasses yield their body from `compose_body` and draw it in `draw`."""

    VIEW_TITLE = ""
    _too_small_shown: tuple[int, int, bool] | None = None  # what the too-small message says now (keyed update)

    def compose(self) -> ComposeResult:
        # The size classes before the children mount: set on resume, each new class restyled every widget of the view
        self._size_classes()
        yield NodeHeader(id="header")
        yield OutageBanner(id="banner")
        with Container(id="body"):
            yield from self.compose_body()
        yield Static(id="too-small")
        yield KeyBar(id="keys")

    def compose_body(self) -> ComposeResult:
        yield from ()

    @property
    def lynx(self) -> LynxtopApp:
        return self.app  # type: ignore[return-value]

    def on_screen_resume(self) -> None:
        self._apply_size()
        self.redraw()

    def on_resize(self, event: events.Resize) -> None:
        self._apply_size()

    def _size_classes(self) -> bool:
        """-too-small, -compact and -tall for the terminal's size; returns whether it is too small."""
        w, h = self.app.size
        small = w < MIN_WIDTH or h < MIN_HEIGHT
        _set_class(self, small, "-too-small")
        _set_class(self, w < COMPACT_WIDTH or h < COMPACT_HEIGHT, "-compact")
        _set_class(self, not small and h >= TALL_HEIGHT, "-tall")
        return small

    def _apply_size(self) -> None:
        if self._size_classes():
            self._show_too_small()
        self.on_compact_changed(self.has_class("-compact"))

    def _show_too_small(self) -> None:
        """The message in place of the view; it hides the header, so it carries the SIMULATED badge itself."""
        w, h = self.app.size
        simulated = self.lynx.state.simulated
        if self._too_small_shown == (w, h, simulated):
            return
        self._too_small_shown = (w, h, simulated)
        text = Text(justify="center")
        if simulated:
            text.append(*SIMULATED_BADGE)
            text.append("\n")
        x = glyph("×", self.lynx.ascii_only)
        text.append(f"lynxtop needs at least {MIN_WIDTH}{x}{MIN_HEIGHT} characters; this terminal is {w}{x}{h}.\n"
                    "Enlarge the window or press q to quit.")
        self.query_one("#too-small", Static).update(text)

    def on_compact_changed(self, compact: bool) -> None:
        """Subclasses switch to narrower columns here."""

    def on_live_refreshed(self, message: LiveRefreshed) -> None:
        self.redraw()

    def redraw_header(self, now: int | None = None) -> None:
        """The header and outage banner only: what stays visible above a dialog over this view."""
        app = self.lynx
        now = app.now_ms() if now is None else now
        self.query_one(NodeHeader).show(app.state, now, app.header_flags(), app.header_lead())
        self.query_one(OutageBanner).show(app.state, now, app.utc, app.retry_in_s())

    def redraw(self) -> None:
        app = self.lynx
        now = app.now_ms()
        self.redraw_header(now)
        _set_class(self, app.state.stale, "-stale")
        if self.has_class("-too-small"):  # a status may have just said the node is simulated
            self._show_too_small()
        self.draw(app.state.node_ms(now))  # the views compare it with the node's times: on the node's clock

    def draw(self, now_ms: int) -> None:
        """Draw the body from `self.lynx.state`; called at most once per poll and only when visible. `now_ms` is
        now on the node's clock (`LiveState.node_ms`), the clock of every time in its status."""


def _set_class(node, on: bool, name: str) -> None:
    # Changing a class restyles the whole screen: only touch it when it changes.
    if node.has_class(name) != on:
        node.set_class(on, name)
