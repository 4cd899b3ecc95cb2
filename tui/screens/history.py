"""View 4: recorded runs; a run's charts over a range from the rollups; compare two runs; export."""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import DataTable, Input, Static

from lynxtop.contract.format import fmt_clock, fmt_datetime, fmt_duration, fmt_ms, fmt_pct, fmt_si
from lynxtop.contract.records import RunInfo
from lynxtop.tui.export_csv import ExportError, export_run_gpu
from lynxtop.tui.glyphs import ascii_text, glyph
from lynxtop.tui.history_series import RANGES, pan, points, run_window, span, zoom
from lynxtop.tui.history_source import BoardChange, HistoryUnavailable, board_changes, short_uuid
from lynxtop.tui.screens import VIEWS_CSS
from lynxtop.tui.screens.base import LiveScreen
from lynxtop.tui.screens.compare import CompareScreen
from lynxtop.tui.screens.export_path import ExportPathScreen
from lynxtop.tui.widgets.cursor_table import CursorTable
from lynxtop.tui.widgets.node_header import sla_limit
from lynxtop.tui.widgets.time_chart import TimeChart

GPU_COLS = ("sm_active_pct", "tensor_active_pct", "dram_bw_pct")
SERVING_COLS = ("generation_tokens_per_s", "ttft_p99_ms", "tpot_p99_ms")
# (chart id, title, table, column, aggregate, formatter, vmax, latency series whose SLA limit is drawn)
CHARTS = (
    ("sm", "SM activity (avg of GPUs)", "gpu", "sm_active_pct", "avg", fmt_pct, 100.0, None),
    ("tc", "Tensor activity (avg of GPUs)", "gpu", "tensor_active_pct", "avg", fmt_pct, 100.0, None),
    ("tok", "Generation tokens/s", "serving", "generation_tokens_per_s", "avg", fmt_si, None, None),
    ("ttft", "TTFT p99 (worst)", "serving", "ttft_p99_ms", "max", fmt_ms, None, "ttft"),
    ("tpot", "TPOT p99 (worst)", "serving", "tpot_p99_ms", "max", fmt_ms, None, "tpot"),
)


# The run list's `end` column ("running", "switched to …") keeps this many cells: the profile column gives first.
END_MIN_W = 10
PROFILE_MIN_W = 8
RUNS_READ = 200  # the newest runs listed (the newest matches of a filter); the status says when there are more


