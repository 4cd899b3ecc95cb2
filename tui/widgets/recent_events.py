"""The last events under the node view on tall terminals: what happened lately, without switching views."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.text import Text

from lynxtop.contract.format import fmt_clock
from lynxtop.tui.widgets.text_panel import TextPanel

if TYPE_CHECKING:
    from lynxtop.contract.events import Event

SEVERITY_MARK = {"info": ("·", ""), "warning": ("!", "yellow"), "error": ("✗", "bold red"),
                 "critical": ("✗✗", "bold red reverse")}


class RecentEvents(TextPanel):
    DEFAULT_CSS = "RecentEvents { height: 1fr; border: round $primary-darken-2; padding: 0 1; }"

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.border_title = "Recent events (all in view 5)"

    def show(self, events: Sequence[Event] | None, utc: bool, note: str = "") -> None:
        """`events` newest first; None while none were read (then `note` says why)."""
        rows = max(1, self.size.height - 2)
        lines: list[Text] = []
        if note:
            lines.append(Text(note, style="dim"))
        for event in list(events or [])[: rows - len(lines)]:
            lines.append(_line(event, utc))
        if not lines:
            lines.append(Text("no events", style="dim"))
        out = Text("\n", no_wrap=True, overflow="ellipsis").join(lines)
        out.no_wrap, out.overflow = True, "ellipsis"
        self.update(out)


def _line(event: Event, utc: bool) -> Text:
    severity = str(event.severity)
    mark, style = SEVERITY_MARK.get(severity, ("?", ""))
    line = Text(no_wrap=True, overflow="ellipsis")
    line.append(fmt_clock(event.ts_ms, utc), style="dim")
    line.append(f"  {mark:<2} {severity:<8}", style=style)
    line.append(f" {str(event.kind):<20}", style="dim")
    if event.pending:  # held in the agent's memory, not in the history yet (as view 5 and `lynxtop events` mark it)
        line.append(" [pending]", style="bold black on yellow")
    line.append(" " + event.message)
    return line
