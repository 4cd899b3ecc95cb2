"""View 7: the processes on the GPUs (nvitop's main view): pid, user, GPU memory, SM share and command, and
whether each belongs to the supervised vLLM run.

A process that is not the run's is flagged first: a stray job holding GPU memory is the first thing an operator
checks when vLLM fails to start. The rows come from the agent's last tick (`GET /v1/processes`); the SM share is
NVML's per-process utilisation ("–" where NVML had no sample for it, or does not support it on that GPU).
"""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.widgets import DataTable, Static

from lynxtop.contract.client import AgentRefused, AgentUnreachable
from lynxtop.contract.format import fmt_bytes
from lynxtop.contract.processes import GpuProcess, GpuProcesses
from lynxtop.tui.screens import VIEWS_CSS
from lynxtop.tui.screens.base import LiveScreen
from lynxtop.tui.widgets.cursor_table import CursorTable

COLUMNS = (("gpu", "GPU"), ("pid", "PID"), ("user", "user"), ("mem", "GPU mem"), ("sm", "SM"),
           ("who", "belongs to"), ("cmd", "command"))


class ProcessesScreen(LiveScreen):
    CSS_PATH = VIEWS_CSS
    VIEW_TITLE = "Processes"
    DEFAULT_CSS = """
    #procs-title { height: auto; max-height: 2; padding: 0 1; }
    #procs { height: 1fr; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.answer: GpuProcesses | None = None
        self.problem: str | None = None
        self._busy = False

    def compose_body(self) -> ComposeResult:
        yield Static(id="procs-title")
        yield CursorTable(id="procs", cursor_type="row", zebra_stripes=True)  # j/k move it too

    def on_mount(self) -> None:
        table = self.query_one("#procs", DataTable)
        for key, label in COLUMNS:
            table.add_column(label, key=key)

    def draw(self, now_ms: int) -> None:
        self.fetch()

    @work(group="processes", exit_on_error=False)
    async def fetch(self) -> None:
        if self._busy:
            return
        self._busy = True
        try:
            self.answer = await self.lynx.source.processes()
            self.problem = None
        except AgentRefused as exc:
            older = " (an agent older than this dashboard?)" if exc.status == 404 else ""
            self.problem = f"agent answered {exc.status}: {exc.message}{older}"
        except AgentUnreachable as exc:
            self.problem = str(exc)
        finally:
            self._busy = False
        self._fill()

    def _fill(self) -> None:
        table = self.query_one("#procs", DataTable)
        procs = self.answer.processes if self.answer is not None else ()
        strays = [p for p in procs if not p.in_run]
        row = table.cursor_row
        table.clear()
        for p in sorted(procs, key=lambda p: p.in_run):  # strays first: what the operator looks for
            table.add_row(*self._cells(p))
        if procs:
            table.move_cursor(row=min(row, len(procs) - 1))
        self.query_one("#procs-title", Static).update(self._summary(procs, strays))

    def _cells(self, p: GpuProcess) -> list[Text]:
        stray = not p.in_run
        mark = "!" if self.lynx.ascii_only else "⚠"
        who = Text(f"{mark} not the vLLM run", style="bold red") if stray else Text("vLLM run", style="green")
        if p.stale:  # its GPU is lost: the row is the last NVML gave, whether it still holds the GPU is unknown
            who.append(" (last seen: GPU lost)", style="bold yellow")
        sm = "–" if p.sm_util_pct is None else f"{p.sm_util_pct:.0f}%"
        return [Text("–" if p.gpu is None else str(p.gpu)), Text(str(p.pid)),
                Text(p.user if p.user is not None else "?"), Text(fmt_bytes(p.used_mem_bytes), justify="right"),
                Text(sm, justify="right"), who,
                Text(p.command if p.command is not None else "(not visible from the agent)",
                     style="" if p.command is not None else "dim", no_wrap=True, overflow="ellipsis")]

    def _summary(self, procs: tuple[GpuProcess, ...], strays: list[GpuProcess]) -> Text:
        gpus = len({p.gpu for p in procs})
        t = Text(f"{len(procs)} process{'es' if len(procs) != 1 else ''} on {gpus} GPU{'s' if gpus != 1 else ''}",
                 style="bold")
        if strays:
            held = sum(p.used_mem_bytes or 0 for p in strays)
            mark = "!" if self.lynx.ascii_only else "⚠"
            t.append(f"   {mark} {len(strays)} not the supervised vLLM: {fmt_bytes(held)}", style="bold red")
        elif procs:
            t.append("   all belong to the supervised vLLM run", style="green")
        lost = sorted({p.gpu for p in procs if p.stale and p.gpu is not None})
        if lost:
            t.append(f"   GPU {', '.join(map(str, lost))} lost: its processes as last seen", style="bold yellow")
        if self.answer is not None and self.answer.age_s is not None:
            t.append(f"   {self.answer.age_s:.0f} s old", style="dim")
        if self.problem:
            t.append(f"\n{self.problem}", style="bold red")
        return t
