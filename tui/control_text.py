"""What each control action will do, in words, for its confirmation dialog; and profile flag differences.

Pure functions of the typed status and profiles (contract/records.py), so the wording an operator reads at 3 a.m.
is tested without a terminal.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from lynxtop.contract.format import fmt_duration
from lynxtop.contract.records import ProfileInfo
from lynxtop.contract.status import (
    ClusterStatus,
    HeldRun,
    Role,
    ServingMetrics,
    ServingState,
    ServingStatus,
    held_text,
)

# What a control would act on, by state: a change from one kind to another changes what the confirmed action does
# (a stop of a running run, of one already stopping, of none), so a dialog shown for one is not valid for another.
_KIND = {ServingState.STARTING: "running", ServingState.READY: "running", ServingState.DEGRADED: "running",
         ServingState.STOPPING: "stopping", ServingState.STOPPED: "stopped", ServingState.BACKOFF: "retrying",
         ServingState.CRASH_LOOP: "retrying", ServingState.WAITING: "retrying"}

# Said where no load of the profile was measured: the dialog does not know the model's size, so it names none
LOAD_GUESS = "a large model can take 10-30 minutes"


def last_load_s(serving: ServingStatus) -> float | None:
    started, ready = serving.started_ms, serving.ready_ms
    if started and ready and ready >= started:
        return (ready - started) / 1000
    return None


def _what_runs(serving: ServingStatus) -> str:
    # `no profile` alone: "profile no profile" read as a profile of that name (a held server's stopped agent)
    parts = [f"profile {serving.profile}" if serving.profile else "no profile", f"state {serving.state}"]
    if serving.run_id:
        parts.append(f"run {serving.run_id}")
    if serving.pid:
        parts.append(f"pid {serving.pid}")
    if serving.model:
        parts.append(f"model {serving.model}")
    return ", ".join(parts)


def load_time(serving: ServingStatus, profile: str | None = None, usual_ms: int | None = None) -> tuple[str, str]:
    """How long the load an action starts may take, from what is known: (words in brackets, a sentence after), one
    of them empty. `profile`: the profile that loads (the running one where None); `usual_ms`: its usual load from
    the history (`usual_load_ms`), where read. The running run's own load is said only for its own profile (a
    switch loads another: its load time is not this one's); without either, a guess naming no model size."""
    same = profile is None or profile == serving.profile
    took = last_load_s(serving) if same else None
    if took:
        return "", f" The last load took {fmt_duration(took)}."
    if usual_ms:
        return "", f" {profile or serving.profile} usually loads in ~{fmt_duration(usual_ms / 1000)}."
    return f" ({LOAD_GUESS})", ""


def _load_line(serving: ServingStatus, profile: str | None = None, usual_ms: int | None = None) -> str:
    guess, known = load_time(serving, profile, usual_ms)
    return f"The model loads again{guess}; nothing is served meanwhile.{known}"


def _now_ms() -> int:
    return int(time.time() * 1000)


def _load_pct(serving: ServingStatus) -> float | None:
    """The load's progress in percent where the status carries one (`load_progress`, newer agents: a number or an
    object with `pct`); None otherwise, so nothing is made up."""
    progress = getattr(serving, "load_progress", None)
    pct = getattr(progress, "pct", progress)
    if isinstance(pct, bool) or not isinstance(pct, int | float) or pct != pct or not 0 <= pct <= 100:
        return None
    return float(pct)


def loading_lost(serving: ServingStatus, now_ms: int | None = None) -> Text | None:
    """While the run is still loading (STARTING): how much of this load the action throws away, e.g.
    `Still loading: 12m00s of this load is lost (phase loading weights, 40%).` None in any other state.

    Why: 12 minutes into a 20-minute load, "this takes 10-30 min" does not say that a restart or stop now wastes
    the 12 minutes already spent; that is what the operator weighs. Said whatever started the load (a `start`,
    autostart or a retry), since the agent accepts a restart of some of them at once."""
    if serving.state != ServingState.STARTING:
        return None
    now = _now_ms() if now_ms is None else now_ms
    began = serving.started_ms or serving.state_since_ms
    spent = fmt_duration((now - began) / 1000) if began else "an unknown time"
    where = [f"phase {serving.phase}"] if serving.phase else []
    pct = _load_pct(serving)
    if pct is not None:
        where.append(f"{pct:.0f}% loaded")
    detail = f" ({', '.join(where)})" if where else ""
    return Text(f"Still loading: {spent} of this load is lost{detail}.", style="bold red")


