"""Ask where to write an export; the path is checked before the dialog closes."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from lynxtop.tui.export_csv import ExportError, check_target
from lynxtop.tui.screens import VIEWS_CSS


class ExportPathScreen(ModalScreen[str | None]):
    CSS_PATH = VIEWS_CSS
    BINDINGS = [Binding("escape,ctrl+c", "cancel", "Cancel", id="export.cancel")]

    def __init__(self, title: str, default_path: str):
        super().__init__()
        self.title_text = title
        self.default_path = default_path

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(self.title_text, id="dialog-title", markup=False)
            yield Input(value=self.default_path, id="export-path")
            yield Static("", id="export-error", markup=False)
            yield Static("Enter writes · Esc cancels (an existing file is never overwritten)", id="dialog-hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        try:
            path = check_target(event.value)
        except ExportError as exc:
            self.query_one("#export-error", Static).update(f"✗ {exc}")
            return
        self.dismiss(str(path))

    def action_cancel(self) -> None:
        self.dismiss(None)
