"""One event in full: its whole message (the list cuts or wraps it), its details as indented JSON, and the run it
belongs to (profile, model, start, end), read from the history when the list did not carry it."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Group
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from lynxtop.contract.format import fmt_datetime, fmt_duration
from lynxtop.contract.terminal import terminal_safe
from lynxtop.tui.history_source import HistoryUnavailable
from lynxtop.tui.screens import VIEWS_CSS
from lynxtop.tui.widgets.recent_events import SEVERITY_MARK


def field(record: Any, name: str) -> Any:
    """A field of an Event or RunInfo (contract/), or of the dict an older reader gave."""
    return record.get(name) if isinstance(record, dict) else getattr(record, name, None)


def details_json(details: Any) -> str:
    """Indented JSON of an event's details; its strings came escaped through the display reader or client
    (tui/foreign.py) and are escaped again here, so nothing in them reaches the terminal as a control."""
    if details is None:
        return "(no details)"
    text = json.dumps(details, indent=2, ensure_ascii=False, sort_keys=True, default=str)
    return terminal_safe(text, lines=True)


def run_lines(run: Any, utc: bool, now_ms: int) -> Text:
    """The run an event belongs to, as an operator asks about it: which profile, which model, when."""
    started, ended = field(run, "started_ms"), field(run, "ended_ms")
    t = Text(f"run {field(run, 'id')}: ", style="bold")
    t.append(str(field(run, "profile") or "(no profile)"))
    if field(run, "simulated"):
        t.append(" SIM", style="magenta")
    t.append(f"\nmodel {field(run, 'model') or 'N/A'}   host {field(run, 'host') or 'N/A'}", style="dim")
    t.append(f"\nstarted {fmt_datetime(started, utc) if started else 'N/A'}")
    if ended:
        length = f" after {fmt_duration((ended - started) / 1000)}" if started else ""
        t.append(f"   ended {fmt_datetime(ended, utc)}{length} ({field(run, 'end_reason') or 'ended'})")
    elif started:
        t.append(f"   running for {fmt_duration((now_ms - started) / 1000)}")
    return t


class EventDetailScreen(ModalScreen[None]):
    CSS_PATH = VIEWS_CSS
    BINDINGS = [Binding("escape,q,enter", "close", "Close", id="event.close")]

    def __init__(self, event: Any, run: Any = None):
        super().__init__()
        self.event = event
        self.run = run
        self.run_note = ""

    def compose(self) -> ComposeResult:
        sev = str(field(self.event, "severity") or "info")
        mark, _ = SEVERITY_MARK.get(sev, ("?", ""))
        with VerticalScroll(id="dialog", classes="wide"):
            yield Static(Text(f"{mark} {sev} event: {field(self.event, 'kind')}"), id="dialog-title")
            yield Static(id="event-body")
            yield Static("Esc closes", id="dialog-hint")

    def on_mount(self) -> None:
        self._draw()
        run_id = field(self.event, "run_id")
        if self.run is None and run_id is not None:
            self.load_run(int(run_id))

    @work(thread=True, exit_on_error=False)
    def load_run(self, run_id: int) -> None:
        app: Any = self.app
        try:
            with app.history.reader() as reader:
                run, note = reader.run(run_id, summary=False), f"run {run_id} is not in the history database"
        except HistoryUnavailable as exc:
            run, note = None, f"run {run_id}: history unavailable ({exc})"
        except Exception as exc:  # a damaged database: say so, keep the dialog
            run, note = None, f"run {run_id}: cannot read the history ({exc})"
        self.app.call_from_thread(self._got_run, run, note)

    def _got_run(self, run: Any, note: str) -> None:
        self.run, self.run_note = run, "" if run is not None else note
        self._draw()

    def _draw(self) -> None:
        app: Any = self.app
        e = self.event
        ts = field(e, "ts_ms")
        head = Text(f"{fmt_datetime(ts, app.utc) if ts else 'N/A'}", style="bold")
        if field(e, "id") is not None:
            head.append(f"   event #{field(e, 'id')}", style="dim")
        if field(e, "pending"):  # no id yet: the agent holds it in memory while it cannot write the history
            head.append("   pending: held by the agent, not in the history yet (writes failing)", style="yellow")
        parts: list[Any] = [head, Text(""), Text(str(field(e, "message") or "")), Text("")]
        parts.append(Text("details", style="bold"))
        parts.append(Text(details_json(field(e, "details"))))
        parts.append(Text(""))
        if self.run is not None:
            parts.append(run_lines(self.run, app.utc, app.node_now_ms()))
        elif field(e, "run_id") is None:
            parts.append(Text("no run: the agent recorded it outside a run", style="dim"))
        else:
            parts.append(Text(self.run_note or f"run {field(e, 'run_id')}: loading…", style="dim"))
        self.query_one("#event-body", Static).update(Group(*parts))

    def action_close(self) -> None:
        self.dismiss(None)
