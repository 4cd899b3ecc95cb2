"""The one line every view starts with: which node, what it serves, in what state, and whether to trust it."""

from __future__ import annotations

import dataclasses

from rich.cells import cell_len
from rich.text import Text

from lynxtop.contract.format import fmt_duration, fmt_ms
from lynxtop.contract.quantile import over
from lynxtop.contract.status import (
    LOG_SILENT_SHOW_S,
    AgentStatus,
    ClusterStatus,
    RayState,
    Role,
    ServingState,
    ServingStatus,
    SlaState,
    SlaStatus,
    load_phase,
    log_silent_s,
    taker_text,
)
from lynxtop.tui.glyphs import app_ascii, ascii_text
from lynxtop.tui.live_state import LiveState
from lynxtop.tui.widgets.text_panel import TextPanel

# Words first, colour second: every state reads without colour.
STATE_STYLE = {
    ServingState.READY: ("READY", "bold green"),
    ServingState.STARTING: ("STARTING", "bold yellow"),
    ServingState.DEGRADED: ("DEGRADED", "bold yellow"),
    ServingState.STOPPING: ("STOPPING", "bold yellow"),
    ServingState.STOPPED: ("STOPPED", "bold"),
    ServingState.BACKOFF: ("BACKOFF", "bold red"),
    ServingState.CRASH_LOOP: ("CRASH-LOOP", "bold red reverse"),
    ServingState.WAITING: ("WAITING", "bold yellow"),  # a head holding its profile until Ray has the GPUs
}
# The one SIMULATED badge: the header and the too-small screen (which hides the header) show it alike
SIMULATED_BADGE = (" SIMULATED ", "bold black on magenta")
RAY_STYLE = {
    RayState.RUNNING: "green",
    RayState.STARTING: "yellow",
    RayState.STOPPING: "yellow",
    RayState.STOPPED: "bold",
    RayState.BACKOFF: "bold red",
    RayState.CRASH_LOOP: "bold red reverse",
}


def _over(sla: SlaStatus) -> list[tuple[str, float]]:
    """The breached p99s, (name, value), TTFT first; never one known only as below its lowest bucket's bound."""
    return [(name, float(v)) for name, v, lowest, limit in (
        ("TTFT", sla.ttft_p99_ms, sla.ttft_lowest_bucket_ms, sla.ttft_threshold_ms),
        ("TPOT", sla.tpot_p99_ms, sla.tpot_lowest_bucket_ms, sla.tpot_threshold_ms))
        if v is not None and over(v, lowest, limit)]


def _short_ms(v: float) -> str:
    """`38.6s`, `199ms`: a breached p99 in as few cells as still reads."""
    if v >= 100_000:
        return f"{v / 1000:.0f}s"
    if v >= 1000:
        return f"{v / 1000:.1f}s"
    return f"{v:.0f}ms"


def sla_badge(sla: SlaStatus, short: bool = False) -> Text:
    """`short`: for a narrow header, every breached metric kept, the words around them left out
    (`SLA ✗ TTFT 38.6s TPOT 199ms`)."""
    if sla.state == SlaState.OK:
        return Text("SLA ✓" if short else "SLA ✓ ok", style="green")
    if sla.state == SlaState.BREACH:
        # Say which p99 and over what window: the Serving panel's figures must be checkable against it.
        over = _over(sla)
        if short:
            badge = Text("SLA ✗", style="bold red reverse")
            if over:
                badge.append(" " + " ".join(f"{name} {_short_ms(v)}" for name, v in over), style="bold red")
            return badge
        badge = Text("SLA ✗ BREACH", style="bold red reverse")
        if over:
            window = f"/{sla.window_s:g}s" if sla.window_s is not None else ""
            badge.append(f" {', '.join(f'{name} {fmt_ms(v)}' for name, v in over)} p99{window}", style="bold red")
        return badge
    return Text("SLA ?" if short else "SLA ? unknown", style="dim")


