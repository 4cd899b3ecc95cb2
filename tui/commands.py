"""The command palette (ctrl+p, or `:` as in k9s): every action the open view has a key for, by its name.

The commands are read from the bindings in force where the palette was opened (the app's, the view's, the
focused widget's), so a key added anywhere is in the palette without a list to keep in step; what the view hides
(check_action False: read-only controls, the demo's load outside the demo) is not offered, and what it shows
greyed (no agent to send it to) is offered with that said.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from textual.app import App
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.screen import Screen

PALETTE_ACTION = "command_palette"


@dataclass(frozen=True)
class Command:
    name: str  # the binding's description: "GPU view", "Restart", "Sort column"
    action: str  # as the binding names it: "view('gpu')"
    node: Any  # the DOM node the action runs on (the app, the view or a widget)
    key: str  # as the key bar shows it
    enabled: bool  # False: shown greyed in the view (e.g. no agent to send a control to)

    @property
    def help(self) -> str:
        """Its key and where it acts: everywhere (the app), in this view, or on the focused widget."""
        if isinstance(self.node, App):
            where = "any view"
        elif isinstance(self.node, Screen):
            where = f"{getattr(self.node, 'VIEW_TITLE', '') or type(self.node).__name__} view"
        else:
            where = f"focused {type(self.node).__name__}"
        return f"key {self.key} · {where}" + ("" if self.enabled else " · not available now")


def commands(screen: Screen[Any]) -> list[Command]:
    """Every named binding of the focused widget, its containers, the view and the app, once per name and action:
    also those whose key a nearer binding takes (Enter on a table is the table's), which the palette still reaches;
    the palette's own key left out."""
    app = screen.app
    focused = screen.focused
    nodes = list(focused.ancestors_with_self) if focused is not None else [screen, app]
    out: list[Command] = []
    seen: set[tuple[str, str]] = set()
    for node in nodes:
        for key, binding in node._bindings:
            if not binding.description or binding.action == PALETTE_ACTION:
                continue
            if (binding.description, binding.action) in seen:
                continue
            state = app._check_action_state(binding.action, node)
            if state is False:
                continue  # hidden in this view (read-only, not the demo, not a Ray head)
            seen.add((binding.description, binding.action))
            shown = binding.key_display or app.get_key_display(binding) or key
            out.append(Command(binding.description, binding.action, node, shown, bool(state)))
    return out


class LynxtopCommands(Provider):
    """Offers `commands(screen)` by name; choosing one runs its action where its key would."""

    def _commands(self) -> Iterator[Command]:
        yield from commands(self.screen)

    def _run(self, command: Command) -> partial[Any]:
        return partial(self.app.run_action, command.action, command.node)

    async def discover(self) -> Hits:
        for command in sorted(self._commands(), key=lambda c: c.name.lower()):
            yield DiscoveryHit(command.name, self._run(command), text=command.name, help=command.help)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for command in self._commands():
            score = matcher.match(command.name)
            if score > 0:
                yield Hit(score, matcher.highlight(command.name), self._run(command), text=command.name,
                          help=command.help)