class HistoryScreen(LiveScreen):
    CSS_PATH = VIEWS_CSS
    VIEW_TITLE = "History"
    # A gap between the run list and the charts beside it: its last header ran into the first chart's title.
    DEFAULT_CSS = "HistoryScreen #runs { margin-right: 1; }"
    BINDINGS = [
        Binding("t", "cycle_range", "Range", id="history.range"),
        Binding("c", "compare", "Compare", id="history.compare"),
        Binding("e", "export", "Export CSV", id="history.export"),
        Binding("slash", "filter", "Filter runs", key_display="/", id="history.filter"),
        Binding("escape", "clear_filter", "Clear filter", show=False, id="history.clear"),
        Binding("f5", "reload", "Reload runs", show=False, id="history.reload"),
        # Steering the charts' window (Grafana): the status line shows the window and says these keys
        Binding("plus,equals_sign", "zoom(0.5)", "Zoom in", key_display="+", show=False, id="history.zoom_in"),
        Binding("minus", "zoom(2)", "Zoom out", key_display="-", show=False, id="history.zoom_out"),
        Binding("left_square_bracket", "pan(-0.5)", "Earlier", key_display="[", show=False, id="history.earlier"),
        Binding("right_square_bracket", "pan(0.5)", "Later", key_display="]", show=False, id="history.later"),
        Binding("g", "jump_run", "Go to run's time", show=False, id="history.jump"),  # Enter on a run too
    ]

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[RunInfo] = []
        self.range_index = 0
        self.selected: RunInfo | None = None
        self.compare_with: dict[str, Any] | None = None
        self.error: str | None = None
        self.run_filter = ""
        self.all_runs: list[RunInfo] = []  # as last read: the newest RUNS_READ runs matching `read_filter`
        self.read_filter = ""  # the filter the last read applied before its limit ("" none; see _runs_of)
        self._searching = False  # the filter changed and its read has not answered yet
        self.total_runs: int | None = None  # every run, from the last unfiltered read; None: more than it read
        self.last_draw_ms: float | None = None  # how long the last chart load took (benchmarks read it)
        self.window: tuple[int, int] | None = None  # zoomed, panned or a run's: replaces the range preset
        self.queried: tuple[int, int] | None = None  # the window the charts were last read for
        # The selection follows the newest run while it is on the newest (by default, or chosen there): after a
        # restart at 3 a.m. the view showed the old run's charts, ending where it ended, as if stale. A run the
        # operator chose below the newest stays chosen.
        self.follow_newest = True
        self._live_run: int | None = None  # the run id the agent's status named when last drawn

    def compose_body(self) -> ComposeResult:
        yield Static(id="history-status")
        with Horizontal(id="history-main"):
            yield CursorTable(id="runs", cursor_type="row")  # j/k move it too
            with VerticalScroll(id="history-charts"):
                yield Static(id="history-boards")  # a GPU index's board changed in the window (hidden: none)
                for cid, title, _, _, _, fmt, vmax, _ in CHARTS:
                    yield TimeChart(title, fmt, vmax=vmax, agg="max", ascii_only=self.lynx.ascii_only,
                                    id=f"hchart-{cid}", classes="history-chart")
        # After the runs table in focus order, so the table (not the hidden box) has the focus on entry.
        yield Input(placeholder="filter runs by profile, id or end reason (Enter applies, Esc clears)",
                    id="runs-filter")

    def on_mount(self) -> None:
        self.query_one("#history-boards", Static).display = False
        table = self.query_one("#runs", DataTable)
        for key, label in (("id", "run"), ("profile", "profile"), ("started", "started"),
                           ("dur", "length"), ("end", "end")):
            table.add_column(label, key=key)

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        self.load_runs()

    def draw(self, now_ms: int) -> None:
        run_id = self.lynx.state.serving.run_id
        if run_id is not None and run_id != self._live_run:
            self._live_run = run_id
            if self.all_runs and all(_field(r, "id") != run_id for r in self.all_runs):
                self.load_runs()  # a new run started while the view is open: list it (and follow it)
        self._draw_status()

    # ------------------------------------------------------------------ data
    @work(thread=True, exclusive=True, group="history-runs", exit_on_error=False)
    def load_runs(self) -> None:
        wanted = self.run_filter
        try:
            with self.lynx.history.reader() as reader:
                runs, applied = _runs_of(reader, wanted)
        except HistoryUnavailable as exc:
            self.app.call_from_thread(self._history_failed, str(exc))
            return
        except Exception as exc:  # a damaged database: say so, keep the rest of the app alive
            self.app.call_from_thread(self._history_failed, f"{self.lynx.history.path}: {exc}")
            return
        self.app.call_from_thread(self._read_runs, runs, wanted, applied)

    def _read_runs(self, runs: list[RunInfo], wanted: str, applied: str) -> None:
        """A read's answer (`wanted`: the filter it was asked for, `applied`: what the database applied)."""
        self.read_filter = applied
        if not applied and not wanted:
            self.total_runs = len(runs) if len(runs) < RUNS_READ else None
        if wanted == self.run_filter:
            self._searching = False  # else the newer filter's read is on its way
        self._show_runs(runs)

    def _history_failed(self, message: str) -> None:
        self.error = message
        self._draw_status()

    def _show_runs(self, runs: list[RunInfo]) -> None:
        self.error = None
        self.all_runs = runs
        if self.run_filter:  # the read's own filter again (a no-op), or the rows held while a new one is read
            runs = [r for r in runs if run_matches(r, self.run_filter)]
        self.runs = runs
        table = self.query_one("#runs", DataTable)
        keep = self.selected.id if self.selected else None
        table.clear()
        now = self.lynx.node_now_ms()  # a running run's length, on its node's clock
        utc = self.lynx.utc
        rows = []
        for run in runs:
            started, ended = run.started_ms, run.ended_ms
            length = fmt_duration(((ended or now) - started) / 1000) if started else "N/A"
            end = run.end_reason or ("running" if not ended else "ended")
            profile = Text(run.profile or "") + (Text(" SIM", style="magenta") if run.simulated else Text(""))
            rows.append([Text(str(run.id), style="bold"), profile, Text(fmt_datetime(started, utc)), Text(length),
                         Text(str(end))])
        _fit_run_columns(table, rows)
        for run, row in zip(runs, rows, strict=True):
            table.add_row(*row, key=str(run.id))
        if runs:
            ids = [str(r.id) for r in runs]
            follow = keep is None or self.follow_newest or str(keep) not in ids
            row = 0 if follow else ids.index(str(keep))  # row 0: the newest run (the list is newest first)
            self.follow_newest = row == 0
            table.move_cursor(row=row)
            self.selected = runs[row]
            self.load_charts()
        else:
            self.selected = None
            self.load_charts()
        self._draw_status()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        run = next((r for r in self.runs if str(r.id) == event.row_key.value), None)
        if run is not None and run is not self.selected:
            self.follow_newest = run is self.runs[0]  # on the newest run: keep on the newest as runs start
            self.selected = run
            self.load_charts()
            self._draw_status()

    @work(thread=True, exclusive=True, group="history-charts", exit_on_error=False)
    def load_charts(self) -> None:
        t0 = time.perf_counter()
        start, end = self.queried = self.current_window()
        width = max(50, self.size.width)
        try:
            with self.lynx.history.reader() as reader:
                res_g, gpu_rows = reader.series("gpu", list(GPU_COLS), start, end, max_points=width * 4)
                res_s, srv_rows = reader.series("serving", list(SERVING_COLS), start, end, max_points=width * 4)
                changes = _board_changes(reader, start, end)
        except HistoryUnavailable as exc:
            self.app.call_from_thread(self._history_failed, str(exc))
            return
        except Exception as exc:
            self.app.call_from_thread(self._history_failed, f"{self.lynx.history.path}: {exc}")
            return
        series = {}
        for cid, _, table, col, agg, *_ in CHARTS:
            series[cid] = points(gpu_rows if table == "gpu" else srv_rows, col, agg)
        self.app.call_from_thread(self._show_charts, series, start, end, f"{res_g}/{res_s}", t0, changes)

    def _show_charts(self, series: dict[str, list], start: int, end: int, resolution: str, t0: float,
                     changes: list[BoardChange] | None = None) -> None:
        sla = self.lynx.state.sla
        marks = [c.at_ms for c in changes or ()]  # and a gap's start within the window: both its ends marked
        marks += [c.absent_since_ms for c in changes or () if c.absent_since_ms is not None
                  and start < c.absent_since_ms <= end]
        for cid, _, table, _, _, _, _, sla_series in CHARTS:
            self.query_one(f"#hchart-{cid}", TimeChart).set_data(
                series[cid], start, end, threshold=sla_limit(sla, sla_series) if sla_series else None,
                utc=self.lynx.utc, note=f"resolution {resolution}", marks_ms=marks if table == "gpu" else ())
        self._show_boards(changes or [])
        self.last_draw_ms = (time.perf_counter() - t0) * 1000
        self._draw_status()

    # ------------------------------------------------------------------ drawing
    def _draw_status(self) -> None:
        t = Text(no_wrap=True, overflow="ellipsis")
        if self.error:
            t.append(f"✗ history unavailable: {self.error}", style="bold red")
            self._show_status(t)
            return
        t.append("range (t): ")
        current = -1 if self.window else self.range_index  # steered: no preset is the window
        for i, (name, _) in enumerate(RANGES):
            if self.size.width >= 120 or i == current:  # narrower: the current preset alone
                t.append(f"[{name}]" if i == current else f" {name} ", style="bold reverse" if i == current else "dim")
        t.append(" " + window_label(*self.current_window(), self.lynx.utc), style="bold cyan")
        if self.size.width >= 120:
            t.append("  +/- zoom  [ ] pan  g run", style="dim")
        if self.selected:
            t.append(f"   run {self.selected.id} {self.selected.profile or ''}", style="bold")
        cut = len(self.all_runs) >= RUNS_READ  # older runs (or matches) exist that the list does not hold
        if self.run_filter and self._searching:
            t.append(f"   filter {self.run_filter!r}: searching the history…", style="yellow")
        elif self.run_filter and self.read_filter == self.run_filter:  # every run searched, in the database
            found = len(self.runs)
            of = f" of {self.total_runs}" if self.total_runs is not None and found <= self.total_runs else ""
            t.append(f"   filter {self.run_filter!r}: " + (f"newest {RUNS_READ} matches listed" if cut else
                     f"{found}{of} run{'s' if found != 1 or of else ''}"), style="yellow")
        elif self.run_filter:  # a reader that cannot filter, or a non-ASCII text: the rows read were searched
            t.append(f"   filter {self.run_filter!r}: {len(self.runs)} of "
                     f"{f'the newest {RUNS_READ}' if cut else len(self.all_runs)} runs", style="yellow")
        elif cut:
            t.append(f"   newest {RUNS_READ} runs listed", style="yellow")
        if self.compare_with:
            t.append(f"   compare: run {self.compare_with.id} marked; c on another run",
                     style="yellow")
        if self.size.width >= 120:  # the key bar says it too; at 80 columns this hint cut the run's name
            t.append("   c compare · e export", style="dim")
        self._show_status(t)

    def _show_boards(self, changes: list[BoardChange]) -> None:
        """Each GPU index whose board changed within the window, both boards named and when: the GPU charts
        average each index's line, and from that time it is another board's readings (marked `┊` on them). A gap
        (the board gone, then back or another one there) is said with its start, both ends marked: the index has
        no readings between, and a line that stops and goes on is the same board's only when it says "back"."""
        boards = self.query_one("#history-boards", Static)
        boards.display = bool(changes)
        if not changes:
            return
        utc = self.lynx.utc
        only_back = all(c.back for c in changes)
        t = Text(f"⚠ board {'absent' if only_back else 'changed'}: ", style="bold yellow")
        for i, c in enumerate(changes):
            if c.back:
                said = (f"{short_uuid(c.old)} absent from {fmt_clock(c.absent_since_ms, utc)}, back at "
                        f"{fmt_clock(c.at_ms, utc)}")
            else:
                new = short_uuid(c.new) if c.new is not None else "none"
                said = f"{short_uuid(c.old)} → {new} at {fmt_clock(c.at_ms, utc)}" + (
                    f", none there from {fmt_clock(c.absent_since_ms, utc)}" if c.absent_since_ms is not None else "")
            t.append(("; " if i else "") + f"GPU {c.gpu} ({said})", style="yellow")
        t.append("  no readings at the index between a gap's ┊ marks; the same board after it" if only_back else
                 "  the GPU charts go on with the new board's readings from the ┊ mark", style="dim")
        boards.update(ascii_text(t, self.lynx.ascii_only))

    def _show_status(self, t: Text) -> None:
        """The status line, its marks in the glyph table's words in ASCII mode (`13:00->14:00`, `X`): the last
        line filter keeps each cell's width, so it could only draw `→` as `>`."""
        self.query_one("#history-status", Static).update(ascii_text(t, self.lynx.ascii_only))

    # ------------------------------------------------------------------ actions
    def current_window(self) -> tuple[int, int]:
        """The charts' window: the steered one, else the range preset ending where the selected run ended."""
        if self.window:
            return self.window
        return span(self.selected, RANGES[self.range_index][1], self.lynx.now_ms())

    def _steer(self, window: tuple[int, int]) -> None:
        self.window = window
        self._draw_status()
        self.load_charts()

    def action_zoom(self, factor: float) -> None:
        self._steer(zoom(*self.current_window(), factor, self.lynx.now_ms()))

    def action_pan(self, fraction: float) -> None:
        self._steer(pan(*self.current_window(), fraction, self.lynx.now_ms()))

    def action_jump_run(self) -> None:
        run = self.selected
        window = run_window(_field(run, "started_ms"), _field(run, "ended_ms"), self.lynx.now_ms()) if run else None
        if window is None:
            self.notify(f"run {_field(run, 'id')} has no start time" if run else "no run selected", severity="warning")
            return
        self._steer(window)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "runs":  # Enter on a run: its own time range
            self.action_jump_run()

    def action_cycle_range(self) -> None:
        self.window = None  # back to the presets
        self.range_index = (self.range_index + 1) % len(RANGES)
        self._draw_status()
        self.load_charts()

    def action_filter(self) -> None:
        box = self.query_one("#runs-filter", Input)
        box.value = self.run_filter
        box.add_class("-open")
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "runs-filter":
            return
        event.input.remove_class("-open")
        self._refilter(event.value.strip())
        self.query_one("#runs", DataTable).focus()

    def action_clear_filter(self) -> None:
        self.query_one("#runs-filter", Input).remove_class("-open")
        self._refilter("")

    def _refilter(self, wanted: str) -> None:
        """The rows held, filtered at once, then the history asked for the newest RUNS_READ matches: the rows
        held are the newest of the old filter's, and a run older than them matches too (s21)."""
        if wanted == self.run_filter and not self._searching:
            return
        self.run_filter = wanted
        self._searching = True
        self._show_runs(self.all_runs)
        self.load_runs()

    def action_reload(self) -> None:
        self.load_runs()

    def action_compare(self) -> None:
        if not self.selected:
            self.notify("no run selected", severity="warning")
            return
        if self.compare_with is None or self.compare_with.id == self.selected.id:
            self.compare_with = self.selected
            self.notify(f"run {self.selected.id} marked; select another run and press c")
            self._draw_status()
            return
        a, b = self.compare_with, self.selected
        self.compare_with = None
        self._draw_status()
        self.app.push_screen(CompareScreen(a.id, b.id))

    def action_export(self) -> None:
        if (why := export_refusal(self.lynx)) is not None:
            self.notify(why, severity="warning", timeout=10)
            return
        if not self.selected:
            self.notify("no run selected", severity="warning")
            return
        self.ask_export(self.selected)

    @work(exclusive=True, group="history-export-ask", exit_on_error=False)
    async def ask_export(self, run: RunInfo) -> None:
        default = f"~/lynxtop-run-{run.id}-gpu.csv"
        path = await self.app.push_screen_wait(ExportPathScreen(f"Export run {run.id} (GPU samples) to",
                                                                default))
        if path:
            self.notify(glyph(f"exporting run {run.id} to {path}…", self.lynx.ascii_only))
            self.write_export(run, path)

    @work(thread=True, group="history-export", exit_on_error=False)
    def write_export(self, run: RunInfo, path: str) -> None:
        from pathlib import Path

        try:
            with self.lynx.history.reader() as reader:
                n = export_run_gpu(reader, run, Path(path), self.lynx.now_ms())
        except (ExportError, HistoryUnavailable) as exc:
            self.app.call_from_thread(self.notify, str(exc), title="Export failed", severity="error", timeout=10)
            return
        self.app.call_from_thread(self.notify, f"{n} rows written to {path}", title="Export done", timeout=10)


