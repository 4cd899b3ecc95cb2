"""The Serving panel per data-parallel engine: the totals line, then each engine's running, waiting and KV cache,
with the engines that fall behind the others marked (tui/engine_lag.py says when)."""

from __future__ import annotations

from rich.text import Text
from textual.content import Content

from lynxtop.contract.format import NA, fmt_int, fmt_pct
from lynxtop.contract.status import EngineLoad
from lynxtop.tui.engine_lag import lagging, sorted_engines, summary
from lynxtop.tui.glyphs import glyph
from lynxtop.tui.live_state import LiveState
from lynxtop.tui.plot import bar
from lynxtop.tui.widgets.serving_panel import stats_line
from lynxtop.tui.widgets.text_panel import TextPanel, set_border

MAX_ROWS = 8  # more engines than this go into columns side by side
KV_RED_PCT = 95.0  # as the totals line
NO_ENGINES = "no per-engine figures: not serving, no /metrics page read yet, or an agent too old to give them"
ONE_ENGINE = "one engine (no data parallelism): the totals above are its figures"


class EngineTable(TextPanel):
    """Drawn as one block of text per frame, like the GPU table; `rows` keeps each engine's cells by label."""

    DEFAULT_CSS = "EngineTable { height: 7; border: round $primary-darken-2; padding: 0 1; }"

    def __init__(self, ascii_only: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.ascii_only = ascii_only
        self.border_title = "Serving · per engine"
        self.rows: dict[str, dict[str, Text]] = {}  # engine label -> column -> cell, in display order
        self.lags: dict[str, str] = {}  # engine label -> why it lags
        self._height = 7
        self._state: LiveState | None = None
        self._now_ms: int | None = None

    def on_resize(self) -> None:
        # The layout depends on the width: shown for the first time (size 0 before) or on a resized terminal.
        if self._state is not None:
            self.show(self._state, self._now_ms)

    @property
    def row_count(self) -> int:
        return len(self.rows)

    def get_row(self, key: str) -> list[Text]:
        return list(self.rows[key].values())

    def show(self, state: LiveState, now_ms: int | None = None) -> None:
        """`now_ms`: now on the node's clock (ServingPanel.show's)."""
        self._state, self._now_ms = state, now_ms
        width = max(8, self.size.width)
        engines = sorted_engines(state.engines)
        self.lags = lagging(engines)
        bar_w = 10 if width >= 100 else 6
        self.rows = {e.engine: self._cells(e, bar_w) for e in engines}
        lines = [stats_line(state, width < 100, self.ascii_only, now_ms)]
        notes = False
        if len(engines) < 2:
            lines.append(Text(ONE_ENGINE if engines else NO_ENGINES, style="dim"))
        else:
            table, notes = self._table(width, bar_w)
            lines.extend(table)
        # Content, not a str: a str is parsed as markup, and the engine labels in it are vLLM's ('[/]' would raise)
        hint = summary(engines, self.lags, detail=not notes) if len(engines) >= 2 else ""
        set_border(self, subtitle=Content(glyph(hint, self.ascii_only)))  # set only when changed: it repaints
        out = Text("\n", no_wrap=True, overflow="crop").join(lines)
        out.no_wrap, out.overflow = True, "crop"
        height = len(lines) + 2
        if height != self._height:  # a layout pass only when the number of engines changes
            self._height = height
            self.styles.height = height
        self.update(out)

    def _cells(self, e: EngineLoad, bar_w: int) -> dict[str, Text]:
        lag = self.lags.get(e.engine, "")
        kv = e.kv_cache_usage_pct
        red = kv is not None and kv >= KV_RED_PCT
        if kv is None:
            kv_cell = Text(NA.rjust(bar_w + 7), style="dim")
        else:
            kv_cell = Text()
            kv_cell.append(bar(kv, bar_w, self.ascii_only), style="cyan")
            kv_cell.append(f" {fmt_pct(kv, 1):>6}", style="bold red" if red else "")
        mark = ("!" if self.ascii_only else "⚠") if lag else " "
        return {
            "mark": Text(mark, style="bold yellow"),
            "engine": Text(e.engine, style="bold yellow" if lag else "bold"),
            "running": _num(e.running),
            "waiting": _num(e.waiting, "yellow" if e.waiting else ""),
            "kv": kv_cell,
            "note": Text(f"{glyph('◀', self.ascii_only)} {lag}" if lag else "", style="yellow"),
        }

    def _table(self, width: int, bar_w: int) -> tuple[list[Text], bool]:
        """The header and the rows, and whether the rows say why an engine lags (one column of engines only);
        past MAX_ROWS engines, columns side by side (filled top to bottom)."""
        n = len(self.rows)
        labels = _SHORT if width < 100 else _LONG
        widths = {"mark": 1, **{k: max([len(labels[k])] + [len(r[k]) for r in self.rows.values()])
                                for k in ("engine", "running", "waiting")}, "kv": bar_w + 7}
        group_w = sum(widths.values()) + 2 * len(widths)
        groups = min(-(-n // MAX_ROWS), max(1, (width + 3) // (group_w + 3)))
        per = -(-n // groups)
        cells = list(self.rows.values())
        header = Text(no_wrap=True, style="bold")
        for g in range(groups):
            header.append(" │ " if g else "", style="dim")
            for key, w in widths.items():
                header.append_text(_fit(Text(labels.get(key, "")), w, right=key in _RIGHT))
                header.append("  ")
        out = [header]
        for r in range(per):
            line = Text(no_wrap=True)
            for g in range(groups):
                if g * per + r >= n:
                    break
                row = cells[g * per + r]
                line.append(" │ " if g else "", style="dim")
                for key, w in widths.items():
                    line.append_text(_fit(row[key], w, right=key in _RIGHT))
                    line.append("  ")
            if groups == 1:
                line.append_text(row["note"])
            out.append(line)
        return out, groups == 1


_LONG = {"engine": "engine", "running": "running", "waiting": "waiting", "kv": "KV cache"}
_SHORT = {"engine": "eng", "running": "run", "waiting": "wait", "kv": "KV cache"}
_RIGHT = frozenset({"running", "waiting"})


def _fit(cell: Text, width: int, right: bool) -> Text:
    cell = cell.copy()
    if right:
        cell.pad_left(width - cell.cell_len)
    cell.pad_right(width - cell.cell_len)
    return cell


def _num(v: int | None, style: str = "") -> Text:
    return Text(fmt_int(v), style="dim" if v is None else style)
