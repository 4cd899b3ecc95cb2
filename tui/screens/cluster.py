"""The fleet view (`N` on a Ray head): every node Ray lists, its serving state, GPUs and TTFT p99, read from each
node's own agent (tui/cluster_source.py); Enter opens a node's screens over its read-only endpoint."""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from lynxtop.contract.format import fmt_duration
from lynxtop.contract.quantile import fmt_series
from lynxtop.contract.status import ServingState, taker_text
from lynxtop.tui.cluster_source import ClusterSource, Fleet, NodeRow
from lynxtop.tui.screens import VIEWS_CSS
from lynxtop.tui.screens.base import LiveScreen

REFRESH_S = 2.0
STATE_STYLE = {ServingState.READY: "bold green", ServingState.STOPPED: "dim"}
# (heading, width); the last column takes what is left
COLUMNS = (("NODE", 16), ("RAY", 5), ("GPUS", 4), ("SERVING", 14), ("TTFT p99", 8), ("READ AT", 0))


class ClusterScreen(LiveScreen):
    CSS_PATH = VIEWS_CSS
    VIEW_TITLE = "Cluster"
    BINDINGS = [
        Binding("down,j", "move(1)", "Down", show=False, id="cluster.down"),
        Binding("up,k", "move(-1)", "Up", show=False, id="cluster.up"),
        Binding("enter", "open", "Open node", show=False, id="cluster.open"),  # the title line says it
    ]

    def __init__(self) -> None:
        super().__init__()
        self.fleet: Fleet | None = None
        self.cursor = 0

    def compose_body(self) -> ComposeResult:
        yield Static(id="cluster-title")
        with VerticalScroll(id="cluster-scroll"):
            yield Static(id="cluster-nodes")

    def on_mount(self) -> None:
        self.set_interval(REFRESH_S, self._refresh_if_shown)

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        self.fetch()

    def _refresh_if_shown(self) -> None:
        if self.app.screen is self:
            self.fetch()

    @work(exclusive=True, group="cluster", exit_on_error=False)
    async def fetch(self) -> None:
        source = ClusterSource(self.lynx.home_socket, self.lynx.node_port)
        self.fleet = await source.poll()
        self.cursor = min(self.cursor, max(len(self.fleet.rows) - 1, 0))
        self.redraw()

    # ------------------------------------------------------------------ keys
    def action_move(self, step: int) -> None:
        if self.fleet and self.fleet.rows:
            self.cursor = (self.cursor + step) % len(self.fleet.rows)
            self.redraw()

    def action_open(self) -> None:
        if not (self.fleet and self.fleet.rows):
            return
        row = self.fleet.rows[self.cursor]
        if row.node.head:
            self.lynx.view_node(None, None)
        elif row.endpoint is None or row.status is None:
            self.notify(f"{row.label}: cannot open it: {row.error or 'no answer yet'}", severity="warning")
        else:
            self.lynx.view_node(row.label, row.endpoint)

    # ------------------------------------------------------------------ drawing
    def draw(self, now_ms: int) -> None:
        fleet = self.fleet
        title = Text("Cluster", style="bold")
        viewing = self.lynx.viewing_node
        title.append(f" · viewing {viewing} (read-only)" if viewing else " · viewing this head", style="dim")
        title.append("   ↑↓ Enter: open a node, read-only", style="dim")
        self.query_one("#cluster-title", Static).update(title)
        body = self.query_one("#cluster-nodes", Static)
        if fleet is None:
            body.update(Text("reading the head's view of the cluster…", style="dim"))
            return
        if fleet.problem:
            body.update(Text(fleet.problem, style="yellow"))
            return
        width = max(self.size.width - 2, 40)
        out = Text()
        for name, w in COLUMNS:
            out.append(f"  {name:<{w}}" if w else f"  {name}", style="bold")
        out.append("\n")
        for i, row in enumerate(fleet.rows):
            out.append_text(self._row(row, i == self.cursor, now_ms, width))
            out.append("\n")
        body.update(out)

    def _row(self, row: NodeRow, selected: bool, now_ms: int, width: int) -> Text:
        t = Text(style="reverse" if selected else "")
        viewing = self.lynx.viewing_node
        here = (viewing is None and row.node.head) or viewing == row.label
        t.append("●" if here else " ")
        t.append(" ")
        t.append(_cell(row.label, COLUMNS[0][1]), style="bold" if row.node.head else "")
        t.append("  ")
        ray = "head" if row.node.head else "alive" if row.node.alive else "LOST"
        t.append(_cell(ray, COLUMNS[1][1]), style="green" if row.node.alive else "bold red")
        t.append("  " + _cell(f"{row.node.gpus:g}", COLUMNS[2][1]) + "  ")
        if row.status is None:
            rest = width - len(t.plain)
            t.append(_cell(f"✗ {row.error or 'no answer'}", max(rest, 10)), style="red" if row.node.alive else "dim")
            return t
        srv = row.status.serving
        cluster = row.status.cluster
        if cluster.gpus_taken and srv.state == ServingState.STOPPED and not srv.profile:
            return self._held(t, row, width)
        # a state word this lynxtop does not know is shown as it came (escaped), never as the STOPPED it reads as;
        # `? ` for the header's `UNKNOWN (...)`: the column is narrow
        state = srv.state.value.upper() if srv.unknown_state is None else f"? {srv.unknown_state}"
        if srv.state_since_ms and row.status.ts_ms:  # both on the node's clock: no skew with ours
            state += f" {fmt_duration((row.status.ts_ms - srv.state_since_ms) / 1000)}"
        style = STATE_STYLE.get(srv.state, "yellow") if srv.unknown_state is None else "bold yellow"
        if srv.held is not None:  # STOPPED for the agent while a vLLM the previous agent left serves, unsupervised
            state, style = f"HELD pid {srv.held.pid if srv.held.pid is not None else '?'}", "bold yellow"
        t.append(_cell(state, COLUMNS[3][1]), style=style)
        ttft = fmt_series(row.status.serving_metrics.metric, "ttft", "p99")  # `<1.0 ms` in the lowest bucket
        t.append("  " + _cell(ttft, COLUMNS[4][1]) + "  ")
        where = "this node's socket" if row.node.head else (row.endpoint or "")
        t.append(_cell(where, max(width - len(t.plain), 8)), style="dim")
        return t

    @staticmethod
    def _held(t: Text, row: NodeRow, width: int) -> Text:
        """An idle worker whose GPUs processes not Ray's hold (vLLM's ranks placed there would run out of memory):
        `⚠ GPUs HELD` in the SERVING column (STOPPED says nothing on a worker), the holders where the TTFT and the
        endpoint go, cut to the width. Names are foreign (escaped by the agent): plain text, never markup."""
        assert row.status is not None
        taken = row.status.cluster.gpus_taken
        t.append(_cell("⚠ GPUs HELD", COLUMNS[3][1]), style="bold yellow")
        t.append("  ")
        text = ", ".join(map(taker_text, taken))
        t.append(_cell(text, max(width - len(t.plain), 8)), style="yellow")
        return t


def _cell(text: str, width: int) -> str:
    """`text` in exactly `width` columns, cut with '…' (cells are ASCII or one column wide)."""
    return text.ljust(width) if len(text) <= width else text[:width - 1] + "…"