def run_matches(run: Any, text: str) -> bool:
    """The filter's match, as StoreReader.runs(text=) makes it in SQL: `text` in "id profile end" (end: the end
    column's words), in any case."""
    ended = _field(run, "ended_ms")
    end = _field(run, "end_reason") or ("running" if not ended else "ended")
    return text.lower() in f"{_field(run, 'id')} {_field(run, 'profile') or ''} {end}".lower()


def _runs_of(reader: Any, text: str) -> tuple[list[Any], str]:
    """(The newest RUNS_READ runs matching `text`, the filter the reader applied: `text`, or "" when it did
    not). In the database, before the limit, when `text` is ASCII (SQLite's LIKE folds ASCII letters alone, the
    view matches in any case) and the reader takes it (a node whose agent is older than s21 does not:
    FiltersUnsupported, a TypeError): then the newest runs, filtered by the caller."""
    if text and text.isascii():
        try:
            return reader.runs(limit=RUNS_READ, text=text), text
        except TypeError as exc:
            if "unexpected keyword" not in str(exc):
                raise
    return reader.runs(limit=RUNS_READ), ""


def export_refusal(app: Any) -> str | None:
    """Why export is off, or None. The read-only web dashboard (no --web-control) runs as the user who started
    --web, and whoever reaches its port would pick the path it writes; a local --readonly terminal is that
    user's own, and a --web-control tab needed their token: both keep it."""
    if not getattr(app, "readonly", False):
        return None
    from lynxtop.tui.served import served_by_web  # stdlib only at import: the key press pays nothing else

    if not served_by_web():
        return None
    return ("export is off in the read-only web dashboard: it would write a file as the user who started --web; "
            "export from `lynxtop` in a terminal, or serve with --web-control")


