"""The one line every view starts with: which node, what it serves, in what state, and whether to trust it."""

from __future__ import annotations

from rich.text import Text

from lynxtop.contract.format import fmt_duration
from lynxtop.contract.status import AgentStatus, ServingState, ServingStatus, SlaState, SlaStatus
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
}


def sla_badge(sla: SlaStatus) -> Text:
    if sla.state == SlaState.OK:
        return Text("SLA ✓ ok", style="green")
    if sla.state == SlaState.BREACH:
        return Text("SLA ✗ BREACH", style="bold red reverse")
    return Text("SLA ? unknown", style="dim")


def sla_limit(sla: SlaStatus, series: str) -> float | None:
    """The SLA's p99 limit for a latency series ("ttft", "tpot"); None for a series the SLA does not bound."""
    return {"ttft": sla.ttft_threshold_ms, "tpot": sla.tpot_threshold_ms}.get(series)


class NodeHeader(TextPanel):
    DEFAULT_CSS = "NodeHeader { height: 1; }"

    def show(self, state: LiveState, now_ms: int, flags: list[tuple[str, str]]) -> None:
        agent, serving = state.agent, state.serving
        t = Text(no_wrap=True, overflow="ellipsis")
        if state.simulated:
            t.append(" SIMULATED ", style="bold black on magenta")
            t.append(" ")
        t.append(agent.host or "?", style="bold")
        if state.status is None:
            t.append("  waiting for the agent…", style="dim")
        else:
            _serving_state(t, serving, now_ms)
            t.append("  ")
            t.append_text(sla_badge(state.sla))
            _agent_health(t, state, agent, now_ms)
        for text, style in flags:
            t.append(f"  {text}", style=style)
        # Least important last: a narrow terminal cuts these first.
        if serving.vllm_version:
            t.append(f"  vLLM {serving.vllm_version}", style="dim")
        if agent.uptime_s is not None:
            t.append(f"  agent up {fmt_duration(agent.uptime_s)}", style="dim")
        self.update(t)


def _serving_state(t: Text, serving: ServingStatus, now_ms: int) -> None:
    """Profile, state word and how long; the start-up phase; the next retry."""
    t.append("  " + (serving.profile or "no profile"))
    word, style = STATE_STYLE.get(serving.state, (serving.state.upper(), ""))
    t.append("  ")
    t.append(word, style=style)
    since = serving.state_since_ms
    if since:
        t.append(f" {fmt_duration((now_ms - since) / 1000)}")
    if serving.state == ServingState.STARTING and serving.phase:
        phase_since = serving.phase_since_ms or since
        t.append(f" ({serving.phase} {fmt_duration((now_ms - (phase_since or now_ms)) / 1000)})")
    if serving.next_retry_ms:
        t.append(f" retry in {fmt_duration((serving.next_retry_ms - now_ms) / 1000)}", style="yellow")


def _agent_health(t: Text, state: LiveState, agent: AgentStatus, now_ms: int) -> None:
    """Whether to trust the numbers: agent health, stalled sampling, NVML, an action under way."""
    t.append("  ")
    if agent.healthy:
        t.append("agent ✓", style="green")
    else:
        t.append("agent ✗ unhealthy", style="bold red")
    ts = state.ts_ms
    interval = float(agent.sample_interval_s or 1.0)
    if ts and state.outage is None and now_ms - ts > max(5000, 3000 * interval):
        # the agent answers but its sampling stalled: say so, or stale numbers look live
        t.append(f"  ⚠ samples {fmt_duration((now_ms - ts) / 1000)} old", style="bold yellow")
    if agent.nvml.state and agent.nvml.state != "ok":
        t.append(f"  NVML {agent.nvml.state}", style="bold red")
    action = agent.action
    if action:
        t.append(f"  ⟳ {action.action} {action.profile or ''} by {action.by or '?'}",
                 style="yellow")