def sla_limit(sla: SlaStatus, series: str) -> float | None:
    """The SLA's p99 limit for a latency series ("ttft", "tpot"); None for a series the SLA does not bound."""
    return {"ttft": sla.ttft_threshold_ms, "tpot": sla.tpot_threshold_ms}.get(series)


# How hard a line is pressed to fit the width, in order: 0 everything in full; 1 the SLA, the action and the
# history badge in short, UTC left out; 2 one space between parts; 3 (a breach only) the state's durations left
# out, `HIST` for `HISTORY`. What still does not fit is cut at the end, where the least important parts are.
LEVELS = 4


class NodeHeader(TextPanel):
    DEFAULT_CSS = "NodeHeader { height: 1; }"

    def show(self, state: LiveState, now_ms: int, flags: list[tuple[str, str]],
             lead: list[tuple[str, str]] | None = None) -> None:
        """`lead`: what must never be cut, before everything (whose node this is, when not this one's; PAUSED).

        By importance: the node and its state, an action in progress, the agent's health, then the SLA and the
        flags; at a narrow width the line is shortened, least important first, before anything is cut."""
        if state.outage is not None and state.received_ms is not None:
            # One staleness rule with the banner: an unreachable agent's snapshot is frozen at its last answer,
            # so a STOPPING timer does not keep counting for a stop that may long have finished.
            now_ms = state.received_ms
        width = self.size.width
        # The level is the least pressed at which the line fits (its flags aside: a long read-only reason is cut,
        # not a reason to shorten the rest). The state's durations go only for a breach's figures.
        breach = state.status is not None and state.sla.state == SlaState.BREACH
        held = state.status is not None and bool(state.status.cluster.gpus_taken)  # a worker's GPUs taken
        asc = app_ascii(self)
        for level in range(LEVELS if breach or held else LEVELS - 1):
            t = ascii_text(header_line(state, now_ms, [], lead, level), asc)  # measured as drawn
            if not width or t.cell_len <= width:
                break
        _flags(t, flags, level)
        serving, agent = state.serving, state.agent
        # Least important last, and only whole: at 80 columns "vLL…" said nothing.
        tail = [f"  vLLM {serving.vllm_version}" if serving.vllm_version else "",
                f"  agent up {fmt_duration(agent.uptime_s)}" if agent.uptime_s is not None else ""]
        for text in filter(None, tail):
            if width and t.cell_len + cell_len(text) > width:
                break
            t.append(text, style="dim")
        self.update(ascii_text(t, asc))


def header_line(state: LiveState, now_ms: int, flags: list[tuple[str, str]],
                lead: list[tuple[str, str]] | None = None, level: int = 0) -> Text:
    """The header without its tail, pressed to `level` (LEVELS). `now_ms` is this dashboard's clock: the node's
    times are compared with it read on the node's own clock (`LiveState.node_ms`)."""
    now_ms = state.node_ms(now_ms)
    agent, serving = state.agent, state.serving
    sep = "  " if level < 2 else " "
    t = Text(no_wrap=True, overflow="ellipsis")
    for text, style in lead or ():
        t.append(f" {text} ", style=style)
        t.append(" ")
    if state.simulated:
        t.append(*SIMULATED_BADGE)
        t.append(" ")
    t.append(agent.host or "?", style="bold")
    if state.status is None:
        t.append(sep + "waiting for the agent…", style="dim")
    else:
        cluster = state.status.cluster
        worker = (cluster.role == Role.WORKER and serving.state == ServingState.STOPPED and not serving.profile
                  and serving.unknown_state is None)
        if worker:
            _worker(t, cluster, now_ms, level)  # no vLLM here: its Ray is what it runs (and no SLA to judge)
        else:
            _serving_state(t, serving, now_ms, sep, durations=level < 3)
            if cluster.role == Role.HEAD:
                _head(t, cluster)
        _action(t, agent, sep, short=level >= 1)
        _agent_health(t, state, agent, now_ms, sep)
        _history(t, state, agent, sep, level)
        if not worker:
            t.append(sep)
            t.append_text(sla_badge(state.sla, short=level >= 1))
    _flags(t, flags, level)
    return t