def shutdown_timeout(profile: ProfileInfo | None) -> str | None:
    """The profile's vLLM `--shutdown-timeout` as words (`5 s`); None where the dialog has no profile or the profile
    sets none."""
    value = dict(profile.flags).get("--shutdown-timeout") if profile is not None else None
    if value is None:
        return None
    try:
        return fmt_duration(float(value))
    except (TypeError, ValueError):
        return str(value)


def aborts_at_once(profile: ProfileInfo | None) -> bool:
    """A known profile that sets no shutdown timeout (or 0): vLLM's default, in-flight requests are aborted at
    once on SIGTERM, nothing drains. False where the profile is not known (it may well set one)."""
    if profile is None:
        return False
    value = dict(profile.flags).get("--shutdown-timeout")
    if value is None:
        return True
    try:
        return float(value) <= 0
    except (TypeError, ValueError):
        return False


def _drain_words(profile: ProfileInfo | None) -> str:
    """What the stop does to in-flight requests, for the sentence saying how vLLM is stopped."""
    if aborts_at_once(profile):
        return "the profile sets no shutdown timeout: in-flight requests are aborted at once"
    timeout = shutdown_timeout(profile)
    return "in-flight requests drain for the profile's shutdown timeout" + (f", {timeout}" if timeout else "")


def _count(metrics: ServingMetrics | None, name: str) -> float:
    n = metrics.metric(name) if metrics is not None else None
    return n if isinstance(n, int | float) and n > 0 else 0


def _busy_lines(metrics: ServingMetrics | None, profile: ProfileInfo | None = None,
                timeout_said: bool = False) -> list[Text]:
    """What the requests in vLLM now lose: the running ones get the shutdown timeout, the waiting ones fail.
    `timeout_said`: the sentence before named the figure (the drain words): said again, it read as a second
    timeout."""
    running, waiting = _count(metrics, "requests_running"), _count(metrics, "requests_waiting")
    if not running and not waiting:
        return []
    timeout = shutdown_timeout(profile)
    if timeout_said:
        grace = "the shutdown timeout"
    else:
        grace = f"vLLM's shutdown timeout ({timeout})" if timeout else "vLLM's shutdown timeout"
    finish = "are aborted at once" if aborts_at_once(profile) else f"get {grace} to finish, then fail"
    if running and waiting:
        text = (f"{running:g} request(s) are running now and {waiting:g} waiting: the waiting ones fail; the running "
                f"ones {finish}.")
    elif running:
        text = f"{running:g} request(s) are running now: they {finish}."
    else:
        text = f"{waiting:g} request(s) are waiting in the queue: they fail."
    return [Text(text, style="bold red")]


def _how_stopped(serving: ServingStatus, profile: ProfileInfo | None) -> str:
    """` (in-flight requests drain ...)` for a serving run; nothing while it loads or is stopped: no request can be
    in flight."""
    return "" if serving.state in (ServingState.STARTING, ServingState.STOPPED) else f" ({_drain_words(profile)})"


def _timeout_said(serving: ServingStatus, profile: ProfileInfo | None) -> bool:
    """Whether `_how_stopped` names the profile's shutdown timeout (a figure), so the lines after need not."""
    return bool(_how_stopped(serving, profile)) and not aborts_at_once(profile) and bool(shutdown_timeout(profile))


def _lost_now(serving: ServingStatus, metrics: ServingMetrics | None, profile: ProfileInfo | None,
              now_ms: int | None, timeout_said: bool = False) -> list[Text]:
    """What the action throws away: the load so far while loading, else the requests in vLLM now; nothing once
    stopped (its metrics are the last read before the stop, not requests now). `timeout_said`: as _busy_lines'."""
    if serving.state == ServingState.STOPPED:
        return []
    lost = loading_lost(serving, now_ms)
    return [lost] if lost is not None else _busy_lines(metrics, profile, timeout_said)


def restart_text(serving: ServingStatus, metrics: ServingMetrics | None = None,
                 profile: ProfileInfo | None = None, now_ms: int | None = None,
                 usual_load_ms: int | None = None) -> RenderableType:
    """`profile`: the running profile, where the dialog has it (its shutdown timeout is said). `now_ms`: now on
    the node's clock (the status' times are the node's); this machine's clock where not given. `usual_load_ms`:
    how long the profile usually loads (load_time)."""
    return Group(
        Text(f"Now: {_what_runs(serving)}."),
        Text(f"vLLM is stopped{_how_stopped(serving, profile)} and started again with the same profile as a new "
             "run."),
        *_lost_now(serving, metrics, profile, now_ms, _timeout_said(serving, profile)),
        Text(_load_line(serving, usual_ms=usual_load_ms), style="bold yellow"),
    )


