"""The dashboard application: views as modes, one poller, and the guarded control actions.

Live state comes only from the node source (`source.py`: the agent's socket by default), history only from
the database opened read-only (`history_source.py`); the app owns the poll loop and hands each fresh state to
the visible view.
"""

from __future__ import annotations

import asyncio
import gc
import locale
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import work
from textual.app import App, ScreenStackError
from textual.binding import Binding
from textual.command import SearchIcon
from textual.filter import LineFilter
from textual.notifications import SeverityLevel

from lynxtop.contract.client import ALREADY_DONE, AgentRefused, AgentUnreachable
from lynxtop.contract.format import fmt_clock
from lynxtop.contract.status import ClusterStatus, Role, ServingState, ServingStatus
from lynxtop.contract.terminal import terminal_safe
from lynxtop.tui.backoff import Backoff
from lynxtop.tui.commands import LynxtopCommands
from lynxtop.tui.glyphs import ASCII, AsciiFilter, glyph
from lynxtop.tui.history_source import HistorySource, HistoryUnavailable
from lynxtop.tui.live_state import GPU_KEYS, SERVING_KEYS, LiveState
from lynxtop.tui.messages import AgentLost, LiveRefreshed, StatusArrived
from lynxtop.tui.screens.base import LiveScreen
from lynxtop.tui.screens.node import NodeScreen
from lynxtop.tui.source import LiveSource, NodeSource

if TYPE_CHECKING:
    from rich.console import RenderableType

    from lynxtop.contract.records import ProfileInfo
    from lynxtop.tui.screens.confirm import ConfirmScreen
    from lynxtop.tui.screens.profile_picker import ProfilePickerScreen

# Help, the dialogs and the control texts are imported when first used, as the views other than Node are: the
# first frame needs none of them, and on a loaded machine every module is start-up time (docs/dashboard.md).

VIEWS = ("node", "gpu", "latency", "history", "events", "logs", "processes", "cluster")
CONTROL_ACTIONS = {"restart", "stop", "start", "switch"}
CONTROL_KEYS = {"restart": "R", "stop": "X", "start": "S", "switch": "P"}  # as BINDINGS has them, for notices
# Serving states in which the agent refuses a start ("already starting/ready/degraded"): S is shown greyed
START_REFUSED = frozenset({ServingState.STARTING, ServingState.READY, ServingState.DEGRADED})
USUAL_LOAD_WAIT_S = 5.0  # the most a control dialog waits for the history's load time (a local read takes ms)
BACKFILL_S = 15 * 60


def _ansi_terminal() -> bool:
    """16-colour terminals (Linux console, old tmux/screen set-ups) get the ANSI theme."""
    if os.environ.get("LYNXTOP_THEME", "").lower() == "ansi":
        return True
    term = os.environ.get("TERM", "")
    return term in ("linux", "ansi", "vt100", "vt220") or term.endswith("-16color")


# What Python's C-locale coercion (PEP 538) sets LC_CTYPE to when the locale it starts in is C or POSIX
COERCED_CTYPES = frozenset({"C.UTF-8", "C.utf8", "UTF-8"})


def ascii_default(environ: Mapping[str, str] | None = None, *, codeset: str | None = None,
                  coerced: bool | None = None) -> bool:
    """Whether to draw in ASCII: LYNXTOP_ASCII=1/0 if set; otherwise on unless the locale says UTF-8. A C or
    Latin-1 terminal (LC_ALL=C, a serial console, a rescue shell) shows UTF-8 bars and marks as garbage.

    The locale's name is the first set of LC_ALL, LC_CTYPE and LANG (as libc reads them); it says UTF-8, or the
    codeset the C library gives it does (`nl_langinfo(CODESET)`: a C locale that is UTF-8, as musl's). Python's
    coercion of a C locale to C.UTF-8 says nothing of the terminal: then LC_CTYPE and the codeset are not read,
    the names the operator set are. `codeset`, `coerced`: given by tests; found here otherwise."""
    env = os.environ if environ is None else environ
    flag = env.get("LYNXTOP_ASCII")
    if flag in ("0", "1"):
        return flag == "1"
    if coerced is None:
        coerced = _coerced(env)
    name = next((n for n in (env.get("LC_ALL"), None if coerced else env.get("LC_CTYPE"), env.get("LANG")) if n), "")
    if _says_utf8(name):
        return False
    if coerced:
        return True
    return not _says_utf8(_codeset() if codeset is None else codeset)


def _says_utf8(name: str) -> bool:
    return "utf8" in name.lower().replace("-", "").replace("_", "")


