"""`lynxtop status|start|stop|restart|switch`: thin clients of the control API, made for humans and scripts.

The blocking face of the one API client (lynxtop.client) keeps these commands free of asyncio and fast to
start. Exit codes (cli/parser.py): 0 ok, 1 refused or failed, 2 usage/config, 3 agent unreachable, 4 busy.
Anything that interrupts serving asks for confirmation on a terminal and demands --yes elsewhere, because a
284B model takes many minutes to reload.
"""

from __future__ import annotations

import json
import sys
import time
from argparse import Namespace
from typing import Any

from lynxtop.client import AgentClient, AgentRefused, AgentUnreachable, parse_status
from lynxtop.config_cli import load_or_exit
from lynxtop.contract.format import fmt_bytes, fmt_datetime, fmt_duration, fmt_ms
from lynxtop.contract.status import (
    AgentStatus,
    GpuStatus,
    HostStatus,
    ServingMetrics,
    ServingState,
    ServingStatus,
    SlaStatus,
    Status,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_BUSY = 0, 1, 2, 3, 4
POLL_S = 1.0
UNREACHABLE_GIVE_UP_S = 60.0
NOT_RUNNING = (ServingState.STOPPED, ServingState.CRASH_LOOP, ServingState.BACKOFF)
INDENT = " " * 9


# ---------------------------------------------------------------------------------------------- helpers


def _err(msg: str) -> None:
    print(f"lynxtop: {msg}", file=sys.stderr)


def _client(args: Namespace) -> AgentClient | None:
    path = getattr(args, "socket", None)
    if not path:
        cfg = load_or_exit(args)
        if cfg is None:
            return None
        path = str(cfg.agent.socket)
    return AgentClient(str(path))


def _failed(exc: AgentUnreachable | AgentRefused) -> int:
    """Say why a call failed; the exit code for it."""
    if isinstance(exc, AgentUnreachable):
        _err(str(exc))
        return EXIT_UNREACHABLE
    _report_error(exc)
    return _exit_for(exc)


def _exit_for(exc: AgentRefused) -> int:
    if exc.status == 409 and exc.code == "busy":
        return EXIT_BUSY
    if exc.status in (400, 413) or (exc.status == 404 and exc.code == "unknown_profile"):
        return EXIT_USAGE
    return EXIT_FAILED


def _report_error(exc: AgentRefused) -> None:
    _err(f"{exc.code}: {exc.message}")
    reasons = exc.details.get("reasons") or []
    for reason in reasons if isinstance(reasons, list) else []:
        print(f"  - {reason}", file=sys.stderr)
    if exc.status == 403:
        _err("control needs root, the agent's user or the agent's group; `lynxtop status` works for everyone")


def _na(v: Any, fmt: str = "{}", unit: str = "") -> str:
    return "N/A" if v is None else fmt.format(v) + unit


def _bytes(n: float | None) -> str:
    return fmt_bytes(n, decimals=1, largest="TiB")


def _ms(v: float | None) -> str:
    return fmt_ms(v, decimals=0)


def _since(ms: int | None, now_ms: int | None) -> str:
    if not ms or not now_ms:
        return "-"
    return fmt_duration((now_ms - ms) / 1000, na="-")


def _clock(ms: int | None) -> str:
    return fmt_datetime(ms, seconds=True) if ms else "-"


# ---------------------------------------------------------------------------------------------- status


def format_status(st: Status) -> str:
    """The compact human summary of a status; every missing value shows as N/A or '-'."""
    lines: list[str] = []
    if st.agent.simulated:
        lines.append("*** SIMULATED node: the GPUs and/or vLLM are simulated ***")
    lines += _serving_lines(st.serving, st.ts_ms)
    lines.append(_sla_line(st.sla))
    lines += _traffic_lines(st.serving_metrics)
    lines += [_gpu_line(g) for g in st.gpus]
    lines.append(_host_line(st.host))
    lines += _agent_lines(st.agent)
    return "\n".join(lines)


def _serving_lines(srv: ServingStatus, now: int | None) -> list[str]:
    state = srv.state
    head = f"serving  {state.upper()} for {_since(srv.state_since_ms, now)}"
    lines = [head + (f" ({srv.reason})" if srv.reason else "")]
    if state == ServingState.STARTING and srv.phase:
        lines.append(f"{INDENT}phase: {srv.phase} for {_since(srv.phase_since_ms, now)}, "
                     f"starting for {_since(srv.started_ms, now)}")
    if state == ServingState.BACKOFF and srv.next_retry_ms:
        lines.append(f"{INDENT}next retry in {fmt_duration((srv.next_retry_ms - (now or 0)) / 1000, na='-')}, "
                     f"{srv.failures_in_window} failures in the window")
    if state == ServingState.CRASH_LOOP:
        lines.append(f"{INDENT}gave up after repeated failures: fix the cause, then `lynxtop start`")
    details = [f"profile {srv.profile or '-'}", f"run {srv.run_id or '-'}", f"pid {srv.pid or '-'}"]
    if srv.model:
        details.append(f"model {srv.model}")
    if srv.vllm_version:
        details.append(f"vLLM {srv.vllm_version}")
    if srv.ready_ms and state.serving:
        details.append(f"up {_since(srv.ready_ms, now)}")
    if srv.adopted:
        details.append("adopted")
    lines.append(INDENT + "  ".join(details))
    return lines


def _sla_line(sla: SlaStatus) -> str:
    tp_label = "ITL" if sla.tpot_source == "itl" else "TPOT"
    return (f"SLA      {sla.state.upper()}  p99 TTFT {_ms(sla.ttft_p99_ms)} (<= {_ms(sla.ttft_threshold_ms)})  "
            f"p99 {tp_label} {_ms(sla.tpot_p99_ms)} (<= {_ms(sla.tpot_threshold_ms)})  "
            f"window {_na(sla.window_s, '{:g}', ' s')}")


def _traffic_lines(sm: ServingMetrics) -> list[str]:
    m = sm.metric
    if m("scrape_ok") is None:  # nothing scraped (not serving): no line of N/As
        return []
    if m("scrape_ok") == 0:
        return [f"traffic  metrics unreadable ({m('scrape_errors')} failed scrapes)"]
    return [f"traffic  {_na(m('requests_per_s'), '{:.1f}', ' req/s')}  "
            f"gen {_na(m('generation_tokens_per_s'), '{:.0f}', ' tok/s')}  "
            f"prompt {_na(m('prompt_tokens_per_s'), '{:.0f}', ' tok/s')}  "
            f"running {_na(m('requests_running'))}  waiting {_na(m('requests_waiting'))}  "
            f"KV {_na(m('kv_cache_usage_pct'), '{:.0f}', '%')}"]


def _gpu_line(g: GpuStatus) -> str:
    m = g.metric
    index = "?" if g.index is None else g.index
    return (f"GPU {index:<4} {g.name or '?'}  util {_na(m('util_gpu_pct'), '{}', '%')}  "
            f"mem {_bytes(m('mem_used_bytes'))}/{_bytes(m('mem_total_bytes'))}  "
            f"{_na(m('power_w'), '{}', ' W')}  {_na(m('temp_c'), '{}', ' C')}" + ("  LOST" if m("lost") else ""))


def _host_line(host: HostStatus) -> str:
    m = host.metric
    return (f"host     cpu {_na(m('cpu_pct'), '{:.0f}', '%')}  load {_na(m('load1'), '{:.2f}')}  "
            f"mem {_bytes(m('mem_used_bytes'))}/{_bytes(m('mem_total_bytes'))}  "
            f"disk free {_bytes(m('disk_free_bytes'))}")


def _agent_lines(agent: AgentStatus) -> list[str]:
    nvml, store = agent.nvml, agent.store
    line = (f"agent    {agent.host or '?'}  pid {'?' if agent.pid is None else agent.pid}  up "
            f"{fmt_duration(agent.uptime_s, na='-')}  {'healthy' if agent.healthy else 'UNHEALTHY'}  "
            f"nvml {nvml.state or '?'}")
    if nvml.message:
        line += f" ({nvml.message})"
    if store.last_error:
        line += f"  store error: {store.last_error}"
    if agent.missed_ticks:
        line += f"  missed ticks {agent.missed_ticks}"
    lines = [line]
    if store.wal_unlinked:
        state = "recovered" if store.wal_recovered else "NOT RECOVERED, history at risk"
        lines.append(f"store    WAL UNLINKED at {_clock(store.wal_unlinked_ms)} ({state}): {store.wal_unlinked}")
    act = agent.action
    if act:
        lines.append(f"action   {act.action} {act.profile or ''} in progress since {_clock(act.since_ms)} by "
                     f"{act.by or '?'}")
    return lines


def status(args: Namespace) -> int:
    client = _client(args)
    if client is None:
        return EXIT_USAGE
    try:
        data = client.status_json()
        text = json.dumps(data, indent=2, sort_keys=True) if getattr(args, "json", False) else \
            format_status(parse_status(data, client.socket_path))
    except (AgentUnreachable, AgentRefused) as exc:
        return _failed(exc)
    print(text)
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- actions


def _confirm(action: str, target: str | None, st: Status, assume_yes: bool) -> int | None:
    """None to go ahead, else the exit code (aborted, or --yes missing without a terminal)."""
    srv = st.serving
    if action == "stop" and srv.state in NOT_RUNNING:
        return None  # nothing is serving: nothing to lose
    if assume_yes:
        return None
    what = {"stop": "This stops serving; the model must load again to serve (minutes).",
            "restart": "This restarts serving; the model reloads (minutes).",
            "switch": "This restarts serving; the model reloads (minutes)."}[action]
    current = (f"Now: {srv.state} for {_since(srv.state_since_ms, st.ts_ms)}, profile "
               f"{srv.profile or '-'}, run {srv.run_id or '-'}.")
    if not sys.stdin.isatty():
        _err(f"{action} interrupts serving and needs confirmation: pass --yes when not on a terminal")
        return EXIT_USAGE
    expected = target if action == "switch" else "y"
    prompt = f"Type the profile name ({target})" if action == "switch" else "Type y"
    print(f"{current}\n{what}")
    try:
        answer = input(f"{prompt} to confirm: ").strip()
    except EOFError:
        answer = ""
    if answer != expected and not (expected == "y" and answer.lower() in ("y", "yes")):
        _err("not confirmed; nothing changed")
        return EXIT_FAILED
    return None


def _act(args: Namespace, action: str, profile: str | None = None) -> int:
    client = _client(args)
    if client is None:
        return EXIT_USAGE
    try:
        before = client.status()
        if action in ("stop", "restart", "switch"):
            refused = _confirm(action, profile, before, getattr(args, "yes", False))
            if refused is not None:
                return refused
        data = client.action(action, profile)
    except (AgentUnreachable, AgentRefused) as exc:
        return _failed(exc)
    print(data.get("message") or f"{action} accepted")
    if not getattr(args, "wait", False):
        return EXIT_OK
    return wait_for(client, action, before)


class _Progress:
    """The state line while waiting: rewritten in place on a terminal, one line per state change elsewhere."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.last = ""

    def show(self, st: Status) -> None:
        srv = st.serving
        line = f"{srv.state}" + (f" ({srv.phase})" if srv.phase and srv.state == ServingState.STARTING else "")
        line += f"  {_since(srv.state_since_ms, st.ts_ms)}  profile {srv.profile or '-'}"
        if line == self.last and not self.tty:
            return
        if self.tty:
            print(f"\r\033[K{line}", end="", flush=True)
        elif line.split("  ")[0] != self.last.split("  ")[0]:
            print(line, flush=True)
        self.last = line

    def done(self) -> None:
        if self.tty:
            print()


def _poll(client: AgentClient, poll: float) -> Status | int:
    """The next status, waiting out an agent restart (up to a minute); an exit code when giving up."""
    unreachable_since: float | None = None
    while True:
        time.sleep(poll)
        try:
            return client.status()
        except AgentUnreachable as exc:
            unreachable_since = unreachable_since or time.monotonic()
            if time.monotonic() - unreachable_since > UNREACHABLE_GIVE_UP_S:
                _err(f"gave up waiting: {exc}")
                return EXIT_UNREACHABLE
        except AgentRefused as exc:
            _report_error(exc)
            return EXIT_FAILED


def wait_for(client: AgentClient, action: str, before: Status, poll_s: float | None = None) -> int:
    """Poll status until the action is done: ready (a new run for restart/switch), stopped, or failed."""
    poll = POLL_S if poll_s is None else poll_s
    run0 = before.serving.run_id
    was_running = before.serving.state not in NOT_RUNNING
    progress = _Progress()
    seen_progress = False
    while True:
        st = _poll(client, poll)
        if isinstance(st, int):
            return st
        srv = st.serving
        progress.show(st)
        seen_progress = seen_progress or srv.state in (ServingState.STARTING, ServingState.STOPPING)
        new_run = srv.run_id != run0 or not was_running
        done = _outcome(action, srv.state, st.agent.action is not None, new_run, seen_progress)
        if done is None:
            continue
        progress.done()
        ok, message = done
        if ok:
            print(message)
            return EXIT_OK
        _err(message + (f": {srv.reason}" if srv.reason else "") + " (see `lynxtop status` and the events)")
        return EXIT_FAILED


def _outcome(action: str, state: ServingState | None, in_action: bool, new_run: bool,
             seen_progress: bool) -> tuple[bool, str] | None:
    if action == "stop":
        if state == ServingState.STOPPED and not in_action:
            return True, "stopped"
        return None
    if in_action:
        return None
    if state == ServingState.READY and new_run:
        return True, "ready"
    if state == ServingState.DEGRADED and new_run:
        return False, "serving came up degraded"
    if state in (ServingState.BACKOFF, ServingState.CRASH_LOOP) and (seen_progress or new_run):
        return False, f"{action} failed (state {state})"
    if state == ServingState.STOPPED and seen_progress:
        return False, f"{action} failed: serving stopped"
    return None


def start(args: Namespace) -> int:
    return _act(args, "start", getattr(args, "profile", None))


def stop(args: Namespace) -> int:
    return _act(args, "stop")


def restart(args: Namespace) -> int:
    return _act(args, "restart")


def switch(args: Namespace) -> int:
    return _act(args, "switch", args.profile)
