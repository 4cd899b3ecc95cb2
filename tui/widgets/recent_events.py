"""The last events under the node view on tall terminals: what happened lately, without switching views."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.text import Text

from lynxtop.contract.format import fmt_when, now_ms
from lynxtop.tui.glyphs import app_ascii, ascii_text
from lynxtop.tui.widgets.text_panel import TextPanel

if TYPE_CHECKING:
    from lynxtop.contract.events import Event

WHEN_WIDTH = len("12-03 10:00Z")  # the widest time fmt_when gives in short form
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
        shown = list(events or [])[: rows - len(lines)]
        now = self._now_ms()
        # One width for the time column: today's clock padded to a dated line's, so the columns line up (a bad
        # time's long text is left out of the measure: its own line only is pushed).
        widths = [len(fmt_when(e.ts_ms, now, utc, short=True)) for e in shown]
        width = max((w for w in widths if w <= WHEN_WIDTH), default=0)
        for event in shown:
            lines.append(_line(event, utc, now, width))
        if not lines:
            lines.append(Text("no events", style="dim"))
        out = Text("\n", no_wrap=True, overflow="ellipsis").join(lines)
        out.no_wrap, out.overflow = True, "ellipsis"
        self.update(ascii_text(out, app_ascii(self)))

    def _now_ms(self) -> int:
        """Now on the node's clock, as the app tells it (frozen in the snapshots): what the events' times and
        their dates compare with. The wall clock where the app has none (a bare test app)."""
        node_now = getattr(self.app, "node_now_ms", None)
        return node_now() if callable(node_now) else now_ms()


def _line(event: Event, utc: bool, now: int | None = None, width: int = 0) -> Text:
    """One event: its time (the clock for today's, `12-03 10:00` for another day's: a crash three days old must
    not read as today's), padded to `width`, its severity, kind and message."""
    severity = str(event.severity)
    mark, style = SEVERITY_MARK.get(severity, ("?", ""))
    line = Text(no_wrap=True, overflow="ellipsis")
    when = fmt_when(event.ts_ms, now_ms() if now is None else now, utc, short=True)
    line.append(when.ljust(width), style="dim")
    line.append(f"  {mark:<2} {severity:<8}", style=style)
    line.append(f" {str(event.kind):<20}", style="dim")
    if event.pending:  # held in the agent's memory, not in the history yet (as view 5 and `lynxtop events` mark it)
        line.append(" [pending]", style="bold black on yellow")
    line.append(" " + event.message)
    return line