def stop_text(serving: ServingStatus, metrics: ServingMetrics | None = None,
              profile: ProfileInfo | None = None, now_ms: int | None = None,
              usual_load_ms: int | None = None) -> RenderableType:
    """`profile`: the running profile, where the dialog has it (its shutdown timeout is said). `now_ms` and
    `usual_load_ms`: as restart_text's."""
    held = serving.held
    if serving.state in (ServingState.STOPPED, ServingState.CRASH_LOOP) and held is not None:
        # Stopped for the agent, but a server the previous agent left serves on, unsupervised: the stop ends it
        guess, known = load_time(serving, held.profile or None, usual_load_ms)
        return Group(Text(f"Now: {_what_runs(serving)}; {held_text(held)} serves on the GPUs, left by the previous "
                          "agent and not supervised."),
                     Text("Stop ends it: its processes get SIGTERM, then SIGKILL after the grace, and its run is "
                          "closed."),
                     Text(f"Its load is lost: to serve again the model must load again{guess}.{known}",
                          style="bold yellow"))
    if serving.state == ServingState.STOPPED:
        # Nothing runs: no drain, no lost load (the metrics are the last read before the stop, not requests now)
        return Group(Text(f"Now: {_what_runs(serving)}."),
                     Text("Serving is already stopped: nothing runs, so nothing is lost. The agent will "
                          "answer that it is already stopped."))
    guess, known = load_time(serving, usual_ms=usual_load_ms)
    return Group(
        Text(f"Now: {_what_runs(serving)}."),
        Text(f"vLLM is stopped{_how_stopped(serving, profile)} and stays stopped: the node serves nothing until "
             "someone starts it."),
        *_lost_now(serving, metrics, profile, now_ms, _timeout_said(serving, profile)),
        Text(f"To serve again the model must load again{guess}.{known}", style="bold yellow"),
    )


def start_text(serving: ServingStatus, profile: str | None, usual_load_ms: int | None = None) -> RenderableType:
    """`usual_load_ms`: how long the profile that starts usually loads (its last ready runs in the history): the
    Stop and Restart dialogs said `The last load took 9s` where this one said "minutes" of the same profile."""
    name = profile or serving.profile or "the default profile"
    held = [Text(f"{held_text(serving.held)}, left by the previous agent, still serves unsupervised: the agent "
                 "refuses a start while it lives (Stop ends it).", style="bold red")] if serving.held else []
    return Group(
        Text(f"Now: {_what_runs(serving)}."),
        *held,
        Text(f"Start serving {name} as a new run."),
        Text((f"{name} usually loads in ~{fmt_duration(usual_load_ms / 1000)}" if usual_load_ms
              else "Loading takes minutes for a large model") + "; progress shows phase by phase in the header.",
             style="bold yellow"),
    )


def flag_diff(current: ProfileInfo | None, target: ProfileInfo) -> list[tuple[str, str, str]]:
    """(flag, current value, new value) for every flag that differs; '—' where absent."""
    a = dict(current.flags if current else {})
    b = dict(target.flags)
    rows = []
    for flag in sorted(set(a) | set(b)):
        va, vb = a.get(flag), b.get(flag)
        if va != vb:
            rows.append((flag, "—" if va is None else str(va), "—" if vb is None else str(vb)))
    return rows


def switch_text(serving: ServingStatus, current: ProfileInfo | None, target: ProfileInfo,
                metrics: ServingMetrics | None = None, now_ms: int | None = None,
                usual_load_ms: int | None = None) -> RenderableType:
    """`usual_load_ms`: how long `target` usually loads (load_time), where read."""
    diff = flag_diff(current, target)
    table = Table(title=None, show_header=True, header_style="bold", expand=False, box=None, padding=(0, 1))
    table.add_column("flag")  # every cell and header as Text: a str would be parsed as markup (a '[/]' in a value)
    table.add_column(Text(f"now: {current.name if current else 'none'}"))
    table.add_column(Text(f"new: {target.name}"))
    for flag, va, vb in diff:
        table.add_row(Text(flag), Text(va, style="red"), Text(vb, style="green"))
    parts: list[RenderableType] = [
        Text(f"Now: {_what_runs(serving)}."),
        Text(f"Preflight {target.name}, stop the current run, wait for the GPUs to be freed, "
             f"start {target.name} as a new run."),
        *_lost_now(serving, metrics, current, now_ms),
        # the target's description on the same line: the dialog must fit 80x24 with its buttons
        Text.assemble((f"{len(diff)} flag difference(s)" if diff else "No flag differences (same argv)", "bold"),
                      (f"  ({target.name}: {target.description})" if target.description else "", "dim"),
                      (":" if diff else ".", "bold")),
    ]
    if diff:
        parts.append(table)
    parts.append(Text(_load_line(serving, target.name, usual_load_ms), style="bold yellow"))
    return Group(*parts)


