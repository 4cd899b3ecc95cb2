"""The key line at the bottom: every key the current view answers to, each shown whole or not at all.

Textual's Footer builds a widget per key and restyles each whenever bindings change; at start-up that was a
third of the time to the first frame. Keys shown greyed are present but not possible now (agent unreachable).

A key cut to "S Star…" reads as a different key, so the bar never cuts one: when the keys do not fit the width,
the gaps narrow, then the bar takes a second row, then the least-needed keys are left out (the help screen, `?`,
which is always shown, lists every key).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.cells import cell_len
from rich.text import Text
from textual import events
from textual.screen import Screen

from lynxtop.tui.widgets.text_panel import TextPanel

MAX_ROWS = 2
# Which keys go first when there is no room (higher goes first); help is never left out.
RANK_HELP, RANK_QUIT, RANK_VIEWS, RANK_VIEW_KEYS, RANK_APP = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class KeyItem:
    keys: str  # "R", or "12345" for a group
    description: str
    enabled: bool
    rank: int

    @property
    def label(self) -> str:
        return f"{self.keys} {self.description}"

    @property
    def width(self) -> int:
        return cell_len(self.label)


class KeyBar(TextPanel):
    DEFAULT_CSS = "KeyBar { height: 1; dock: bottom; background: $panel; padding: 0 1; }"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.items: list[KeyItem] = []
        self.shown: list[KeyItem] = []  # what the last layout shows, for tests and the help screen
        self._width = 0

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._bindings_changed)
        self.call_after_refresh(self._bindings_changed, self.screen)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def _bindings_changed(self, screen: Screen) -> None:
        if screen is self.screen and screen.is_current:
            self.items = key_items(screen.active_bindings.values(), self.app)
            self._layout_keys()

    def on_show(self) -> None:
        self._bindings_changed(self.screen)

    def on_resize(self, event: events.Resize) -> None:
        if self.size.width != self._width:
            self._layout_keys()

    def _layout_keys(self) -> None:
        self._width = self.size.width
        if self._width <= 0:
            return
        rows = fit_keys(self.items, self._width)
        self.shown = [item for row in rows for item in row]
        if self.styles.height is None or self.styles.height.value != max(1, len(rows)):
            self.styles.height = max(1, len(rows))  # a layout pass only when the row count changes
        self.update(render_rows(rows, gap=_gap(rows, self._width)))


def key_items(active: Any, app: Any) -> list[KeyItem]:
    """Shown bindings, each action once, in binding order; grouped keys (the views) as one `12345 views`."""
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
            order.append(("key", (key, binding.description, enabled, _rank(binding, item.node is app))))
    out = []
    for kind, value in order:
        if kind == "group":
            keys = groups[value]
            out.append(KeyItem("".join(k for k, _ in keys), value.description, any(e for _, e in keys),
                               RANK_VIEWS))
        else:
            out.append(KeyItem(*value))
    return out


def _rank(binding: Any, app_level: bool) -> int:
    if binding.action == "help":
        return RANK_HELP
    if binding.action == "quit":
        return RANK_QUIT
    return RANK_APP if app_level else RANK_VIEW_KEYS


def fit_keys(items: list[KeyItem], width: int, max_rows: int = MAX_ROWS) -> list[list[KeyItem]]:
    """Rows of whole keys within `width`: one row if it fits, else up to `max_rows`; keys that still do not fit
    are left out, highest rank first and later before earlier, keeping the order of the rest."""
    kept = list(items)
    while True:
        rows = _pack(kept, width, max_rows)
        if rows is not None:
            return rows
        droppable = [i for i, item in enumerate(kept) if item.rank != RANK_HELP]
        if not droppable:
            return [[item for item in kept if item.width <= width]][:max_rows]
        worst = max(droppable, key=lambda i: (kept[i].rank, i))
        del kept[worst]


def _pack(items: list[KeyItem], width: int, max_rows: int) -> list[list[KeyItem]] | None:
    """Greedy rows with one-space gaps; None when more than `max_rows` are needed or a key is wider than a row."""
    rows: list[list[KeyItem]] = [[]]
    used = 0
    for item in items:
        if item.width > width:
            return None
        need = item.width + (1 if rows[-1] else 0)
        if used + need > width:
            rows.append([item])
            used = item.width
        else:
            rows[-1].append(item)
            used += need
    return rows if len(rows) <= max_rows else None


def _gap(rows: list[list[KeyItem]], width: int) -> int:
    """Two spaces between keys where every row still fits with them, one where it would not."""
    widest = max((sum(i.width for i in row) + 2 * (len(row) - 1) for row in rows), default=0)
    return 2 if widest <= width else 1


def render_rows(rows: list[list[KeyItem]], gap: int = 2) -> Text:
    out = Text(no_wrap=True, overflow="crop")
    for r, row in enumerate(rows):
        if r:
            out.append("\n")
        for i, item in enumerate(row):
            if i:
                out.append(" " * gap)
            out.append(item.keys, style="bold reverse" if item.enabled else "dim reverse")
            out.append(f" {item.description}", style="" if item.enabled else "dim")
    return out


def render_keys(active: Any, app: Any, width: int = 10_000) -> Text:
    """All shown keys as the bar draws them at `width` columns."""
    return render_rows(fit_keys(key_items(active, app), width))
