"""Confirmation of an action that interrupts serving: says what will happen; Cancel has the focus.

The dialog names the run it acts on (`seen`); the app watches the live status while it is open and withdraws it
(`withdraw`) when that run changes, or refreshes its text (`update_body`, Cancel focused again) when the same run
only moves on: a dialog can never confirm a run other than the one it shows.

With `live` (the body as it reads now), the text also follows the clock once a second: "12m00s of this load is
lost" counts on while the operator thinks. Redrawn only when the text changed, and without moving the focus (the
run is the same; only the figure grew).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.console import Console, RenderableType
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.css.scalar import Scalar
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from lynxtop.tui.screens import VIEWS_CSS

if TYPE_CHECKING:
    from lynxtop.tui.control_text import Seen


# The body's rows: at most what a tall screen shows before it scrolls, at least enough to read a line on a tiny one
MAX_BODY_ROWS = 24
MIN_BODY_ROWS = 2
TICK_S = 1.0  # the figures in the body count in whole seconds


def _drawn(body: RenderableType) -> str:
    """The body as the terminal would get it (text and styles), to tell whether a redraw would change anything."""
    console = Console(width=500, file=io.StringIO(), color_system="truecolor", force_terminal=True,
                      legacy_windows=False)
    console.print(body)
    return console.file.getvalue()  # type: ignore[attr-defined]


class ConfirmScreen(ModalScreen[bool]):
    CSS_PATH = VIEWS_CSS
    BINDINGS = [
        Binding("escape,n,ctrl+c", "cancel", "Cancel", id="confirm.cancel"),
        Binding("left,right", "toggle_focus", "Move", show=False, id="confirm.move"),
    ]

    def __init__(
        self, title: str, body: RenderableType, confirm_label: str, danger: bool = True, seen: Seen | None = None,
        live: Callable[[], RenderableType] | None = None,
    ):
        """`live`: the body as it reads now (the app's status, the node's clock), looked at every TICK_S."""
        super().__init__()
        self.title_text = title
        self.body = body
        self.live = live
        self._shown = _drawn(body)
        self.confirm_label = confirm_label
        self.danger = danger
        self.seen = seen  # the run the body shows; what the confirmed action is sent for
        self.withdrawn: str | None = None  # why the app took the dialog back (its run changed); None while valid

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(self.title_text, id="dialog-title", markup=False)
            with VerticalScroll(id="dialog-body"):
                yield Static(self.body, id="dialog-text", markup=False)
            with Horizontal(id="dialog-buttons"):
                yield Button("Cancel", id="cancel", variant="primary")
                yield Button(self.confirm_label, id="confirm", variant="error" if self.danger else "warning")
            yield Static("Tab/←→ move · Enter press · Esc cancel", id="dialog-hint")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()
        self.call_after_refresh(self._fit_body)
        if self.live is not None:
            self.set_interval(TICK_S, self._tick)

    def _tick(self) -> None:
        self._follow()  # a worker: a timer callback that raised would end the app

    @work(group="confirm-tick", exclusive=True, exit_on_error=False)
    async def _follow(self) -> None:
        """The body as it reads now; redrawn only where it changed, the focus left where the operator put it."""
        if self.live is None or self.withdrawn is not None or not self.is_mounted:
            return
        self._show(self.live())

    def _show(self, body: RenderableType) -> bool:
        """Show `body` if it reads differently from what is shown; whether it did."""
        self.body = body
        drawn = _drawn(body)
        if drawn == self._shown:
            return False
        self._shown = drawn
        if self.is_mounted:
            self.query_one("#dialog-text", Static).update(body)
        return True

    def on_resize(self) -> None:
        self.call_after_refresh(self._fit_body)

    def _fit_body(self) -> None:
        """The body gets the rows the dialog's height limit leaves after its frame, title, buttons and hint, and
        scrolls beyond them: the buttons are always on screen. CSS alone cannot say it (a max-height of the body
        in rows pushed them off an 80x24 screen; one in fr or % is the dialog's whole height, not what is left)."""
        if not self.is_mounted:
            return
        dialog = self.query_one("#dialog", Vertical)
        body = self.query_one("#dialog-body", VerticalScroll)
        limit = dialog.styles.max_height
        if limit is None:
            return
        rows = int(limit.resolve(self.size, self.size)) - dialog.styles.gutter.height
        for part in ("#dialog-title", "#dialog-buttons", "#dialog-hint"):
            widget = self.query_one(part)
            rows -= widget.outer_size.height + widget.styles.margin.height
        fitted = max(MIN_BODY_ROWS, min(MAX_BODY_ROWS, rows))
        if body.styles.max_height != Scalar.from_number(fitted):
            body.styles.max_height = fitted

    def on_screen_resume(self) -> None:
        if self.withdrawn is not None:  # withdrawn while something was above it: go now
            self.dismiss(False)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm" and self.withdrawn is None)

    def action_cancel(self) -> None:
        self.dismiss(False)

    def action_toggle_focus(self) -> None:
        cancel = self.query_one("#cancel", Button)
        if self.withdrawn is None:
            (self.query_one("#confirm", Button) if cancel.has_focus else cancel).focus()

    def update_body(self, body: RenderableType) -> None:
        """The same run moved on (starting -> ready): the text follows it, and Cancel takes the focus back so an
        Enter already on its way does not confirm what the operator has not read."""
        self._show(body)
        if self.is_mounted:
            self.query_one("#cancel", Button).focus()

    def withdraw(self, reason: str) -> None:
        """The run it shows changed: it can no longer be confirmed, and it leaves (at once if on top, else when it
        comes back on top); the caller tells the operator why."""
        self.withdrawn = reason
        if self.is_mounted:
            self.query_one("#confirm", Button).disabled = True
        if self.is_active:
            self.dismiss(False)
