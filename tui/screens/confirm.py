"""Confirmation of an action that interrupts serving: says what will happen; Cancel has the focus."""

from __future__ import annotations

from rich.console import RenderableType
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from lynxtop.tui.screens import VIEWS_CSS


class ConfirmScreen(ModalScreen[bool]):
    CSS_PATH = VIEWS_CSS
    BINDINGS = [
        Binding("escape,n,ctrl+c", "cancel", "Cancel", id="confirm.cancel"),
        Binding("left,right", "toggle_focus", "Move", show=False, id="confirm.move"),
    ]

    def __init__(self, title: str, body: RenderableType, confirm_label: str, danger: bool = True):
        super().__init__()
        self.title_text = title
        self.body = body
        self.confirm_label = confirm_label
        self.danger = danger

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(self.title_text, id="dialog-title", markup=False)
            with VerticalScroll(id="dialog-body"):
                yield Static(self.body, markup=False)
            with Horizontal(id="dialog-buttons"):
                yield Button("Cancel", id="cancel", variant="primary")
                yield Button(self.confirm_label, id="confirm", variant="error" if self.danger else "warning")
            yield Static("Tab/←→ move · Enter press · Esc cancel", id="dialog-hint")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm")

    def action_cancel(self) -> None:
        self.dismiss(False)

    def action_toggle_focus(self) -> None:
        cancel = self.query_one("#cancel", Button)
        (self.query_one("#confirm", Button) if cancel.has_focus else cancel).focus()
