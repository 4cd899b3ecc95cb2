"""View 6: the vLLM log of the current run, following new lines as `journalctl -f` does.

Each poll asks the agent only for the lines written since the last answer (`GET /v1/logs?after=&inode=`,
agent/api/logtail.py). A rotated or truncated file is read again from its start and a restart's new run from
its log's start, each announced by a marked line, so the view goes on across both. A line still being written
is shown and replaced when it is complete. Scrolling up stops following (new lines wait below, counted in the
title); End or `f` follows again. `/` searches, `n`/`N` go to the next and previous match (while a search is set:
otherwise they are the app's keys).

An agent that does not know `after` (an older one) answers the whole tail each time: the view then shows the
latest tail at every poll instead of following.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Input, Static

from lynxtop.contract.client import AgentRefused, AgentUnreachable
from lynxtop.contract.terminal import terminal_safe
from lynxtop.tui.glyphs import ascii_text
from lynxtop.tui.screens import VIEWS_CSS
from lynxtop.tui.screens.base import LiveScreen
from lynxtop.tui.widgets.follow_log import MARK, MAX_LINES, FollowLog
from lynxtop.tui.widgets.text_panel import update_static

TAIL_LINES = 1000  # the first read
FOLLOW_LINES = 2000  # a later read at most: more new lines than this in one poll are skipped, and said so


class LogsScreen(LiveScreen):
    CSS_PATH = VIEWS_CSS
    VIEW_TITLE = "Logs"
    DEFAULT_CSS = """
    #logs-title { height: 1; padding: 0 1; }
    #follow-log { height: 1fr; border-top: solid $primary-darken-2; }
    #logs-search { display: none; height: 3; }
    #logs-search.-open { display: block; }
    """
    BINDINGS = [
        Binding("f", "follow", "Follow", id="logs.follow"),
        Binding("slash", "search", "Search", key_display="/", id="logs.search"),
        Binding("n", "match(1)", "Next match", id="logs.next"),
        Binding("N", "match(-1)", "Prev match", key_display="N", id="logs.prev"),
        Binding("escape", "clear_search", "Clear search", show=False, id="logs.clear"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.run_id: int | None = None
        self.path = ""
        self.next: int | None = None  # where the next read starts (None: read the tail)
        self.inode: int | None = None
        self.partial = False  # the view's last line is still being written
        self.problem: str | None = None  # why the last read failed (the lines read before stay)
        self.needle = ""
        self.match_at: int | None = None
        self._busy = False
        self._tail: list[str] | None = None  # an older agent's whole tail, as last shown

    def compose_body(self) -> ComposeResult:
        yield Static(id="logs-title")
        yield FollowLog(MAX_LINES, id="follow-log")
        yield Input(placeholder="search the log (Enter finds, Esc clears)", id="logs-search")

    @property
    def view(self) -> FollowLog:
        return self.query_one(FollowLog)

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        self.view.focus()

    def draw(self, now_ms: int) -> None:
        self.fetch()
        self._title()

    # ------------------------------------------------------------------ data
    @work(group="logs", exit_on_error=False)
    async def fetch(self) -> None:
        """One read (never two at once: a slow answer is waited for, not doubled)."""
        if self._busy:
            return
        self._busy = True
        try:
            client = self.lynx.source
            if self.next is None:
                data = await client.logs(None, TAIL_LINES)
            else:
                data = await client.logs(None, FOLLOW_LINES, after=self.next, inode=self.inode)
        except AgentRefused as exc:
            self.problem = f"agent answered {exc.status}: {exc.message}"
        except AgentUnreachable as exc:
            self.problem = str(exc)
        else:
            # the agent read no lines and says why (the log is a link or no regular file: never read through)
            err = data.get("error") if isinstance(data, dict) else None
            self.problem = terminal_safe(err) if err else None
            self._take(data)
        finally:
            self._busy = False
        self._title()

    def _take(self, data: dict[str, Any]) -> None:
        log = self.view
        lines = [str(x) for x in data.get("lines") or []]
        run, path, reset = data.get("run_id"), str(data.get("path") or ""), data.get("reset")
        new_run = self.run_id is not None and run != self.run_id
        if "next" not in data:  # an agent without `after`: its whole tail each time
            if lines != self._tail:  # the same tail again (an idle server) is not drawn again
                self._tail = lines
                log.clear()
                log.add(lines)
        else:
            marks = []
            if new_run:
                marks.append(f"{MARK}run {run} started: its log {path} follows")
            elif reset == "rotated":
                marks.append(f"{MARK}{path} was rotated: the new file follows from its start")
            elif reset == "truncated":
                marks.append(f"{MARK}{path} was truncated: read again from its start")
            elif self.partial and (lines or data.get("skipped")):
                log.drop_last()  # read again from its start, whole or longer
            if data.get("skipped") and self.next is not None:
                marks.append(f"{MARK}{data['skipped']} bytes written since the last read not shown "
                             f"(more than {FOLLOW_LINES} lines)")
            log.add(marks + lines)
            self.partial = bool(data.get("partial")) and bool(lines)
            self.next, self.inode = data.get("next"), data.get("inode")
        self.run_id, self.path = run, path

    # ------------------------------------------------------------------ drawing
    def _title(self) -> None:
        log = self.view
        t = Text(f"vLLM log of run {self.run_id}" if self.run_id is not None else "vLLM log", style="bold")
        if log.following:
            t.append("   ● following", style="green")
        else:
            t.append(f"   ⏸ not following ({log.unseen} new below; End or f follows)", style="yellow")
        if self.needle:
            found = log.matches()
            where = f"{found.index(self.match_at) + 1}/" if self.match_at in found else ""
            t.append(f"   search {self.needle!r}: {where}{len(found)} lines (n/N)", style="cyan")
        if self.problem:
            t.append(f"   {self.problem}", style="bold red")
        if self.path:  # last: a long path is what an 80-column line cuts, never the follow state
            t.append(f"   {self.path}", style="dim")
        # only when changed: a title drawn again each poll re-sent the line over a slow link
        update_static(self.query_one("#logs-title", Static), ascii_text(t, self.lynx.ascii_only))

    # ------------------------------------------------------------------ actions
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "match":
            return bool(self.needle)  # without a search, n and N are the app's (N: the cluster view on a head)
        return True

    def action_follow(self) -> None:
        self.view.follow(True)
        self._title()

    def action_search(self) -> None:
        box = self.query_one("#logs-search", Input)
        box.value = self.needle
        box.add_class("-open")
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "logs-search":
            return
        event.stop()
        self.needle = event.value
        self.match_at = None
        event.input.remove_class("-open")
        self.view.search(self.needle)
        self.view.focus()
        if self.needle:
            self.action_match(-1)  # the newest match first: the operator is usually after what just happened
        self.refresh_bindings()
        self._title()

    def action_clear_search(self) -> None:
        self.query_one("#logs-search", Input).remove_class("-open")
        self.needle, self.match_at = "", None
        self.refresh_bindings()
        self.view.search("")
        self.view.focus()
        self._title()

    def action_match(self, step: int) -> None:
        found = self.view.matches()
        if not found:
            if self.needle:
                self.notify(f"{self.needle!r} is not in the lines shown", severity="warning")
            return
        if self.match_at is None:
            pick = found[-1] if step < 0 else found[0]
        else:
            later = [y for y in found if (y > self.match_at if step > 0 else y < self.match_at)]
            pick = (later[0] if step > 0 else later[-1]) if later else (found[0] if step > 0 else found[-1])
        self.match_at = pick
        self.view.show_line(pick)
        self._title()