def worker_ray_text(action: str, cluster: ClusterStatus) -> tuple[str, RenderableType, str]:
    """On a Ray worker the controls act on this node's Ray: what that does to the head's serving."""
    head = cluster.address or "the head"
    if action == "stop":
        return "Stop this node's Ray?", Group(
            Text(f"This node is a Ray worker of {head}; its Ray is {cluster.ray_state}."),
            Text("vLLM on the head loses its ranks on this node: serving there fails, and waits until this "
                 "node's Ray is back.", style="bold yellow"),
            Text("Ray stays stopped, across agent restarts too, until someone starts it here."),
        ), "Stop Ray"
    return "Start this node's Ray?", Group(
        Text(f"This node is a Ray worker of {head}; its Ray is {cluster.ray_state}."),
        Text("It joins the cluster; the head starts serving by itself once Ray reports every GPU its profile "
             "needs."),
    ), "Start Ray"


def confirmation(action: str, serving: ServingStatus, metrics: ServingMetrics | None, profile: str | None,
                 current: ProfileInfo | None = None,
                 target: ProfileInfo | None = None, now_ms: int | None = None,
                 usual_load_ms: int | None = None) -> tuple[str, RenderableType, str]:
    """Title, body and button label of the dialog that confirms `action`. `now_ms`: now on the node's clock, for
    how much of a load under way is lost (this machine's clock where not given). `usual_load_ms`: how long the
    profile the action loads (a switch's target, else the running one) usually takes, from the history."""
    if action == "restart":
        return "Restart serving?", restart_text(serving, metrics, current, now_ms, usual_load_ms), "Restart"
    if action == "stop":
        return "Stop serving?", stop_text(serving, metrics, current, now_ms, usual_load_ms), "Stop"
    if action == "start":
        return "Start serving?", start_text(serving, profile, usual_load_ms), "Start"
    return (f"Switch to profile {profile}?",
            switch_text(serving, current, target or ProfileInfo(str(profile)), metrics, now_ms, usual_load_ms),
            "Switch")


@dataclass(frozen=True)
class Seen:
    """The run a control dialog showed the operator: the confirmed action is sent for exactly this run
    (`expect_run`), and the dialog is withdrawn once the live status no longer matches it."""

    run_id: int | None
    profile: str | None
    state: ServingState
    role: Role = Role.SINGLE
    held: HeldRun | None = None  # a server the agent holds, unsupervised: what a Stop in STOPPED ends

    @classmethod
    def of(cls, serving: ServingStatus, cluster: ClusterStatus | None = None) -> Seen:
        return cls(serving.run_id, serving.profile, serving.state, cluster.role if cluster else Role.SINGLE,
                   serving.held)

    def run_words(self) -> str:
        return f"run {self.run_id}" if self.run_id is not None else "no run"


def run_change(seen: Seen, now: Seen) -> str | None:
    """Why a dialog showing `seen` no longer describes what its action would act on, `now`; None while it does
    (the same run moving on within its kind: starting, ready, degraded).

    Why: an agent acts on whatever run is current when the request lands; a dialog that outlives its run would
    stop or restart a run it never showed (a fresh 20-minute load)."""
    was = seen.run_words()
    if now.role != seen.role:
        return f"this node's role changed from {seen.role.value} to {now.role.value}"
    if now.run_id != seen.run_id:
        if now.run_id is None:
            return f"{was} ended"
        return f"{was} was replaced by run {now.run_id} ({now.profile or 'no profile'}, {now.state.value})"
    if now.profile != seen.profile:
        return f"the profile changed from {seen.profile or 'none'} to {now.profile or 'none'}"
    if now.held != seen.held:  # a Stop shown ending a held server would end nothing, or another one
        if now.held is None:
            return f"the held {held_text(seen.held)} ended"  # type: ignore[arg-type]
        if seen.held is None:
            return f"a server held from the previous agent, {held_text(now.held)}, is now shown"
        return f"the held server changed from {held_text(seen.held)} to {held_text(now.held)}"
    kind = _KIND.get(now.state)
    if kind != _KIND.get(seen.state):
        if seen.run_id is not None and now.state == ServingState.STOPPED:
            return f"{was} ended"
        if seen.run_id is not None and kind == "stopping":
            return f"{was} is stopping"
        return f"{was} went from {seen.state.value} to {now.state.value}"
    return None