def _flags(t: Text, flags: list[tuple[str, str]], level: int) -> None:
    """READ-ONLY and its reason, UTC: after the SLA. A pressed line leaves out `UTC` (a matter of display)."""
    sep = "  " if level < 2 else " "
    for text, style in flags:
        if level == 0 or text != "UTC":
            t.append(f"{sep}{text}", style=style)


def _serving_state(t: Text, serving: ServingStatus, now_ms: int, sep: str = "  ", durations: bool = True) -> None:
    """Profile, state word and how long; the start-up phase; the next retry. `durations` False: the state's and
    the phase's times left out (a narrow line; the retry's stays)."""
    t.append(sep + (serving.profile or "no profile"))
    word, style = STATE_STYLE.get(serving.state, (serving.state.upper(), ""))
    if serving.unknown_state is not None:  # a state this lynxtop does not know (escaped as every answer): never STOPPED
        word, style = f"UNKNOWN ({serving.unknown_state})", "bold yellow"
    t.append(sep)
    t.append(word, style=style)
    since = serving.state_since_ms
    if since and durations:
        t.append(f" {fmt_duration((now_ms - since) / 1000)}")
    if serving.state == ServingState.STARTING and serving.phase:
        phase_since = serving.phase_since_ms or since
        took = f" {fmt_duration((now_ms - (phase_since or now_ms)) / 1000)}" if durations else ""
        t.append(f" ({load_phase(serving, short=True)}{took})")
        silent = log_silent_s(serving, now_ms)
        if silent is not None and silent >= LOG_SILENT_SHOW_S:  # a hung load, not a slow one: its log went quiet
            t.append(f" log silent {fmt_duration(silent)}", style="bold red")
    if serving.next_retry_ms:
        t.append(f" retry in {fmt_duration((serving.next_retry_ms - now_ms) / 1000)}", style="yellow")
    held = serving.held
    if held is not None:  # STOPPED for the agent, while a server the previous agent left serves on, unsupervised
        run = f"run {held.run_id} " if held.run_id is not None and durations else ""
        t.append(f" · held {run}pid {held.pid if held.pid is not None else '?'}", style="bold yellow")


def _ray_word(t: Text, cluster: ClusterStatus) -> None:
    """`Ray ✓` while it runs (as `agent ✓`: a head line must fit 80 columns), else the state in words."""
    word = "Ray ✓" if cluster.ray_state == RayState.RUNNING else f"Ray {cluster.ray_state.upper()}"
    t.append(word, style=RAY_STYLE.get(cluster.ray_state, ""))


def _worker(t: Text, cluster: ClusterStatus, now_ms: int, level: int = 0) -> None:
    """`worker of HEAD  Ray ✓ 2m  ⚠ GPUs held: pid 4242 (python) GPU 3`: what a worker node does, in the place of
    serving, and the processes not Ray's on its GPUs (vLLM's ranks placed there would run out of memory).

    Pressed (LEVELS): 1 the first holder only, `+N` for the others; 2 the head's address left out; 3 Ray's
    duration and the holder's GPUs left out, `⚠ held: pid 4242 (python) +1`: the warning and the agent's health
    stay on an 80-column line, a SIMULATED badge included."""
    sep = "  " if level < 2 else " "
    t.append(f"  worker of {cluster.address or '?'}  " if level < 2 else " worker ")
    _ray_word(t, cluster)
    if cluster.ray_since_ms and level < 3:
        t.append(f" {fmt_duration((now_ms - cluster.ray_since_ms) / 1000)}")
    if cluster.ray_next_retry_ms:
        t.append(f" retry in {fmt_duration((cluster.ray_next_retry_ms - now_ms) / 1000)}", style="yellow")
    taken = cluster.gpus_taken
    if taken:  # names are foreign (escaped by the agent): appended as plain text, never parsed as markup
        if level == 0:
            text = "⚠ GPUs held: " + ", ".join(map(taker_text, taken))
        elif level < 3:
            text = "⚠ GPUs held: " + taker_text(taken[0])
        else:
            text = "⚠ held: " + taker_text(dataclasses.replace(taken[0], gpus=()))
        if level and len(taken) > 1:
            text += f" +{len(taken) - 1}"
        t.append(sep + text, style="bold yellow")


