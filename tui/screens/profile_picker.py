"""Choose the profile to switch to (or to start)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from lynxtop.contract.records import ProfileInfo
from lynxtop.tui.screens import VIEWS_CSS


class ProfilePickerScreen(ModalScreen[str | None]):
    CSS_PATH = VIEWS_CSS
    BINDINGS = [Binding("escape,ctrl+c", "cancel", "Cancel", id="picker.cancel")]

    def __init__(self, title: str, profiles: list[ProfileInfo], current: str | None):
        super().__init__()
        self.title_text = title
        self.profiles = profiles
        self.current = current

    def compose(self) -> ComposeResult:
        options = []
        for p in self.profiles:
            label = Text(p.name, style="bold")
            if p.name == self.current:
                label.append("  (current)", style="dim")
            if p.description:
                label.append(f"  {p.description}", style="dim")
            options.append(Option(label, id=p.name, disabled=p.name == self.current))
        with Vertical(id="dialog"):
            yield Static(self.title_text, id="dialog-title", markup=False)
            yield OptionList(*options, id="profiles")
            yield Static("↑↓ choose · Enter select · Esc cancel", id="dialog-hint")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