def _coerced(env: Mapping[str, str]) -> bool:
    """Whether LC_CTYPE=C.UTF-8 was set by the interpreter at its start, not by the operator: absent from the
    environment the process was started with (Linux's /proc/self/environ keeps it as it came). Without /proc:
    Python's UTF-8 mode that came by itself with a C locale (no PYTHONUTF8) says so."""
    ctype = env.get("LC_CTYPE")
    if ctype not in COERCED_CTYPES or env.get("LC_ALL"):
        return False
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return bool(sys.flags.utf8_mode) and "PYTHONUTF8" not in env
    started = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return started.get(b"LC_CTYPE") != ctype.encode()


def _codeset() -> str:
    """The codeset of the locale the environment names now (set again from it, the one in force put back);
    "" when the C library cannot say."""
    try:
        old = locale.setlocale(locale.LC_CTYPE)
        try:
            locale.setlocale(locale.LC_CTYPE, "")
            return locale.nl_langinfo(locale.CODESET)
        finally:
            locale.setlocale(locale.LC_CTYPE, old)
    except (locale.Error, AttributeError, ValueError):
        return ""


VIEW_KEYS = Binding.Group("views", compact=True)


class LynxtopApp(App):
    CSS_PATH = "lynxtop.tcss"
    # Every action by name (tui/commands.py): `:` as in k9s, ctrl+p as in Textual; no footer slot (the key bar is ours)
    ENABLE_COMMAND_PALETTE = True
    COMMANDS = {LynxtopCommands}
    TITLE = "lynxtop"
    DEFAULT_MODE = "node"
    MODES = {
        "node": NodeScreen,
        "gpu": lambda: _view("gpu", "GpuScreen"),
        "latency": lambda: _view("latency", "LatencyScreen"),
        "history": lambda: _view("history", "HistoryScreen"),
        "events": lambda: _view("events", "EventsScreen"),
        "logs": lambda: _view("logs", "LogsScreen"),
        "processes": lambda: _view("processes", "ProcessesScreen"),
        "cluster": lambda: _view("cluster", "ClusterScreen"),
    }
    BINDINGS = [
        Binding("q", "quit", "Quit", id="app.quit"),
        # An operator's Ctrl-C means quit (as in htop, k9s), not Textual's "press ctrl+q" hint; a dialog's own
        # ctrl+c binding (cancel) comes first, being nearer the focus.
        Binding("ctrl+c", "quit", "Quit", show=False, id="app.ctrl_c"),
        Binding("question_mark", "help", "Help", key_display="?", id="app.help"),
        Binding("colon", "command_palette", "Commands", key_display=":", show=False, id="app.palette"),
        Binding("ctrl+p", "command_palette", "", show=False, priority=True, id="app.palette_ctrl_p"),
        Binding("1", "view('node')", "Node view", id="view.node", group=VIEW_KEYS),
        Binding("2", "view('gpu')", "GPU view", id="view.gpu", group=VIEW_KEYS),
        Binding("3", "view('latency')", "Latency view", id="view.latency", group=VIEW_KEYS),
        Binding("4", "view('history')", "History view", id="view.history", group=VIEW_KEYS),
        Binding("5", "view('events')", "Events view", id="view.events", group=VIEW_KEYS),
        Binding("6", "view('logs')", "Logs view", id="view.logs", group=VIEW_KEYS),
        Binding("7", "view('processes')", "Processes view", id="view.processes", group=VIEW_KEYS),
        Binding("N", "view('cluster')", "Cluster view", key_display="N", id="view.cluster",
                group=VIEW_KEYS),  # a Ray head's fleet: shown beside 1-5 as "12345N views"
        Binding("R", "control('restart')", "Restart", key_display="R", id="control.restart"),
        Binding("X", "control('stop')", "Stop", key_display="X", id="control.stop"),
        Binding("S", "control('start')", "Start", key_display="S", id="control.start"),
        Binding("P", "control('switch')", "Switch", key_display="P", id="control.switch"),
        Binding("r", "refresh_now", "Refresh", show=False, id="app.refresh"),
        Binding("p", "pause", "Pause", show=False, id="app.pause"),
        Binding("u", "toggle_utc", "UTC/local", show=False, id="app.utc"),
        Binding("L", "demo_load", "Load +/-", key_display="L", id="demo.load"),  # `lynxtop demo` only (ASCII: not ±)
    ]

    def __init__(self, socket_path: str | Path, database_path: str | Path | None, readonly: bool = False,
                 utc: bool = False, *, poll_interval_s: float = 1.0, clock: Callable[[], float] | None = None,
                 backoff: Backoff | None = None, ascii_only: bool | None = None, backfill: bool = True,
                 demo_load: Callable[[], str] | None = None, node_port: int | None = None,
                 source: NodeSource | None = None, node_token_file: str | Path | None = None,
                 gc_paused: bool = False, simulated: bool = False):
        ansi = _ansi_terminal()
        super().__init__(ansi_color=ansi)
        if ansi:
            self.theme = "ansi-dark"
        self.socket_path = Path(socket_path)
        # Every read and action goes through the source (tui/source.py); the socket's by default
        self.source: NodeSource = source if source is not None else LiveSource(socket_path)
        self.history = HistorySource(database_path)
        self.readonly = readonly
        # A read-only source (a replay) says why, as --readonly does
        self.readonly_reason: str | None = "--readonly" if readonly else getattr(self.source, "read_only", None)
        self.utc = utc
        self.poll_interval_s = poll_interval_s
        self._clock = clock or time.time
        self.backoff = backoff or Backoff()
        # ASCII on a terminal whose locale is not UTF-8 (LYNXTOP_ASCII=0/1 decides where set)
        self.ascii_only = ascii_default() if ascii_only is None else ascii_only
        # ASCII mode's .tcss rules (ASCII borders) hang on this class; AsciiFilter (get_line_filters) turns the rest
        self._ascii_filter = AsciiFilter() if self.ascii_only else None
        if self.ascii_only:
            self.add_class("-ascii")
        self.backfill_enabled = backfill
        self._backfill_started = False
        # `lynxtop demo` knows its node is simulated before the agent answers; anywhere else only the status says
        self.simulated = simulated
        self.state = LiveState(known_simulated=simulated)
        self.paused = False
        self._next_poll_at: float | None = None
        self._poll_timer = None
        self.gpu_index = 0
        self.demo_load = demo_load  # `lynxtop demo`'s raise/lower of its simulated load; None elsewhere
        # The cluster view (tui/screens/cluster.py): other nodes' agents are read at http://IP:node_port; while one
        # is open, `viewing_node` names it and the dashboard is read-only. `home_*` is this node's own source.
        self.node_port = node_port
        # Other nodes' history, events, logs and processes need their read token ([agent] tcp_token_file)
        self.node_token_file = Path(node_token_file) if node_token_file else None
        self.viewing_node: str | None = None
        self.home_socket = str(socket_path)
        self._home = (database_path, self.readonly_reason)
        # The entry paused the garbage collector for the start (cli/dashboard_cmd.py): collection resumes after the
        # first frame. A start allocates hundreds of thousands of objects and frees few; its ~120 collection passes
        # found little and cost a tenth of the start on a loaded machine (docs/dashboard.md).
        self._gc_paused = gc_paused
        self._first_frame = False
        # One control at a time: the action from its key press until its answer (or its dialog's cancel), and the
        # picker or dialog of it now open, watched against each status (`_watch_dialog`).
        self._control: str | None = None
        self._dialog: ConfirmScreen | ProfilePickerScreen | None = None
        self._dialog_text: Callable[[], RenderableType] | None = None  # the open dialog's body from the state now
        self._sending = False  # confirmed: the request is out, its answer awaited (the palette may open meanwhile)
        self._start_offered = True  # whether S was offered at the last status (bindings refresh when it changes)

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """Every notification is plain text, whatever a caller asks: its message quotes the agent, vLLM or a
        path (a '[/]' in it would raise MarkupError), with its control characters escaped."""
        super().notify(terminal_safe(message, lines=True), title=terminal_safe(title), severity=severity,
                       timeout=timeout, markup=False)

    def get_line_filters(self) -> Sequence[LineFilter]:
        """Textual's filters, and in ASCII mode the last one that leaves only ASCII on the screen (tui/glyphs.py):
        a C-locale terminal shows any other character as garbage and shifts the rest of its line."""
        filters = super().get_line_filters()
        return [*filters, self._ascii_filter] if self._ascii_filter is not None else filters

    def get_key_display(self, binding: Binding) -> str:
        """A key as the key bar and the help show it; in ASCII mode a key Textual shows as a symbol (`⏎`, `↑`) by
        its name (`enter`, `up`): as `?` it would say nothing."""
        shown = super().get_key_display(binding)
        if self.ascii_only and not shown.isascii():
            return glyph(shown, True) if all(c.isascii() or c in ASCII for c in shown) else binding.key
        return shown

    # ------------------------------------------------------------------ helpers used by screens
    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    def node_now_ms(self) -> int:
        """Now on the clock of the node shown (`LiveState.node_ms`): what its runs' and events' times compare with."""
        return self.state.node_ms(self.now_ms())

    def retry_in_s(self) -> float | None:
        if self.state.outage is None or self._next_poll_at is None:
            return None
        return max(0.0, self._next_poll_at - time.monotonic())

    def header_lead(self) -> list[tuple[str, str]]:
        """First in the header, never cut: another node's screens are open (the cluster view); the display is
        paused (frozen numbers must never read as live once the toast has faded, at any width)."""
        lead = []
        if self.viewing_node:
            lead.append((f"viewing node {self.viewing_node} (read-only)", "bold white on blue"))
        if self.paused:
            lead.append(("⏸ PAUSED (p resumes)", "bold black on yellow"))
        return lead

    def header_flags(self) -> list[tuple[str, str]]:
        flags = []
        if self.readonly_reason and not self.viewing_node:  # the lead says it while another node is open
            flags.append((f"READ-ONLY ({self.readonly_reason})", "bold yellow"))
        if self.utc:
            flags.append(("UTC", "dim"))
        return flags

    def open_gpu(self, index: int) -> None:
        self.gpu_index = index
        self.switch_mode("gpu")

    # ------------------------------------------------------------------ lifecycle
    def on_load(self) -> None:
        # Before the driver starts and the Node view composes: a status the source already holds (asked for while
        # the modules imported, tui/source.py) is in the state when the view first draws, so the first paint is
        # the full frame, not empty panels waiting a round trip for the first poll.
        first_status = getattr(self.source, "first_status", None)
        status = first_status() if first_status is not None else None
        if status is not None:
            self.state.apply_status(status, self.now_ms())

    def on_mount(self) -> None:
        if self.state.status is None:
            self.poll()
        else:  # the status of on_load is this poll's: the next one comes an interval later
            self._arm_poll(self.poll_interval_s)
            self.call_after_refresh(self._after_first_frame)
        if not self.is_headless:
            # An SSH session that drops sends SIGHUP: leave instead of drawing into nothing.
            try:
                asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.exit)
            except (NotImplementedError, RuntimeError):
                pass

    async def on_unmount(self) -> None:
        self._resume_gc()
        await self.source.close()

    def _after_first_frame(self) -> None:
        """The first frame with the node's state (or its outage) is painted: what waited for it may start."""
        if self._first_frame:
            return
        self._first_frame = True
        self._resume_gc()
        self._start_backfill()  # it competes with start-up for the one core we may get

    def _resume_gc(self) -> None:
        if self._gc_paused:
            self._gc_paused = False
            gc.enable()

    # ------------------------------------------------------------------ polling
    def _arm_poll(self, delay_s: float) -> None:
        # One timer at most: a manual refresh must not start a second chain of polls.
        if self._poll_timer is not None:
            self._poll_timer.stop()
        self._next_poll_at = time.monotonic() + delay_s
        self._poll_timer = self.set_timer(delay_s, self.poll)

    @work(exclusive=True, group="poll", exit_on_error=False)
    async def poll(self) -> None:
        """One poll; re-arms a one-shot timer when done so polls never overlap."""
        delay = self.poll_interval_s
        source = self.source
        try:
            status = await source.status()  # a Status; an answer that is not one raises AgentUnreachable
            if source is not self.source:
                return  # the dashboard was pointed at another node meanwhile: this answer is not its
            self.backoff.reset()
            self.post_message(StatusArrived(status))
        except AgentUnreachable as exc:
            delay = self.backoff.next_delay()
            self.post_message(AgentLost(str(exc)))
        except AgentRefused as exc:
            delay = self.backoff.next_delay()
            self.post_message(AgentLost(f"agent answered {exc.status}: {exc.message}"))
        except asyncio.CancelledError:
            raise  # replaced by a newer poll (refresh), which arms the timer itself
        except Exception as exc:  # a bug must not stop polling for the rest of the night
            delay = self.backoff.next_delay()
            self.post_message(AgentLost(f"unexpected answer: {type(exc).__name__}: {exc}"))
        self._arm_poll(delay)

    def _live(self) -> bool:
        """False while the app is shutting down (no screen left to draw on)."""
        try:
            self.screen  # noqa: B018
        except ScreenStackError:
            return False
        return True

    def on_status_arrived(self, message: StatusArrived) -> None:
        if not self._live():
            return
        first = self.state.status is None
        ended = self.state.apply_status(message.status, self.now_ms())
        if first:
            self.call_after_refresh(self._after_first_frame)
        if ended is not None:
            self.notify(f"agent back (unreachable since {fmt_clock(ended.since_ms, self.utc)})",
                        title="Agent reachable", severity="information")
        start_was = self._start_offered
        self._start_offered = self._start_possible()
        if first or ended is not None or self._start_offered != start_was:
            self.refresh_bindings()  # only when what is allowed changed
        self._watch_dialog()
        self._redraw()

    def on_agent_lost(self, message: AgentLost) -> None:
        if not self._live():
            return
        first = self.state.mark_lost(message.error, self.now_ms())
        if first and self.state.status is None:
            self._start_backfill()  # the agent is down: stored history is all there is
            self.call_after_refresh(self._after_first_frame)
        if first:
            self.notify(f"{message.error}\nlast values stay on screen, greyed; retrying with backoff",
                        title="Agent unreachable", severity="error", timeout=8)
            self.refresh_bindings()
        self._redraw()

    def _redraw(self) -> None:
        # Only the visible view draws; a modal on top keeps the view's body unchanged until it closes, but not its
        # header: that line, still on screen above a dialog, must not say STARTING while the dialog says ready.
        if self.paused:
            return
        if isinstance(self.screen, LiveScreen):
            self.screen.post_message(LiveRefreshed())
        elif len(self.screen_stack) > 1 and isinstance(below := self.screen_stack[-2], LiveScreen):
            below.redraw_header()

    def _start_backfill(self) -> None:
        if self.backfill_enabled and not self._backfill_started:
            self._backfill_started = True
            self.load_backfill()

    @work(thread=True, exclusive=True, group="backfill", exit_on_error=False)
    def load_backfill(self) -> None:
        end = self.now_ms()
        start = end - BACKFILL_S * 1000
        try:
            with self.history.reader() as reader:
                _, serving = reader.series("serving", list(SERVING_KEYS), start, end, max_points=1000)
                _, gpus = reader.series("gpu", list(GPU_KEYS), start, end, max_points=1000)
        except HistoryUnavailable:
            return  # the History view explains why; live charts fill from the socket
        except Exception:  # a damaged database must not take the live view down
            return
        self.call_from_thread(self.state.backfill, _flatten(serving), _flatten(gpus))

    # ------------------------------------------------------------------ actions
    def action_view(self, name: str) -> None:
        if name in VIEWS:
            self.switch_mode(name)

    def action_help(self) -> None:
        view = getattr(self.screen, "VIEW_TITLE", "") or self.current_mode
        from lynxtop.tui.screens.help import HelpScreen

        self.push_screen(HelpScreen(view))  # it reads the keys in force on the view it opens over

    def action_refresh_now(self) -> None:
        if self._poll_timer is not None:
            self._poll_timer.stop()
        self.backoff.reset()
        self.poll()
        if isinstance(self.screen, LiveScreen):
            self.screen.post_message(LiveRefreshed())

    def action_pause(self) -> None:
        self.paused = not self.paused
        self.notify("display paused; p resumes" if self.paused else "display resumed")
        if isinstance(self.screen, LiveScreen):
            self.screen.redraw()

    def action_toggle_utc(self) -> None:
        self.utc = not self.utc
        self.notify("times in UTC" if self.utc else "times in local time")
        if isinstance(self.screen, LiveScreen):
            self.screen.redraw()

    def action_command_palette(self) -> None:
        """Not over a control's picker or dialog: a control run from the palette would leave that dialog on screen,
        orphaned, and a view switched underneath would hide it."""
        if self._control is not None and not self._sending:  # its picker or dialog is open, or about to be
            self.notify(f"{self._control} is waiting for your answer: Esc cancels it, then open the command palette",
                        severity="warning")
            return
        super().action_command_palette()
        if self.ascii_only:
            self.call_after_refresh(self._ascii_palette_icon)

    def _ascii_palette_icon(self) -> None:
        """Textual's search icon is a wide emoji: the ASCII filter drew it `??` before the palette's input."""
        for icon in self.screen.query(SearchIcon):
            icon.icon = ">"

    def action_demo_load(self) -> None:
        if self.demo_load is not None:
            self.notify(self.demo_load(), title="demo load")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "demo_load":
            return self.demo_load is not None  # hidden outside the demo
        if action == "view" and parameters == ("cluster",):
            head = self.state.status is not None and self.state.status.cluster.role == Role.HEAD
            return head or self.viewing_node is not None  # a fleet to list: on a Ray head (or back to it)
        if action == "control":
            if self.readonly_reason:
                return False  # hidden: read-only
            if not self.state.connected:
                return None  # shown greyed: nothing to send it to
            if parameters == ("start",) and not self._start_possible():
                return None  # shown greyed: serving already runs (restart or switch act on it)
        return True

    def _start_possible(self) -> bool:
        """Start acts only on a node not serving: while serving starts, runs or is degraded the agent refuses it."""
        return self.state.serving.state not in START_REFUSED

    def action_control(self, action: str) -> None:
        if action not in CONTROL_ACTIONS:
            return
        if self._control is not None:  # a dialog open, or an answer awaited: a second control would cancel it
            self.notify(f"{self._control} is waiting for the agent's answer: {action} not sent; press "
                        f"{CONTROL_KEYS[action]} again once it has answered", severity="warning")
            return
        self._control = action  # taken here, not in the worker: two quick keys start one control
        self.run_control(action)

    @work(group="control", exit_on_error=False)
    async def run_control(self, action: str) -> None:
        """One control from key to answer. Never `exclusive`: a worker cancelled mid-POST would drop the answer of
        a request the agent may have acted on; `action_control` lets one run at a time instead."""
        try:
            await self._run_control(action)
        finally:
            self._control, self._dialog, self._sending = None, None, False

    async def _run_control(self, action: str) -> None:
        if self.readonly_reason:
            self.notify(f"read-only: {self.readonly_reason}", severity="warning")
            return
        from lynxtop.tui import control_text
        from lynxtop.tui.screens.confirm import ConfirmScreen

        status = self.state.status
        cluster = status.cluster if status is not None else None
        if cluster is not None and cluster.role == Role.WORKER:
            await self._worker_control(action, cluster)
            return
        try:
            choice = await self._choose_profile(action, self.state.serving)
            if choice is None:
                return
            profile, current, target = choice
            usual = await self._usual_load_ms(action, profile)
            # The dialog shows the run as it is now (the picker may have been open a while): that run is the one
            # the confirmation is sent for
            def text() -> tuple[str, RenderableType, str]:
                return control_text.confirmation(action, self.state.serving, self.state.serving_metrics, profile,
                                                 current, target, now_ms=self.node_now_ms(), usual_load_ms=usual)

            title, body, label = text()
            seen = control_text.Seen.of(self.state.serving, self._cluster())
            await self._confirm_and_send(action, profile, ConfirmScreen(title, body, label, seen=seen,
                                                                        live=lambda: text()[1]),
                                         lambda: text()[1])
        except AgentRefused as exc:
            self._refused(action, exc)
        except AgentUnreachable as exc:  # reading the profiles: nothing was sent
            self.notify(f"{action} not sent: {exc}", title="Agent unreachable", severity="error")

    async def _usual_load_ms(self, action: str, profile: str | None) -> int | None:
        """How long the profile `action` loads usually takes (its last ready runs in the history), for the dialog
        to say instead of a guess: a switch's target; a start's profile (its last run's load included); the running
        profile for a restart or stop of a run whose own load was not measured (still loading). Read in a thread
        and given up after USUAL_LOAD_WAIT_S (a slow disk, another node's history over the network); None then, or
        where there is no history."""
        from lynxtop.store.reader import usual_load_ms
        from lynxtop.tui.control_text import last_load_s

        serving = self.state.serving
        exclude = serving.run_id  # the load under way is no usual one
        if action == "switch":
            name = profile
        elif action == "start":  # the profile picked, else the agent's current one; the last run's load counts
            name, exclude = profile or serving.profile, None
        elif action == "stop" and serving.held is not None and serving.held.profile:
            name = serving.held.profile  # a held server's load is what its stop throws away
        elif action in ("restart", "stop") and last_load_s(serving) is None:
            name = serving.profile
        else:
            return None
        history = self.history
        if not name or history is None:
            return None

        def read() -> int | None:
            with history.reader() as reader:
                return usual_load_ms(reader, name, exclude_run=exclude)

        try:
            return await asyncio.wait_for(asyncio.to_thread(read), USUAL_LOAD_WAIT_S)
        except Exception:  # noqa: BLE001 - no history, unreadable, too slow: the dialog says a guess, no error
            return None

    def _cluster(self) -> ClusterStatus | None:
        return self.state.status.cluster if self.state.status is not None else None

    async def _confirm_and_send(self, action: str, profile: str | None, dialog: ConfirmScreen,
                                text: Callable[[], RenderableType] | None = None) -> None:
        """Ask; send for the run the dialog showed (`expect_run`); say what came of it. `text` redraws the body
        while the same run moves on. Nothing is retried: a control that may have reached the agent is never sent
        twice by the dashboard."""
        from lynxtop.tui.source import ControlUnanswered

        self._dialog, self._dialog_text = dialog, text
        try:
            confirmed = await self.push_screen_wait(dialog)
        finally:
            self._dialog = self._dialog_text = None
        if dialog.withdrawn is not None:
            self._withdrawn(action, dialog.withdrawn)
            return
        if not confirmed:
            self.notify(f"{action}: cancelled, nothing changed")
            return
        seen = dialog.seen
        self._sending = True
        try:
            answer = await self.source.action(action, profile, expect_run=seen.run_id if seen else None)
        except ControlUnanswered as exc:
            self.notify(f"{action}: {exc}: the agent may have acted — watch the header; nothing is retried",
                        title=f"{action}: no answer", severity="warning", timeout=15)
            self.action_refresh_now()
            return
        except AgentRefused as exc:
            self._refused(action, exc)
            return
        except AgentUnreachable as exc:  # before the request left: not sent
            self.notify(f"{action} not sent: {exc}", title="Agent unreachable", severity="error")
            return
        self.notify(answer.message or f"{action} accepted", title=f"{action} accepted")
        self.action_refresh_now()

    def _withdrawn(self, action: str, why: str) -> None:
        self.notify(f"{why} while you were confirming: {action} not sent, nothing done; press "
                    f"{CONTROL_KEYS[action]} again if you still mean it", title=f"{action}: the run changed",
                    severity="warning", timeout=10)

    def _watch_dialog(self) -> None:
        """Hold the open picker or dialog to the run it showed: withdrawn when that run changed (another operator's
        switch, a crash, a stop), its text brought up to date when the same run only moved on (starting -> ready).
        The agent checks `expect_run` too; this keeps the operator from confirming what is no longer on screen."""
        dialog = self._dialog
        if dialog is None or dialog.seen is None or dialog.withdrawn is not None:
            return
        from lynxtop.tui import control_text
        from lynxtop.tui.screens.confirm import ConfirmScreen

        now = control_text.Seen.of(self.state.serving, self._cluster())
        why = control_text.run_change(dialog.seen, now)
        if why is not None:
            dialog.withdraw(why)
            return
        if isinstance(dialog, ConfirmScreen) and now != dialog.seen:
            dialog.seen = now  # the same run, a state of the same kind: what the action does is unchanged
            if self._dialog_text is not None:
                dialog.update_body(self._dialog_text())

    async def _worker_control(self, action: str, cluster: ClusterStatus) -> None:
        """A Ray worker serves no vLLM: start and stop act on its Ray (said so), restart and switch belong to the
        head."""
        if action not in ("start", "stop"):
            self.notify(f"this node is a Ray worker: {action} serving on the head ({cluster.address})",
                        severity="warning")
            return
        from lynxtop.tui import control_text
        from lynxtop.tui.screens.confirm import ConfirmScreen

        title, body, label = control_text.worker_ray_text(action, cluster)
        seen = control_text.Seen.of(self.state.serving, cluster)
        await self._confirm_and_send(action, None, ConfirmScreen(title, body, label, seen=seen))

    async def _choose_profile(self, action: str, serving: ServingStatus) -> tuple[str | None, Any, Any] | None:
        """(profile, current, target) for the action; None when there is nothing to pick, the picker was closed, or
        the run changed while it was open (said so).

        Only switch, and start without a known profile, ask which profile. Restart and stop get the running
        profile as `current` (its shutdown timeout is what the run drains for: their dialogs say it).
        """
        if action in ("restart", "stop"):
            return None, await self._running_profile(), None
        if action != "switch" and not (action == "start" and not serving.profile):
            return None, None, None
        from lynxtop.tui import control_text

        seen = control_text.Seen.of(serving, self._cluster())
        listing = await self.source.profiles()
        profiles = list(listing.profiles)
        current_name = listing.current or serving.profile
        if not [p for p in profiles if p.name != current_name or action == "start"]:
            self.notify("no other profile to switch to (see `lynxtop config check`)", severity="warning")
            return None
        from lynxtop.tui.screens.profile_picker import ProfilePickerScreen

        picker = ProfilePickerScreen(f"{'Switch to' if action == 'switch' else 'Start'} which profile?", profiles,
                                     current_name if action == "switch" else None, seen=seen)
        self._dialog = picker
        self._watch_dialog()  # the run may have changed while the profiles were read
        try:
            profile = await self.push_screen_wait(picker) if picker.withdrawn is None else None
        finally:
            self._dialog = None
        why = picker.withdrawn or control_text.run_change(seen, control_text.Seen.of(self.state.serving,
                                                                                      self._cluster()))
        if why is not None:  # the picker's "current" and the flag diff to come were of another run
            self._withdrawn(action, why)
            return None
        if profile is None:
            return None
        target = listing.get(profile)
        current = listing.get(current_name)
        return profile, current, target

    async def _running_profile(self) -> ProfileInfo | None:
        """The profile of the run the polled status shows, as the agent lists it; None where it cannot be read (a
        stop must not wait on it: its dialog then names the timeout without its value) or lists no such profile."""
        try:
            listing = await self.source.profiles()
        except (AgentRefused, AgentUnreachable):
            return None
        name = self.state.serving.profile  # after the read: the run the dialog is about to show
        return listing.get(name) if name else None

    def view_node(self, label: str | None, endpoint: str | None) -> None:
        """Point the dashboard at another node's agent, read-only (`endpoint` http://IP:PORT), or back at this
        node's own socket (`label` None). Its live state starts afresh; its history is not here."""
        token = None
        if label is None or endpoint is None:
            database, self.readonly_reason = self._home
            endpoint, self.history = self.home_socket, HistorySource(database)
        else:
            from lynxtop.tui.cluster_source import ElsewhereHistory, RemoteHistory

            self.readonly_reason = f"viewing node {label}"  # its endpoint has no control route either
            token, problem = self._node_token()
            self.history = RemoteHistory(label, endpoint, token) if token else ElsewhereHistory(label, problem)
        self.viewing_node = label
        self.source = LiveSource(endpoint, read_only=self.readonly_reason if label else None, token=token)
        self.state = LiveState(known_simulated=self.simulated and label is None)  # another node: its status says
        self.backoff.reset()
        self.refresh_bindings()
        self.switch_mode("node")
        self.action_refresh_now()
        self.notify(f"viewing node {label} (read-only)" if label else "back on this node", title="Cluster")

    def _node_token(self) -> tuple[str | None, str | None]:
        """The other nodes' read token from --node-token-file (read each time a node is opened: a fixed file is
        picked up without a restart), and why there is none."""
        if self.node_token_file is None:
            return None, None
        from lynxtop.contract.config import read_token_file

        token, why = read_token_file(self.node_token_file, check_owner=False)  # the agent's file, its group's
        return (token, None) if not why else (None, why)

    def _refused(self, action: str, exc: AgentRefused) -> None:
        import re

        def _already(message: str) -> str | None:
            """What an older agent's `state` refusal says is already so: serving's "already ready/degraded" is
            serving; Ray's "already running", either's "already starting"/"already stopped" as said; None when the
            message names no such state (then it is the busy agent's refusal it was)."""
            m = re.search(r"\balready (running|starting|stopped|serving|ready|degraded)\b", message)
            if m is None:
                return None
            return f"already {'serving' if m.group(1) in ('ready', 'degraded') else m.group(1)}"

        if exc.status == 403:
            self.readonly_reason = f"agent refused control: {exc.message}"
            self.refresh_bindings()
            self.notify(f"{exc.message}\nthe dashboard is now read-only", title=f"{action} refused",
                        severity="error", timeout=10)
            if isinstance(self.screen, LiveScreen):
                self.screen.redraw()
        elif exc.status == 409 and exc.code == "run_changed":  # the agent's guard: the run changed since the poll
            self.notify(f"{exc.message}\nthe header shows the run now; press {CONTROL_KEYS.get(action, '')} again "
                        "if you still mean it", title=f"{action} not done: the run changed", severity="warning",
                        timeout=10)
            self.action_refresh_now()
        elif exc.status == 409 and exc.code in ALREADY_DONE:  # the ask already met: nothing done, nothing wrong
            self.notify(exc.message, title=f"{action}: {ALREADY_DONE[exc.code]}", severity="information", timeout=8)
        elif exc.status == 409 and action == "start" and exc.code == "state" and (already := _already(exc.message)):
            # older agents, before the already_* codes: titled as the message says (Ray's "already running")
            self.notify(exc.message, title=f"start: {already}", severity="warning", timeout=8)
        elif exc.status == 409:
            self.notify(exc.message, title=f"{action}: agent busy", severity="warning", timeout=8)
        else:
            self.notify(exc.message, title=f"{action} refused ({exc.status})", severity="error", timeout=10)


def _view(module: str, name: str) -> LiveScreen:
    """Views other than Node are imported when first opened: the first frame must come within a second."""
    import importlib

    return getattr(importlib.import_module(f"lynxtop.tui.screens.{module}"), name)()


def _flatten(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rollup rows carry {col}_avg; the live charts want {col}."""
    out = []
    for row in rows:
        if any(k.endswith("_avg") for k in row):
            flat = {k[:-4]: v for k, v in row.items() if k.endswith("_avg")}
            flat["ts_ms"] = row["ts_ms"]
            if "gpu" in row:
                flat["gpu"] = row["gpu"]
            out.append(flat)
        else:
            out.append(row)
    return out
