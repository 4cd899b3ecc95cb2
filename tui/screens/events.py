"""View 5: the event list (filter by kind, severity, text) and the vLLM log of a run (with search)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import events, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Input, Log, Static

from lynxtop.contract.client import AgentRefused, AgentUnreachable
from lynxtop.contract.events import Event, identity
from lynxtop.contract.format import fmt_datetime, fmt_when
from lynxtop.contract.records import RunInfo
from lynxtop.contract.terminal import terminal_safe
from lynxtop.tui.glyphs import ascii_text, glyph
from lynxtop.tui.history_source import HistoryUnavailable
from lynxtop.tui.screens import VIEWS_CSS
from lynxtop.tui.screens.base import LiveScreen
from lynxtop.tui.widgets.cursor_table import CursorTable
from lynxtop.tui.widgets.recent_events import SEVERITY_MARK

SEVERITIES = ("info", "warning", "error", "critical")
SHORT_SEVERITY = {"warning": "warn", "critical": "crit"}  # below 120 columns, for the message's room
REFRESH_S = 5.0
EVENTS_READ = 1000  # the newest events that match the filters, read from the history each refresh
LOG_LINES = 2000
PENDING_ASKED = 500  # the agent's newest events asked for its held ones while the history is not written
# Before the message of an event the agent holds in memory (`Event.pending`), as `lynxtop events` prints it; the
# title line says what it means
PENDING_TAG, PENDING_STYLE = "[pending]", "bold black on yellow"


RUN_LOG_KEYS = Binding.Group("run log", compact=True)
# Before the title of the pane the keys act on (`/` filters the events or searches the log, by focus): a mark, not
# colour alone, says where typing goes (views.tcss lights the line and the focused box too)
KEYS_MARK, KEYS_MARK_ASCII = "▶ ", "> "


class EventsScreen(LiveScreen):
    CSS_PATH = VIEWS_CSS
    VIEW_TITLE = "Events & logs"
    BINDINGS = [
        Binding("slash", "filter", "Filter/search", key_display="/", id="events.filter"),
        # K, not k: k and j move the table's cursor, as in every other list (CursorTable)
        Binding("K", "cycle_kind", "Kind", key_display="K", id="events.kind"),
        Binding("v", "cycle_severity", "Severity", id="events.severity"),
        Binding("left_square_bracket", "log_run(-1)", "Older run's log", key_display="[", id="events.older",
                group=RUN_LOG_KEYS),
        Binding("right_square_bracket", "log_run(1)", "Newer run's log", key_display="]", id="events.newer",
                group=RUN_LOG_KEYS),
        Binding("escape", "clear_filter", "Clear filter", show=False, id="events.clear"),
        Binding("enter", "open_event", "Event detail", show=False, id="events.detail"),  # the table's Enter too
    ]

    def __init__(self) -> None:
        super().__init__()
        self.events: list[Event] = []
        self.kind: str | None = None
        self.min_severity = "info"
        self.text_filter = ""
        self.log_search = ""
        self.log_lines: list[str] = []
        self.log_run: int | None = None  # None = current run
        self.runs: list[RunInfo] = []
        self.shown: list[Event] = []
        self.source = ""
        self._last_fetch = 0.0
        self._log_unavailable = False  # the last fetch_log found no run to read the log file of (agent down)
        self._log_matched = 0  # log lines the search matched, as last filled
        self._cut = False  # the last read returned EVENTS_READ rows: older matching ones are not listed
        self._in_sql = True  # the last read filtered in the database (an older node's agent cannot: see _read)
        self._searching = False  # a filter changed and its read has not answered yet: "no match" would be early
        self._families: set[str] = set()  # kind families seen in any read, for `K` (a filtered read has one)
        self._filled: tuple | None = None  # what the table was last filled from (_fill_key)
        # The rows as last filled, for adding new events' rows without building the others again (_update_rows):
        # row i's key (_row_keys), each key's cells, the message column's width they were wrapped at
        self._row_keys: list[str] = []
        self._row_cells: dict[str, list[Text]] = {}
        self._msg_w: int | None = None
        self._widths: list[int] = []  # the other columns' widths, as last filled
        self._read_filters: tuple[str | None, str, str] = (None, "info", "")  # kind, severity, text of a read

    def compose_body(self) -> ComposeResult:
        yield Static(id="events-filters")
        yield CursorTable(id="events", cursor_type="row")
        yield Input(placeholder="filter events (Enter applies, Esc clears)", id="filter")
        yield Static(id="log-title")
        yield Log(id="log", max_lines=LOG_LINES, highlight=False)

    def on_mount(self) -> None:
        table = self.query_one("#events", DataTable)
        for key, label in (("ts", "time"), ("sev", "severity"), ("kind", "kind"), ("run", "run"),
                           ("msg", "message")):
            table.add_column(label, key=key)

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        self.fetch_events()
        self.fetch_log()

    def draw(self, now_ms: int) -> None:
        if time.monotonic() - self._last_fetch > REFRESH_S:
            self.fetch_events()
        self._draw_filters()

    # ------------------------------------------------------------------ data
    @work(exclusive=True, group="events", exit_on_error=False)
    async def fetch_events(self) -> None:
        self._last_fetch = time.monotonic()
        events: list[Event] | None
        filters = self._read_filters = (self.kind, self.min_severity, self.text_filter)
        try:
            events, self._in_sql = await asyncio.to_thread(self._events_from_store)
            self._cut = len(events) >= EVENTS_READ
            history = self.lynx.history
            self.source = getattr(history, "label", None) or f"history database {history.path}"
            events = await self._with_held(events)
        except HistoryUnavailable as exc:
            try:
                events = list(reversed(await self.lynx.source.events(limit=500)))
                self._cut, self._in_sql = False, False
                self.source = f"agent (history unavailable: {exc})"
            except (AgentUnreachable, AgentRefused) as exc2:
                self.source = f"no events: {exc}; agent: {exc2}"
                events = None
        if events is not None:
            self.events = events
            self._families |= {str(_kind(e)).split(".")[0] + "." for e in events if _kind(e)}
        if filters == (self.kind, self.min_severity, self.text_filter):
            self._searching = False  # else a newer filter's read is on its way (this worker's group is exclusive)
        if events is not None:
            self._fill_events()
        self._draw_filters()
        if self._log_unavailable and self.runs:
            # fetch_log ran before the runs (their log files' paths) were read: with the agent down it found no
            # path, and on first open nothing would have asked again.
            self.fetch_log()

    async def _with_held(self, stored: list[Event]) -> list[Event]:
        """`stored` (newest first) with the events the agent holds in memory while it cannot write the history (a
        full disk): those explain the outage and are in no database yet. Asked only while the status says writes
        fail; each listed once: one the database holds by now (written between the two reads) is shown from it
        (contract/events.py: `identity`, as a held event has no id)."""
        state = self.lynx.state
        if not (state.connected and state.agent.store.not_writing):
            return stored
        try:
            answer = await self.lynx.source.events(limit=PENDING_ASKED)
        except (AgentUnreachable, AgentRefused):
            return stored  # the stored ones still shown; the agent's outage is the header's to tell
        seen = {identity(e) for e in stored}
        held = [e for e in answer if e.pending and identity(e) not in seen]
        if not held:
            return stored
        return sorted([*stored, *held], key=lambda e: (e.ts_ms or 0, e.pending, e.id or 0), reverse=True)

    def _events_from_store(self) -> tuple[list[Event], bool]:
        """(events newest first, whether the database filtered them: see _read), under the filters as they were
        when the read started (`_read_filters`: a key pressed meanwhile asks again)."""
        with self.lynx.history.reader() as reader:
            try:
                events, in_sql = self._read(reader, *self._read_filters)
            except Exception as exc:  # a row this version cannot read (its message names it): said, not blank
                raise HistoryUnavailable(terminal_safe(str(exc)) or type(exc).__name__) from exc
            try:
                self.runs = reader.runs(limit=50)
            except Exception:
                self.runs = []
        # newest first for the operator
        return sorted(events, key=lambda e: (e.ts_ms or 0, e.id or 0), reverse=True), in_sql

    def _read(self, reader: Any, kind: str | None, min_severity: str, text: str) -> tuple[list[Event], bool]:
        """(The newest EVENTS_READ events matching the filters, whether every filter was applied before the
        limit), filtered by the database: reading the newest rows and filtering them here found nothing older
        than a flood of other events (s21). Another node's reader filters in that node's database too
        (tui/cluster_source.py, over its TCP history reads). A reader that takes no filters (a TypeError: an
        older agent's, FiltersUnsupported) gives its newest rows, filtered here after; the title then says only
        those were searched. The text goes to SQL only in ASCII: SQLite's LIKE folds the case of ASCII letters
        alone, and the view matches in any case; a non-ASCII text is matched here in the rows read, so those
        were all it searched."""
        floor = SEVERITIES.index(min_severity)
        filters: dict[str, Any] = {}
        if floor:
            filters["severities"] = list(SEVERITIES[floor:])
        if kind:  # `gpu.` a family, anything else one kind
            filters["kind_family" if kind.endswith(".") else "kinds"] = kind if kind.endswith(".") else [kind]
        if text and text.isascii():
            filters["text"] = text
        if filters:
            try:
                return reader.events(limit=EVENTS_READ, **filters), not text or "text" in filters
            except TypeError as exc:
                if "unexpected keyword" not in str(exc):
                    raise
        return reader.events(limit=EVENTS_READ), not filters and not text

    @work(exclusive=True, group="log", exit_on_error=False)
    async def fetch_log(self) -> None:
        title = self.query_one("#log-title", Static)
        try:
            data = await self.lynx.source.logs(self.log_run, LOG_LINES)
            self.log_lines = [str(x) for x in data.get("lines") or []]
            header = f"vLLM log of run {data.get('run_id', '?')}  {data.get('path', '')}"
            self._log_unavailable = False
        except (AgentUnreachable, AgentRefused) as exc:
            lines, header, found = await asyncio.to_thread(self._log_from_file, str(exc))
            if not found and self.runs:  # the runs arrived meanwhile (fetch_events): their path is known now
                lines, header, found = await asyncio.to_thread(self._log_from_file, str(exc))
            self.log_lines = lines
            self._log_unavailable = not found
        self._log_header = header
        title.update(Text(header, style="bold"))
        self._fill_log()

    def _log_from_file(self, why: str) -> tuple[list[str], str, bool]:
        """With the agent down, read the run's log file directly (its path is in the runs table). Only on this
        node: another node's path names a file there, and the same path here may hold another run's log.

        (lines, header, whether the runs were known: False, before fetch_events has read them, asks again). The
        file is vLLM's output, foreign text: each line, like the path and the system's error, comes with its
        control characters escaped (contract/terminal.py), as the agent's /v1/logs lines do (tui/foreign.py), so
        no escape sequence in it reaches the terminal."""
        if self.lynx.viewing_node is not None:
            return [], f"vLLM log unavailable: {why}", True  # asking again would not help
        run = None
        if self.runs:
            run = next((r for r in self.runs if r.id == self.log_run), None) if self.log_run else self.runs[0]
        path = run.log_path if run else None
        if not path:
            return [], f"vLLM log unavailable: {why}", bool(self.runs)
        try:
            with open(path, errors="replace") as f:
                lines = [terminal_safe(line.rstrip("\n")) for line in deque(f, maxlen=LOG_LINES)]
        except OSError as exc:
            return [], (f"vLLM log of run {run.id}: cannot read {terminal_safe(path)}: "
                        f"{terminal_safe(exc.strerror or exc)}"), True
        shown = terminal_safe(Path(path))
        return lines, f"vLLM log of run {run.id}  {shown}  (read from file: agent unreachable)", True

    # ------------------------------------------------------------------ drawing
    def _visible_events(self) -> list[Event]:
        floor = SEVERITIES.index(self.min_severity)
        needle = self.text_filter.lower()
        out = []
        for e in self.events:
            sev = str(e.severity)
            if sev in SEVERITIES and SEVERITIES.index(sev) < floor:
                continue
            if self.kind and not kind_matches(str(_kind(e)), self.kind):
                continue
            if needle and needle not in f"{e.kind} {e.message}".lower():
                continue
            out.append(e)
        return out

    def _fill_key(self, table: DataTable, narrow: bool, now_ms: int) -> tuple[tuple, tuple]:
        """What the table's rows are made of: (the events read: their count, newest and oldest, the held ones;
        the filters and what the cells' text depends on). Equal to the last fill's: nothing to redraw. Only the
        first differing: the rows shown can be kept and the new ones added (_update_rows)."""
        def ident(e: Event | None) -> tuple | None:
            return None if e is None else (e.id, e.ts_ms, e.pending)

        events = self.events
        # The screen's width: the table's own loses the scrollbar's 2 once filled. Today's date in the displayed
        # zone: past its midnight today's time cells gain their dates (_when) at once, not at the next hour.
        return ((len(events), ident(events[0] if events else None), ident(events[-1] if events else None),
                 tuple(identity(e) for e in events if e.pending)),
                (self.kind, self.min_severity, self.text_filter, narrow, self.lynx.utc, self.size.width,
                 table.scrollable_content_region.width > 0, fmt_datetime(now_ms, self.lynx.utc)[:10]))

    def _fill_events(self) -> None:
        """The table from `events` under the filters. Not rebuilt when nothing it shows changed, and when only the
        events changed (new ones read) their rows are added and the dropped ones removed (_update_rows):
        refilling 1,000 rows every refresh froze the dashboard for over half a second and put the operator's
        cursor back on the first row."""
        table = self.query_one("#events", DataTable)
        utc = self.lynx.utc
        now = self.lynx.now_ms()
        narrow = self.size.width < 120
        key = self._fill_key(table, narrow, now)
        if key == self._filled:
            return
        same_cells = self._filled is not None and key[1] == self._filled[1]
        self._filled = key
        shown = self._visible_events()
        keys = _row_keys(shown)
        if same_cells and self._update_rows(table, shown, keys, utc, now, narrow):
            return
        table.clear()
        self.shown = shown  # row i of the table is shown[i] (the detail's key)
        rows = [_row(e, utc, now, narrow, self.lynx.ascii_only) for e in shown]
        msg_w = self._msg_w = _message_width(table, rows)
        self._widths = _other_widths(table, rows)
        self._row_keys, self._row_cells = keys, dict(zip(keys, rows, strict=True))
        for row_key, row in zip(keys, rows, strict=True):
            table.add_row(*row, height=self._height(row, msg_w), key=row_key)

    def _update_rows(self, table: DataTable, shown: list[Event], keys: list[str], utc: bool, now: int,
                     narrow: bool) -> bool:
        """The table brought to `shown` (the same filters and cells as its last fill, other events) by row key:
        rows of events no longer shown (beyond EVENTS_READ, held ones stored since) removed, new ones built and
        added, the rest kept as they are, and the cursor left on its event (on the newest row it follows the
        newest: one looking at row 0 watches what comes in). False, nothing changed: a rebuild is
        the cheaper or the only right one (most rows new; a column's width changed, so every message rewraps)."""
        old = self._row_keys
        new_keys = set(keys)
        if 2 * sum(k in new_keys for k in old) < len(keys):
            return False  # removing rows one by one costs the table a pass over all of them each
        cells = self._row_cells
        ascii_only = self.lynx.ascii_only
        built = {k: _row(e, utc, now, narrow, ascii_only) for k, e in zip(keys, shown, strict=True) if k not in cells}
        # The message column keeps its width while the others keep theirs (the table's own width differs only
        # by the scrollbar, which _message_width keeps room for): the kept rows' wrapping still fits.
        if _other_widths(table, [cells[k] if k in cells else built[k] for k in keys]) != self._widths:
            return False
        msg_w = self._msg_w
        cursor = table.cursor_row
        cursor_key = old[cursor] if table.row_count and 0 <= cursor < len(old) else None
        # on the newest row the operator watches the stream (as `journalctl -f`): the cursor follows the newest
        follow = cursor == 0 and table.scroll_y == 0
        for k in old:
            if k not in new_keys:
                table.remove_row(k)
                del cells[k]
        for k, row in built.items():
            table.add_row(*row, height=self._height(row, msg_w), key=k)
            cells[k] = row
        kept = [k for k in old if k in new_keys]
        if built or kept != keys:
            # add_row appends: put the rows in the order of `shown` (newest first). DataTable sorts by cell values
            # only; each row's message cell is its own Text object, so its id names the row.
            position = {id(cells[k][-1]): i for i, k in enumerate(keys)}
            table.sort("msg", key=lambda cell: position[id(cell)])
        self.shown, self._row_keys = shown, keys
        if follow and keys:
            table.move_cursor(row=0, animate=False)
        elif cursor_key in new_keys:
            table.move_cursor(row=table.get_row_index(cursor_key), animate=False)
        return True

    def _height(self, row: list[Text], msg_w: int | None) -> int:
        """A row's height: a message longer than its column wraps onto more lines of its row instead of being
        cut."""
        return max(1, len(row[-1].wrap(self.app.console, msg_w))) if msg_w else 1

    def _draw_filters(self) -> None:
        shown = len(self._visible_events())
        t = self._keys_mark("events")
        t.append(f"events {shown}/{len(self.events)}  ", style="bold")
        filtered = bool(self.kind or self.min_severity != "info" or self.text_filter)
        if self._searching and not shown:
            t.append("searching the history…   ", style="bold")
        elif not shown and (self.events or filtered):
            # first, where even 80 columns show it: a list of headers alone reads as "no events at all"
            t.append(f"no events match {_filter_text(self.kind, self.min_severity, self.text_filter)!r}; "
                     "Esc clears   ", style="bold yellow")
        if self._cut:  # as `lynxtop events` notes it: older events exist that this list does not hold
            t.append(f"newest {EVENTS_READ} shown   " if self._in_sql else
                     f"only the newest {EVENTS_READ} searched   ", style="yellow")
        held = sum(e.pending for e in self.events)
        if held:  # before the filters: at 80 columns the end of this line is cut
            t.append(PENDING_TAG.strip(), style=PENDING_STYLE)
            t.append(f" {held}: held by the agent, not in the history yet (writes failing)   ", style="bold")
        t.append(f"kind (K): {_kind_label(self.kind)}   severity (v): ≥{self.min_severity}   ")
        if self.text_filter:
            t.append(f"text: {self.text_filter!r}   ")
        t.append(f"from {self.source}", style="dim")
        # `>=info`, `...`: the table's words (the line filter could only put `>` for `≥`)
        self.query_one("#events-filters", Static).update(ascii_text(t, self.lynx.ascii_only))

    def _fill_log(self) -> None:
        log = self.query_one("#log", Log)
        log.clear()
        needle = self.log_search.lower()
        lines = [ln for ln in self.log_lines if needle in ln.lower()] if needle else self.log_lines
        log.write_lines(lines)
        # At the newest line, also when written before the pane had its size (the first open): then the Log's
        # own scroll to the end ran against no height, and the newest lines showed only after Tab and End.
        self.call_after_refresh(log.scroll_end, animate=False)
        self._draw_log_title(len(lines))

    def _draw_log_title(self, matched: int | None = None) -> None:
        """The log's header, its search and how many lines match it (`matched`: as last counted)."""
        if matched is not None:
            self._log_matched = matched
        title = self.query_one("#log-title", Static)
        header = self._keys_mark("log")
        header.append(getattr(self, "_log_header", "vLLM log"), style="bold")
        if self.log_search:
            header.append(f"   search {self.log_search!r}: {self._log_matched} of "
                          f"{len(self.log_lines)} lines", style="yellow")
        header.append("   ([ ] other runs, / search when the log has focus)", style="dim")
        title.update(header)

    def _keys_pane(self) -> str | None:
        """"events" or "log": the pane the keys act on (the focused one, or the one the open box filters)."""
        focused = self.focused
        if focused is not None and focused.id == "filter":
            return getattr(self, "_filter_target", "events")
        return focused.id if focused is not None and focused.id in ("events", "log") else None

    def _keys_mark(self, pane: str) -> Text:
        """The start of a pane's title: the mark where the keys act on the pane, nothing elsewhere (the other
        title keeps its room: at 80 columns the log's title is cut at its end)."""
        mark = KEYS_MARK_ASCII if self.lynx.ascii_only else KEYS_MARK
        return Text(mark if self._keys_pane() == pane else "", style="bold")

    def _show_keys_pane(self) -> None:
        """Mark the title of the pane the keys act on (and only it), after any change of focus."""
        pane = self._keys_pane()
        for title_id, name in (("#events-filters", "events"), ("#log-title", "log")):
            self.query_one(title_id, Static).set_class(pane == name, "-focused")
        self._draw_filters()
        self._draw_log_title()

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        self._show_keys_pane()

    def on_descendant_blur(self, event: events.DescendantBlur) -> None:
        self._show_keys_pane()

    # ------------------------------------------------------------------ actions
    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        self._filter_target = "log" if self.query_one("#log", Log).has_focus else "events"
        box.placeholder = ("search the log (Enter applies, Esc clears)" if self._filter_target == "log"
                           else "filter events: text, kind:serving. sev:warning (Enter applies, Esc clears)")
        box.value = self.log_search if self._filter_target == "log" else self.text_filter
        box.add_class("-open")
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if getattr(self, "_filter_target", "events") == "log":
            self.log_search = event.value
            self._fill_log()
        else:
            try:
                self.kind, self.min_severity, self.text_filter = parse_filter(event.value, self.kind,
                                                                              self.min_severity)
            except ValueError as exc:  # the box stays open with what was typed; the filter is unchanged
                self.notify(str(exc), title="Filter not applied", severity="warning")
                return
            self._refilter()
        event.input.remove_class("-open")
        self._draw_filters()
        self.query_one("#log" if self._filter_target == "log" else "#events").focus()

    def action_clear_filter(self) -> None:
        self.text_filter = ""
        self.kind, self.min_severity = None, "info"
        self.log_search = ""
        self.query_one("#filter", Input).remove_class("-open")
        self._refilter()
        self._fill_log()
        self._draw_filters()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "events":
            self._open(event.data_table.get_row_index(event.row_key))

    def action_open_event(self) -> None:
        self._open(self.query_one("#events", DataTable).cursor_row)

    def _open(self, row: int) -> None:
        if not 0 <= row < len(self.shown):
            return
        from lynxtop.tui.screens.event_detail import EventDetailScreen, field

        event = self.shown[row]
        run_id = field(event, "run_id")
        run = next((r for r in self.runs if field(r, "id") == run_id), None) if run_id is not None else None
        self.app.push_screen(EventDetailScreen(event, run))

    def action_cycle_kind(self) -> None:
        # families (serving., gpu., ...) to cycle; one exact kind is `/kind:serving.ready`
        kinds = sorted(self._families | {str(_kind(e)).split(".")[0] + "." for e in self.events if _kind(e)})
        options: list[str | None] = [None, *kinds]
        self.kind = options[(options.index(self.kind) + 1) % len(options)] if self.kind in options else None
        self._refilter()
        self._draw_filters()

    def action_cycle_severity(self) -> None:
        self.min_severity = SEVERITIES[(SEVERITIES.index(self.min_severity) + 1) % len(SEVERITIES)]
        self._refilter()
        self._draw_filters()

    def _refilter(self) -> None:
        """A filter changed: the rows held now, filtered at once, then the history asked for every match (the
        rows held are the newest of the old filter's: a narrower filter's older matches are not among them)."""
        self._searching = True
        self._fill_events()
        self.fetch_events()

    def action_log_run(self, step: int) -> None:
        ids = sorted({r.id for r in self.runs})
        if not ids:
            self.notify("no recorded runs to choose from", severity="warning")
            return
        cur = self.log_run if self.log_run in ids else ids[-1]
        pos = max(0, min(len(ids) - 1, ids.index(cur) + step))
        self.log_run = ids[pos]
        self.fetch_log()


def _row(e: Event, utc: bool, now: int, narrow: bool, ascii_only: bool = False) -> list[Text]:
    """The cells of an event's row: time, severity (a mark and a word, not colour alone), kind, run, message.
    In ASCII mode the marks and the message's `→`/`≥` are the glyph table's words, measured as drawn (the
    message column's width and each row's height come from these cells)."""
    sev = str(e.severity)
    mark, style = SEVERITY_MARK.get(sev, ("?", ""))
    return [
        Text(_when(e.ts_ms, utc, now)),
        Text(f"{glyph(mark, ascii_only)} {SHORT_SEVERITY.get(sev, sev) if narrow else sev}", style=style),
        Text(str(e.kind)),
        Text(str(e.run_id or "")),
        ascii_text(_message(e), ascii_only),
    ]


def _row_keys(shown: list[Event]) -> list[str]:
    """Each row's key: a stored event's id; a held one's identity (no id yet; its stored row, once written, has
    another key and replaces it). Two rows alike (the same held event twice) get a count after the second."""
    keys: list[str] = []
    seen: dict[str, int] = {}
    for e in shown:
        k = f"id {e.id}" if e.id is not None and not e.pending else f"held {identity(e)!r}"
        n = seen.get(k, 0)
        seen[k] = n + 1
        keys.append(f"{k} ~{n}" if n else k)
    return keys


def _message(e: Event) -> Text:
    """The message cell; an event the agent holds in memory (not in the history yet) tagged first. The message is
    foreign text (escaped at the door, tui/foreign.py) and goes in as Text, never as markup."""
    t = Text()
    if e.pending:
        t.append(PENDING_TAG, style=PENDING_STYLE)
        t.append(" ")
    t.append(e.message)
    return t


def _message_width(table: DataTable, rows: list[list[Text]]) -> int | None:
    """The message column's width: what the table's width leaves after the other columns (as wide as their
    widest cell), at least 24; None (as wide as the longest message) before the table has a width."""
    width = table.scrollable_content_region.width
    if width <= 0:
        return None
    pad = 2 * table.cell_padding
    columns = list(table.columns.values())
    used = 0
    for column, column_w in zip(columns[:-1], _other_widths(table, rows), strict=True):
        # Set, not measured by the table later: its lazy measure missed rows added right after a clear()
        # (an events refresh), and the time column showed "13:5".
        column.auto_width, column.width = False, column_w
        used += column.width + pad
    msg_w = max(24, width - used - pad - 2)  # 2: the vertical scrollbar when rows outgrow the table
    columns[-1].auto_width, columns[-1].width = False, msg_w
    return msg_w


def _other_widths(table: DataTable, rows: list[list[Text]]) -> list[int]:
    """The widths of the columns before the message: each as wide as its label or its widest cell."""
    labels = [column.label.cell_len for column in list(table.columns.values())[:-1]]
    return [max([label_w, *(row[i].cell_len for row in rows)]) for i, label_w in enumerate(labels)]


def _filter_text(kind: str | None, min_severity: str, text: str) -> str:
    """The filter as it is typed in the box: `kind:gpu. sev:error xid`."""
    words = ([f"kind:{kind}"] if kind else []) + ([f"sev:{min_severity}"] if min_severity != "info" else [])
    return " ".join([*words, *([text] if text else [])])


def _kind(event: object) -> object:
    """An event's kind, from an Event (contract/events.py) or the dict an older reader gave."""
    return event.get("kind") if isinstance(event, dict) else getattr(event, "kind", None)


def kind_matches(kind: str, wanted: str) -> bool:
    """`serving.` (ending in a dot) is a family: every kind under it; anything else is one kind."""
    return kind.startswith(wanted) if wanted.endswith(".") else kind == wanted


def _kind_label(kind: str | None) -> str:
    return "all" if kind is None else f"{kind}*" if kind.endswith(".") else kind


def parse_filter(value: str, kind: str | None, min_severity: str) -> tuple[str | None, str, str]:
    """(kind, severity floor, text) from the filter box: `kind:serving.` (a family) or `kind:gpu.xid`, `sev:error`
    (or severity:), and the rest searched in kind and message. A severity that is none of SEVERITIES is a
    ValueError naming it and the choices."""
    words = []
    for word in value.split():
        key, sep, arg = word.partition(":")
        if sep and key.lower() == "kind":
            kind = None if arg in ("", "all", "*") else arg.rstrip("*")
        elif sep and key.lower() in ("sev", "severity"):
            if arg.lower() not in SEVERITIES:
                raise ValueError(f"{word!r}: severity must be one of {', '.join(SEVERITIES)}")
            min_severity = arg.lower()
        else:
            words.append(word)
    return kind, min_severity, " ".join(words)


def _when(ts: int | None, utc: bool, now_ms: int) -> str:
    """The clock for today's events, `12-03 10:00` for another day's: by the date in the displayed zone
    (fmt_when), so yesterday's 10:00 seen at 09:00 does not read as an hour ahead."""
    return fmt_when(ts, now_ms, utc, short=True)
