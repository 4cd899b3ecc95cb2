"""Choose the profile to switch to (or to start).

It marks the running profile as current, and the switch dialog that follows diffs against it: when the run
changes while it is open, the app withdraws it (`withdraw`) rather than let a stale choice through.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from lynxtop.contract.records import ProfileInfo
from lynxtop.tui.screens import VIEWS_CSS

if TYPE_CHECKING:
    from lynxtop.tui.control_text import Seen


class ProfilePickerScreen(ModalScreen[str | None]):
    CSS_PATH = VIEWS_CSS
    BINDINGS = [Binding("escape,ctrl+c", "cancel", "Cancel", id="picker.cancel")]

    def __init__(self, title: str, profiles: list[ProfileInfo], current: str | None, seen: Seen | None = None):
        super().__init__()
        self.title_text = title
        self.profiles = profiles
        self.current = current
        self.seen = seen  # the run it was opened on
        self.withdrawn: str | None = None  # why the app took it back; None while valid

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

    def on_screen_resume(self) -> None:
        if self.withdrawn is not None:
            self.dismiss(None)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id if self.withdrawn is None else None)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def withdraw(self, reason: str) -> None:
        """The run it was opened on changed: nothing chosen here may go on to a dialog."""
        self.withdrawn = reason
        if self.is_active:
            self.dismiss(None)
