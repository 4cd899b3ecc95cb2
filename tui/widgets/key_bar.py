"""The key line at the bottom: every key the current view answers to, as one line of text.

Textual's Footer builds a widget per key and restyles each whenever bindings change; at start-up that was a
third of the time to the first frame. Keys shown greyed are present but not possible now (agent unreachable).
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.screen import Screen

from lynxtop.tui.widgets.text_panel import TextPanel


class KeyBar(TextPanel):
    DEFAULT_CSS = "KeyBar { height: 1; dock: bottom; background: $panel; padding: 0 1; }"

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._bindings_changed)
        self.call_after_refresh(self._bindings_changed, self.screen)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def _bindings_changed(self, screen: Screen) -> None:
        if screen is self.screen and screen.is_current:
            self.update(render_keys(screen.active_bindings.values(), self.app))

    def on_show(self) -> None:
        self._bindings_changed(self.screen)


def render_keys(active: Any, app: Any) -> Text:
    """Grouped keys (the views) read as `12345 views`; each action once, in binding order."""
    out = Text(no_wrap=True, overflow="ellipsis")
    seen_actions: set[str] = set()
    groups: dict[Any, list[tuple[str, bool]]] = {}
    order: list[tuple[str, Any]] = []
    for item in active:
        binding, enabled = item.binding, item.enabled
        if not binding.show or binding.action in seen_actions:
            continue
        seen_actions.add(binding.action)
        key = app.get_key_display(binding)
        if binding.group is not None:
            if binding.group not in groups:
                groups[binding.group] = []
                order.append(("group", binding.group))
            groups[binding.group].append((key, enabled))
        else:
            order.append(("key", (key, binding.description, enabled)))
    for kind, value in order:
        if kind == "group":
            keys = groups[value]
            out.append("".join(k for k, _ in keys), style="bold reverse")
            out.append(f" {value.description}  ")
        else:
            key, description, enabled = value
            out.append(f"{key}", style="bold reverse" if enabled else "dim reverse")
            out.append(f" {description}  ", style="" if enabled else "dim")
    return out