def _head(t: Text, cluster: ClusterStatus) -> None:
    """`head Ray ✓  2/2 nodes, 16/16 GPUs`: red with a node lost, yellow short of the profile's GPUs."""
    t.append("  head ", style="dim")
    _ray_word(t, cluster)
    if not cluster.nodes:
        t.append("  nodes ?", style="bold yellow" if cluster.ray_state == RayState.RUNNING else "dim")
        return
    alive, lost = cluster.alive_nodes, cluster.lost_nodes
    need = cluster.gpus_needed
    gpus = f"{cluster.gpus_alive:g}" + (f"/{need}" if need is not None else "")
    style = "bold red" if lost else "bold yellow" if need is not None and cluster.gpus_alive < need else "green"
    t.append(f"  {len(alive)}/{len(alive) + len(lost)} nodes, {gpus} GPUs", style=style)
    if cluster.view_error:  # the numbers are the last view read
        t.append(" (stale)", style="bold yellow")


def _action(t: Text, agent: AgentStatus, sep: str = "  ", short: bool = False) -> None:
    """The operator action under way, and by whom: next to the state it is changing."""
    action = agent.action
    if action:
        # no caller over TCP (a remote node's status does not say who asked): nothing rather than "by ?"
        by = f" {'' if short else 'by '}{action.by}" if action.by else ""
        t.append(f"{sep}⟳ {action.action}{' ' + action.profile if action.profile else ''}{by}", style="yellow")


# The history badge's cause on a pressed line (level 1 on), `HISTORY ✗ full`; `HIST ✗ full` at level 3 keeps an
# 80-column line with an action and a breach
SHORT_CAUSE = {"disk full": "full", "database locked": "locked", "writes failing": "failing"}


def _history(t: Text, state: LiveState, agent: AgentStatus, sep: str = "  ", level: int = 0) -> None:
    """`HISTORY ✗ disk full` while the store refuses writes: the agent stays healthy (systemd's watchdog must not
    restart it into a full disk), so this is the header's one sign that history is being lost. Not while the
    agent is unreachable: the banner says so, and the last snapshot's store is no fact about now."""
    if state.outage is None and agent.store.not_writing:
        cause = agent.store.cause
        word = "HIST" if level >= 3 else "HISTORY"
        t.append(f"{sep}{word} ✗ {SHORT_CAUSE.get(cause, cause) if level >= 1 else cause}", style="bold red")


def _agent_health(t: Text, state: LiveState, agent: AgentStatus, now_ms: int, sep: str = "  ") -> None:
    """Whether to trust the numbers: agent health, stalled sampling, NVML."""
    t.append(sep)
    if state.outage is not None:  # the banner's fact, not the last snapshot's `agent ✓`
        t.append("agent ✗ unreachable", style="bold red")
    elif agent.healthy:
        t.append("agent ✓", style="green")
    else:
        t.append("agent ✗ unhealthy", style="bold red")
    # the last tick written, on the node's clock (as `now_ms` here); an older agent's: when it took the status
    ts = agent.last_tick_ms if agent.last_tick_ms is not None else state.ts_ms
    interval = float(agent.sample_interval_s or 1.0)
    if ts and state.outage is None and now_ms - ts > max(5000, 3000 * interval):
        # the agent answers but its sampling stalled: say so, or stale numbers look live
        t.append(f"  ⚠ samples {fmt_duration((now_ms - ts) / 1000)} old", style="bold yellow")
    if agent.nvml.state and agent.nvml.state != "ok":
        t.append(f"  NVML {agent.nvml.state}", style="bold red")