def window_label(start: int, end: int, utc: bool) -> str:
    """`12-02 11:00→14:00 (3h00m)`: the window charted, the end's date only when it differs."""
    a, b = fmt_datetime(start, utc), fmt_datetime(end, utc)
    tail = b[11:16] if a[:10] == b[:10] else b[5:16]
    return f"{a[5:16]}→{tail} ({fmt_duration((end - start) / 1000)})"


def _board_changes(reader: Any, start: int, end: int) -> list[BoardChange]:
    """The boards changed at any GPU index within the window, read once per chart load (another node's too, over
    its agent's TCP reads). A reader without `gpu_identities`, an older agent without the read (none then) or a
    file it cannot read them from tells none: the charts still draw."""
    read = getattr(reader, "gpu_identities", None)
    if read is None:
        return []
    try:
        return board_changes(read(), start, end)
    except Exception:  # an older file's damaged gpus rows: the charts matter more than this line
        return []


def _field(run: Any, name: str) -> Any:
    """A field of a RunInfo (contract/records.py) or of the dict an older reader gave."""
    return run.get(name) if isinstance(run, dict) else getattr(run, name, None)


def _fit_run_columns(table: DataTable, rows: list[list[Text]]) -> None:
    """Column widths of the run list: run, started and length as wide as their cells; `end` at least END_MIN_W
    (it says whether a run runs, or why it ended), the profile column shrinking first (to PROFILE_MIN_W), then
    `end` getting what is left up to its widest cell. Left to the table before it has a width."""
    width = table.scrollable_content_region.width
    if width <= 0:
        return
    columns = list(table.columns.values())
    natural = [max([c.label.cell_len, *(row[i].cell_len for row in rows)]) for i, c in enumerate(columns)]
    for row in rows:
        for cell in row:
            cell.no_wrap, cell.overflow = True, "ellipsis"
    pad = 2 * table.cell_padding
    room = width - pad * len(columns) - 2  # 2: the vertical scrollbar when rows outgrow the table
    rest = room - natural[0] - natural[2] - natural[3]
    end_w = min(natural[4], END_MIN_W)
    profile_w = min(natural[1], max(PROFILE_MIN_W, rest - end_w))
    end_w = max(end_w, min(natural[4], rest - profile_w))
    for column, w in zip(columns, (natural[0], profile_w, natural[2], natural[3], end_w), strict=True):
        column.auto_width, column.width = False, w
